"""Files that a reader never sees half written."""

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import IO


@contextlib.contextmanager
def atomic_write(path: str, mode: str = 'w') -> Iterator[IO]:
  """Opens a temporary file beside `path`; on success it replaces `path`.

  A crash or an exception leaves `path` as it was (and no temporary file).
  The temporary name is unique, so several processes may write the same
  path at once: each replaces it whole.

  Args:
    path: the file to write.
    mode: 'w' (text, UTF-8) or 'wb'.

  Yields:
    The open temporary file.
  """
  base, ext = os.path.splitext(path)
  # The extension stays last: some writers (matplotlib, pandas) choose the
  # format by it.
  tmp = f'{base}.{uuid.uuid4().hex[:8]}.tmp{ext}'
  encoding = None if 'b' in mode else 'utf-8'
  try:
    with open(tmp, mode, encoding=encoding) as f:
      yield f
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
