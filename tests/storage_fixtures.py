"""pytest fixtures for gs:// tests: a local GCS emulator and a bucket.

Loaded by conftest.py's `pytest_plugins`. The emulator is started once per
session, on demand; each test gets its own prefix in the bucket.
"""

import os
import uuid
from collections.abc import Iterator

import pytest

from meshfit.storage import emulator as gcs_emulator

# gcsfs reads this once, when imported (by a test module, etils or fsspec,
# before any fixture runs): without it, the first call on each bucket waits
# 60 s for a gRPC endpoint the emulator lacks.
os.environ.setdefault('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'false')

BUCKET = 'meshfit-test'
# Variables storage.configure_environment derives from STORAGE_EMULATOR_HOST;
# cleared so that they follow this session's emulator, not a stale one.
_DERIVED = ('TENSORSTORE_GCS_HTTP_URL', 'GOOGLE_AUTH_TOKEN_FOR_TESTING',
            'FSSPEC_GS_TOKEN')


@pytest.fixture(scope='session')
def gcs_emulator_url() -> Iterator[str]:
  """A running emulator with bucket `BUCKET`, the process pointed at it.

  STORAGE_EMULATOR_HOST and the variables derived from it are set in
  os.environ for the rest of the session, so subprocesses a test starts use
  the emulator too, and restored at the end.

  Yields:
    The emulator's URL, http://127.0.0.1:PORT.
  """
  from meshfit import storage  # noqa: PLC0415
  saved = {k: os.environ.get(k)
           for k in ('STORAGE_EMULATOR_HOST', 'EPATH_USE_TF', 'NO_GCE_CHECK',
                     *_DERIVED)}
  with gcs_emulator.running(BUCKET) as emulator:
    for name in _DERIVED:
      os.environ.pop(name, None)
    os.environ.update(emulator.env())
    storage.configure_environment()
    try:
      yield emulator.url
    finally:
      for name, value in saved.items():
        if value is None:
          os.environ.pop(name, None)
        else:
          os.environ[name] = value


@pytest.fixture
def gcs_dir(gcs_emulator_url) -> str:
  """A fresh `gs://meshfit-test/<unique>` prefix on the emulator."""
  del gcs_emulator_url  # started for its side effect
  return f'gs://{BUCKET}/{uuid.uuid4().hex[:12]}'
