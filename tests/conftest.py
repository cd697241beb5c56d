"""Test set-up: 8 virtual CPU devices, local TFDS data, shared fixtures."""

import os

# Before jax is imported anywhere: eight virtual CPU devices, no GCS probes.
os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=8'
from meshfit.parallel import xla_flags  # noqa: E402  (imports no jax)

xla_flags.apply()  # the tests run under train.py's XLA flags
from meshfit import storage  # noqa: E402  (imports neither jax nor gcsfs)

storage.configure_environment()  # as train.py does, before etils and Orbax
os.environ.setdefault('NO_GCE_CHECK', 'true')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # noqa: E402
import pytest  # noqa: E402

# The gs:// fixtures: a local GCS emulator, started on demand.
pytest_plugins = ('storage_fixtures',)

# A (B,) minus a (B, 1) silently gives (B, B); make it an error instead.
jax.config.update('jax_numpy_rank_promotion', 'raise')


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory) -> str:
  """One TFDS data dir for the whole session, with both synthetic configs."""
  from meshfit.input_pipeline import tables  # noqa: PLC0415
  path = str(tmp_path_factory.mktemp('tfds'))
  for name in tables.GENERATED_DATASETS:
    tables.prepare(name, path)
  return path


@pytest.fixture
def small_config(data_dir):
  """The default config shrunk to run in seconds (model_helpers.SMALL)."""
  from model_helpers import shrunk_config  # noqa: PLC0415  (imports jax)
  return shrunk_config(data_dir)


@pytest.fixture
def absl_caplog(caplog):
  """pytest's caplog at INFO, for absl's logger too.

  Importing TensorFlow in the test process (export's tests do) sets absl's
  logger to WARNING, which would hide the INFO records a test looks for.
  """
  import logging  # noqa: PLC0415
  caplog.set_level(logging.INFO)
  caplog.set_level(logging.INFO, logger='absl')
  yield caplog
