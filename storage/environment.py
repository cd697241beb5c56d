"""Points every storage client of the process at the same GCS endpoint.

meshfit's layer (gcsfs), TensorStore (Orbax's array writer), etils.epath
(Orbax's directories) and TensorBoard each find their GCS endpoint and
credentials their own way. Outside tests nothing needs setting: all of them
use googleapis.com with Application Default Credentials. With
STORAGE_EMULATOR_HOST set, the variables below make each talk to the
emulator anonymously.
"""

import os
import sys

# etils.epath picks tf.io.gfile for gs:// whenever TensorFlow is installed;
# that imports TensorFlow (seconds of start-up) and TF's GCS client has its
# endpoint compiled in, so it cannot reach an emulator. 'false' makes epath
# use fsspec (gcsfs), the same client as this layer.
_ALWAYS = {
    'EPATH_USE_TF': 'false',
    # fsspec caches a directory's listing forever by default; Orbax (through
    # epath) would then list a checkpoint that was moved aside or deleted by
    # another process as still there. Read by fsspec when it is imported.
    'FSSPEC_GS_USE_LISTINGS_CACHE': 'false',
}


def emulator_url() -> str | None:
  """STORAGE_EMULATOR_HOST as an http URL, or None when it is not set."""
  host = os.environ.get('STORAGE_EMULATOR_HOST', '')
  if host in ('', 'default'):
    return None
  if not host.startswith(('http://', 'https://')):
    host = f'http://{host}'
  return host.rstrip('/')


def configure_environment() -> None:
  """Sets, where unset, the variables that agree on one GCS endpoint.

  Call it before the first gs:// access (train.py does it first thing; the
  layer calls it again before importing gcsfs). Variables already set are
  left alone, so a user can still override each one.
  """
  for name, value in _ALWAYS.items():
    os.environ.setdefault(name, value)
  url = emulator_url()
  if url is not None:
    _configure_emulator(url)
  # fsspec reads FSSPEC_* once, when imported; it may have been already.
  config = sys.modules.get('fsspec.config')
  if config is not None:
    config.set_conf_env(config.conf)


def _configure_emulator(url: str) -> None:
  """The variables that send every client to the emulator at `url`."""
  # epath's gcsfs (not this layer's) would try ADC and the metadata server
  # before going anonymous.
  os.environ.setdefault('FSSPEC_GS_TOKEN', 'anon')
  # TensorStore ignores STORAGE_EMULATOR_HOST; this is its own variable.
  os.environ.setdefault('TENSORSTORE_GCS_HTTP_URL', url)
  # Without a token TensorStore asks for Application Default Credentials
  # and, failing that, the GCE metadata server; the emulator takes any
  # bearer token, so a fixed one keeps TensorStore anonymous in effect.
  os.environ.setdefault('GOOGLE_AUTH_TOKEN_FOR_TESTING', 'emulator')
  # gcsfs first asks a gRPC endpoint (absent on an emulator) whether a
  # bucket is zonal; every call would wait for that to time out.
  os.environ.setdefault('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'false')
  # google-auth and TensorFlow probe the GCE metadata server otherwise.
  os.environ.setdefault('NO_GCE_CHECK', 'true')
