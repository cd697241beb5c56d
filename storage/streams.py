"""What object storage lacks, made from what it has: a file created only if
absent (the workdir lock), ranged reads of a large file, and a file that
only grows (metrics.jsonl, TensorBoard events)."""

import builtins
import io
import os

from meshfit.storage import gcs, paths
from meshfit.storage.files import read_bytes, size


def create_exclusive(path: str, data: bytes | str) -> bool:
  """Creates a file holding `data` only if none exists; the workdir lock.

  Locally O_CREAT | O_EXCL; on gs:// an upload with the precondition
  ifGenerationMatch=0, which GCS applies atomically: of two creators at
  once exactly one succeeds.

  Args:
    path: the file.
    data: its content (str is written as UTF-8).

  Returns:
    True if this call created it, False if it existed already.
  """
  if isinstance(data, str):
    data = data.encode('utf-8')
  if not paths.is_remote(path):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
    return True
  try:
    gcs.call(path, gcs.client(path).pipe_file, gcs.key(path), data, mode='create')
  except FileExistsError:
    return False
  return True


class RangeReader:
  """Reads byte ranges of one file without reading the rest; thread-safe.

  Locally one descriptor and os.pread (no shared file position); on gs://
  one ranged GET per call. Use as a context manager or call close().

  Attributes:
    path: the file.
    size: its size in bytes when opened.
  """

  def __init__(self, path: str):
    self.path = path
    self._remote = paths.is_remote(path)
    if self._remote:
      self._fs = gcs.client(path)
      self.size = size(path)
      self._fd = None
    else:
      self._fd = os.open(path, os.O_RDONLY)
      self.size = os.fstat(self._fd).st_size

  def read_at(self, offset: int, length: int) -> bytes:
    """`length` bytes from `offset`; fewer only at the end of the file."""
    if offset < 0 or length < 0:
      raise ValueError(f'offset {offset} and length {length} must be >= 0')
    length = max(0, min(length, self.size - offset))
    if length == 0:
      return b''
    if not self._remote:
      parts = []
      while length:
        # pread may return less than asked (signals, large reads).
        chunk = os.pread(self._fd, length, offset)
        if not chunk:
          break
        parts.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
      return b''.join(parts)
    return gcs.call(self.path, self._fs.cat_file, gcs.key(self.path),
                 start=offset, end=offset + length)

  def close(self) -> None:
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> 'RangeReader':
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()


def read_range(path: str, offset: int, length: int) -> bytes:
  """One byte range of a file (see RangeReader to read many)."""
  with RangeReader(path) as reader:
    return reader.read_at(offset, length)


class AppendWriter(io.RawIOBase):
  """A binary file that only grows: metrics.jsonl and TensorBoard events.

  Locally a file opened for append; flush() hands the bytes to the OS.
  On gs:// (no append there) the whole content is kept in memory and
  flush() uploads it as a new object replacing the old: a reader always
  sees a whole object, every record up to some flush; a crash loses only
  what was written since the last flush, never the file. Rewriting costs
  the file's size per flush, small for these files (kilobytes to a few
  megabytes); composing pieces would need a cleanup that a crash skips.

  Content already at `path` is kept and appended to (a resumed run).

  Attributes:
    name: the path.
  """

  def __init__(self, path: str):
    super().__init__()
    self.name = path
    self._remote = paths.is_remote(path)
    if self._remote:
      self._fs = gcs.client(path)
      try:
        self._content = bytearray(read_bytes(path))
      except FileNotFoundError:
        self._content = bytearray()
      # Created at once, as a local file opened for append is.
      self._flushed = len(self._content) if self._content else -1
      self.flush()
    else:
      self._file = builtins.open(path, 'ab')

  def writable(self) -> bool:
    return True

  def write(self, data: bytes) -> int:  # type: ignore[override]
    if self.closed:
      raise ValueError(f'write to closed {self.name}')
    if not self._remote:
      return self._file.write(data)
    self._content += data
    return len(data)

  def flush(self) -> None:
    if self.closed:
      return
    if not self._remote:
      self._file.flush()
    elif self._flushed != len(self._content):
      gcs.call(self.name, self._fs.pipe_file, gcs.key(self.name),
            bytes(self._content))
      self._flushed = len(self._content)

  def sync(self) -> None:
    """flush(), and locally also to the disk (fsync): for records that must
    outlive a crash of the machine, not only of the process."""
    self.flush()
    if not self._remote and not self.closed:
      os.fsync(self._file.fileno())

  def close(self) -> None:
    if self.closed:
      return
    try:
      super().close()  # flushes first
    finally:
      if not self._remote:
        self._file.close()
