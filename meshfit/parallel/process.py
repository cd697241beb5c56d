"""The process's set-up before JAX, TensorFlow, Orbax and etils start:
train.py and `import meshfit.api` both begin with `prepare`.

Imports neither jax nor gcsfs: it must run before them.
"""

import os

from meshfit import storage
from meshfit.parallel import xla_flags


def prepare() -> None:
  """Sets what the libraries read once, when they are imported or start a
  backend: no probe of a GCE metadata server (seconds of waiting off GCP),
  TensorFlow's C++ INFO and WARNING logs off, meshfit's XLA flags, and
  every storage client pointed alike at gs:// or STORAGE_EMULATOR_HOST.
  Values the user set already win. Idempotent."""
  os.environ.setdefault('NO_GCE_CHECK', 'true')
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  xla_flags.apply()
  storage.configure_environment()
