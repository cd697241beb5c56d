"""Joins the processes of one job with `jax.distributed`, before any JAX use.

TPU pods run one process per host, all executing the same program. On a
Cloud TPU VM the TPU environment describes the topology and
`jax.distributed.initialize()` finds everything by itself; elsewhere every
process is started with the same `--coordinator_address=HOST:PORT
--num_processes=N` and its own `--process_id=I`. Without either, the job is a
single process and nothing is initialised.

A process that dies must not leave the others waiting forever in a
collective. The coordination service (hosted by process 0) marks a process
dead when it has sent no heartbeat for `heartbeat_timeout_seconds` (checked
every second), and then every remaining process terminates itself with a
non-zero status. If process 0 itself dies, the others lose their connection
to the service and terminate at once. A process that fails leaves at once
too (`exit_at_once_on_failure`), so that it counts as dead rather than
waiting for peers stuck in a collective. `shutdown_timeout_seconds` bounds
how long a finished process waits at exit for the others to finish too.
"""

import contextlib
import dataclasses
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator

import jax
from absl import logging

from meshfit.errors import UsageError

# HOST:PORT, where HOST is a name, an IPv4 address or a bracketed IPv6 one.
_ADDRESS = re.compile(
    r'^(?P<host>\[[0-9A-Fa-f:.]+\]|[^:\s\[\]]+):(?P<port>\d+)$')


@dataclasses.dataclass(frozen=True)
class Options:
  """How this process joins the job (the multi-host flags of train.py).

  Attributes:
    coordinator_address: HOST:PORT of process 0's coordination service, or
      None: then the TPU environment is asked, and without one the job is a
      single process.
    num_processes: processes in the job (with coordinator_address).
    process_id: this process's index in [0, num_processes).
    heartbeat_timeout_seconds: a process silent for this long is dead, and
      the others exit.
    shutdown_timeout_seconds: how long a finished process waits at exit for
      the others.
    initialization_timeout_seconds: how long to wait for every process to
      connect at start-up.
  """
  coordinator_address: str | None
  num_processes: int | None
  process_id: int | None
  heartbeat_timeout_seconds: int
  shutdown_timeout_seconds: int
  initialization_timeout_seconds: int

  @property
  def explicit(self) -> bool:
    return self.coordinator_address is not None


def validate(options: Options) -> None:
  """Checks the multi-host flags before anything starts.

  Raises:
    UsageError: the flags are incomplete, out of range or malformed.
  """
  given = {'--coordinator_address': options.coordinator_address,
           '--num_processes': options.num_processes,
           '--process_id': options.process_id}
  missing = [name for name, value in given.items() if value is None]
  if 0 < len(missing) < len(given):
    raise UsageError(
        f'{", ".join(missing)} missing: give --coordinator_address=HOST:PORT, '
        '--num_processes=N and --process_id=I together (or none of them on a '
        'TPU VM or for a single process)')
  if options.explicit:
    if not _ADDRESS.match(options.coordinator_address):
      raise UsageError(
          f'--coordinator_address={options.coordinator_address!r} must be '
          'HOST:PORT, e.g. 10.0.0.2:8476 (the host of process 0)')
    port = int(_ADDRESS.match(options.coordinator_address)['port'])
    if not 0 < port < 65536:
      raise UsageError(f'--coordinator_address port {port} must be in '
                       '1..65535')
    if options.num_processes < 1:
      raise UsageError(f'--num_processes={options.num_processes} must be at '
                       'least 1')
    if not 0 <= options.process_id < options.num_processes:
      raise UsageError(
          f'--process_id={options.process_id} must be in 0..'
          f'{options.num_processes - 1} (one distinct id per process of '
          f'--num_processes={options.num_processes})')
  for name in ('heartbeat_timeout_seconds', 'shutdown_timeout_seconds',
               'initialization_timeout_seconds'):
    if getattr(options, name) < 1:
      raise UsageError(f'--{name}={getattr(options, name)} must be at least '
                       '1 second')


