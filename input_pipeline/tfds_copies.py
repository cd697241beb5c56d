"""A generated TFDS dataset's files, copied between local disk and gs://.

TFDS writes and reads through tf.io.gfile, whose GCS endpoint is compiled
into TensorFlow: it cannot be pointed at an emulator, so TFDS on gs:// could
not be tested. The generated datasets are small and drawn from fixed seeds,
so with a gs:// data_dir tables.py builds one in a local temporary directory
and uploads its files here, and parses a split from a local copy of them.
"""

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from meshfit import storage
from meshfit.input_pipeline.errors import DataError


def upload(local: str, url: str, last: str) -> None:
  """Uploads the files of the local directory `local` into `url`, `last`
  after the others (its presence says the rest is there)."""
  files = sorted((f for f in os.listdir(local)
                  if os.path.isfile(os.path.join(local, f))),
                 key=lambda f: f == last)
  for f in files:
    with open(os.path.join(local, f), 'rb') as src, storage.atomic_write(
        storage.join(url, f), 'wb') as dst:
      shutil.copyfileobj(src, dst)


@contextlib.contextmanager
def downloaded(url: str, skip: str) -> Iterator[str]:
  """The files of `url` but `skip`, in a temporary directory.

  The copy keeps the last three components of `url` (TFDS's
  <builder>/<config>/<version>: TFDS reads the version from the name). A
  DataError raised inside names `url`, not the temporary directory.
  """
  with tempfile.TemporaryDirectory(prefix='meshfit-tfds-') as root:
    local = os.path.join(root, *url.rstrip('/').split('/')[-3:])
    os.makedirs(local)
    for f in storage.listdir(url):
      if f != skip:
        with storage.open(storage.join(url, f), 'rb') as src, open(
            os.path.join(local, f), 'wb') as dst:
          shutil.copyfileobj(src, dst)
    try:
      yield local
    except DataError as e:
      raise DataError(str(e).replace(local, url).replace(root, url)
                      ) from None
