"""JAX's persistent compilation cache: a restart loads its steps, not compiles.

XLA compilation is most of the time a run takes to reach its first step.
JAX can keep compiled executables on disk, keyed by the program, the
devices and the compiler flags, so a run restarted after preemption (or the
next run of the same config) reads them back.
"""

import os

import jax
from jax.experimental.compilation_cache import compilation_cache

from meshfit import storage

# JAX by default writes only executables that took a second or more to
# compile; an MLP's train step compiles in a fraction of that, yet those
# fractions add up to most of a restart. Cache every program, of any size.
MIN_COMPILE_TIME_SECS = 0.0
MIN_ENTRY_SIZE_BYTES = -1  # -1: no size threshold.


def configure(cache_dir: str) -> str | None:
  """Points JAX's persistent compilation cache at `cache_dir`.

  Idempotent; a different directory takes effect from the next compilation
  (JAX opens its cache once and otherwise keeps the first directory).

  Args:
    cache_dir: a directory (`~` is expanded; created when first written), a
      gs:// URL (JAX reaches it through etils.epath, which
      storage.configure_environment points at gcsfs), or '' to turn the
      cache off.

  Returns:
    The absolute cache directory, or None when the cache is off.
  """
  if not cache_dir:
    path = None
  elif storage.is_remote(cache_dir):
    path = cache_dir.rstrip('/')
  else:
    path = os.path.abspath(os.path.expanduser(cache_dir))
  if jax.config.jax_compilation_cache_dir == path:
    return path
  jax.config.update('jax_compilation_cache_dir', path)
  jax.config.update('jax_persistent_cache_min_compile_time_secs',
                    MIN_COMPILE_TIME_SECS)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes',
                    MIN_ENTRY_SIZE_BYTES)
  compilation_cache.reset_cache()
  return path