def tpu_environment_present() -> bool:
  """Whether a Cloud TPU VM (GCE or GKE) describes the job's processes.

  jax's own cluster detection answers this; it is private API, so a jax that
  moved it means "no TPU environment" rather than a crash.
  """
  try:
    from jax._src.clusters import cloud_tpu_cluster  # noqa: PLC0415
  except ImportError:
    return False
  return any(cluster.is_env_present() for cluster in (
      cloud_tpu_cluster.GceTpuCluster, cloud_tpu_cluster.GkeTpuCluster))


def initialize(options: Options,
               on_join: Callable[[int], None] | None = None
               ) -> tuple[int, int]:
  """Joins the job, if it has several processes; call before any JAX use.

  Its log lines are tagged `[pI/N] ` from then on.

  Args:
    options: the multi-host flags.
    on_join: called with this process's id once it has joined, before the
      line saying so (train.py keeps the INFO lines of the processes other
      than 0 off their consoles).

  Returns:
    (process_id, num_processes) of this process.

  Raises:
    UsageError: invalid flags.
  """
  validate(options)
  if not options.explicit and not tpu_environment_present():
    return 0, 1
  if options.explicit:  # known now: tag jax's own start-up lines too
    tag_logs(options.process_id, options.num_processes)
  # Only the CPU backend reads this: processes exchange CPU collectives over
  # TCP (gloo). TPU and GPU backends have their own interconnects.
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(
      coordinator_address=options.coordinator_address,
      num_processes=options.num_processes,
      process_id=options.process_id,
      initialization_timeout=options.initialization_timeout_seconds,
      heartbeat_timeout_seconds=options.heartbeat_timeout_seconds,
      shutdown_timeout_seconds=options.shutdown_timeout_seconds)
  process_id, num_processes = jax.process_index(), jax.process_count()
  if not options.explicit:
    tag_logs(process_id, num_processes)
  if on_join is not None:
    on_join(process_id)
  logging.info(
      'Joined a job of %d processes as process %d (coordinator %s). If a '
      'process dies, the others exit within --heartbeat_timeout_seconds=%d '
      'plus a few seconds.', num_processes, process_id,
      options.coordinator_address or 'found by the TPU environment',
      options.heartbeat_timeout_seconds)
  return process_id, num_processes


class _ProcessTag(logging.logging.Formatter):
  """Puts `[pI/N] ` before every log line, so mixed logs say who speaks."""

  def __init__(self, inner: logging.logging.Formatter, tag: str):
    super().__init__()
    self._inner, self._tag = inner, tag

  def format(self, record) -> str:
    return self._tag + self._inner.format(record)


def tag_logs(process_id: int, num_processes: int) -> None:
  """Prefixes this process's log lines with `[p<process_id>/<num_processes>]`.

  Only for jobs of several processes: a single process's logs stay as they
  were.
  """
  if num_processes < 2:
    return
  handler = logging.get_absl_handler()
  inner = handler.python_handler.formatter or logging.PythonFormatter()
  handler.setFormatter(_ProcessTag(inner, f'[p{process_id}/{num_processes}] '))


@contextlib.contextmanager
def exit_at_once_on_failure(num_processes: int) -> Iterator[None]:
  """Makes a failing process of a multi-process job leave without waiting.

  Python's normal exit runs jax's shutdown barrier, which waits up to
  `shutdown_timeout_seconds` for every process to arrive. After a failure
  that only this process saw (a bad file on one host, Ctrl-C), the others are
  inside a collective that never completes and never arrive: every process
  would hang for the whole shutdown timeout. Leaving at once instead makes
  this process a dead peer, which the others notice within their heartbeat
  timeout. A single process exits normally.

  Args:
    num_processes: processes in the job.

  Yields:
    Nothing; wraps the work of the process.
  """
  if num_processes < 2:
    yield
    return
  try:
    yield
  except SystemExit as e:
    if e.code in (None, 0):
      raise
    _exit_now(e.code if isinstance(e.code, int) else 1)
  except BaseException:  # noqa: BLE001 (reported, then the process ends)
    traceback.print_exc()
    _exit_now(1)


def _exit_now(status: int) -> None:
  """Flushes what this process has said, then ends it without clean-up."""
  logging.error('This process failed (exit status %d); leaving without the '
                'shutdown barrier so that the other processes stop within '
                'their heartbeat timeout.', status)
  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # noqa: SLF001 (atexit would wait at the barrier)
