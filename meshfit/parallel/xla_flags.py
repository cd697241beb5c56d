"""XLA flags that meshfit's processes start with (set before jax's backend).

Kept free of jax imports: `apply` must run before jax reads `XLA_FLAGS`,
which it does once, when its first backend starts.
"""

import os
from collections.abc import MutableMapping

# XLA:CPU's default scheduler orders a program's kernels breadth-first, to run
# independent ones at once on its thread pool. A small MLP's step is a hundred
# small kernels, which lose more in being handed between threads than they
# gain, so meshfit asks for the depth-first (memory-ordered) schedule
# (`benchmarks/speed.py --sizes=small` measures it; docs/performance.md has
# the numbers). Other backends ignore the flag.
DEFAULTS = {'xla_cpu_enable_concurrency_optimized_scheduler': 'false'}


def apply(environ: MutableMapping[str, str] = os.environ) -> None:
  """Adds DEFAULTS to `environ['XLA_FLAGS']`; a flag already there wins."""
  flags = environ.get('XLA_FLAGS', '')
  for name, value in DEFAULTS.items():
    if f'--{name}=' not in flags:
      flags = f'{flags} --{name}={value}'.strip()
  environ['XLA_FLAGS'] = flags
