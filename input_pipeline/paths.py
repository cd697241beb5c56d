"""The paths a user gives the input pipeline: local paths or gs:// URLs.

`dataset.train_path`, `dataset.eval_path` and `dataset.data_dir` may each be
a local path (`~` expanded, as a shell would) or a gs:// URL; everything
here reads and writes them through the `storage` layer. A storage failure
the user can fix (an unknown scheme, a missing bucket, no credentials)
becomes a DataError that also names the setting, so `train.py` reports it
as one `error: ...` line, exit 2, like any other bad input.
"""

import contextlib
import os
from collections.abc import Iterator

from meshfit import storage
from meshfit.input_pipeline.errors import DataError


@contextlib.contextmanager
def named(source: str) -> Iterator[None]:
  """Turns a StorageError inside into a DataError naming `source`.

  Args:
    source: the setting or flag the path came from ('' names none).
  """
  try:
    yield
  except storage.StorageError as e:
    raise DataError(f'{source}: {e}' if source else str(e)) from None


def expand(path: str, source: str = '') -> str:
  """`path` with `~` expanded if it is local; a URL unchanged.

  Raises:
    DataError: `path` is a URL of a scheme meshfit does not read.
  """
  with named(source):
    remote = storage.is_remote(path)
  return path if remote else os.path.expanduser(path)
