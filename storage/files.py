"""File operations on local paths and gs:// URLs.

Every function takes a `str` path. A local path goes to the os function it
names, unchanged in behaviour; a gs:// URL goes to gcsfs. Failures the user
can fix (no bucket, no credentials, no permission, the network down after
retries) raise StorageError naming the URL; a missing object raises
FileNotFoundError, as a missing local file does.
"""

import builtins
import contextlib
import glob as globlib
import io
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import IO, Any, TypeVar

from storage import environment, paths
from storage.errors import StorageError

_T = TypeVar('_T')
_lock = threading.Lock()


def _gcs(url: str) -> Any:
  """The process's gcsfs client, made on first use (fork-safe: see below).

  Args:
    url: the URL it is wanted for, named if there are no credentials.
  """
  environment.configure_environment()
  import gcsfs  # noqa: PLC0415  (a second of imports only gs:// users pay)
  # fsspec caches one instance per arguments and pid, so a forked child gets
  # its own client and event loop rather than the parent's dead ones.
  # On an emulator, never the zonal-bucket probe (see environment.py), even
  # if gcsfs was imported before configure_environment could turn it off.
  cls = (gcsfs.core.GCSFileSystem if environment.emulator_url()
         else gcsfs.GCSFileSystem)
  with _lock:
    try:
      return cls(
          token='anon' if environment.emulator_url() else 'google_default',
          # Listings are never cached: other processes (the other hosts of a
          # pod, Orbax) change the bucket behind this one's back.
          use_listings_cache=False)
    except Exception as e:  # noqa: BLE001 (google-auth raises several kinds)
      raise _credentials_error(url, e) from e


def _credentials_error(url: str, e: Exception) -> StorageError:
  return StorageError(
      f'{url}: no Google credentials ({type(e).__name__}: '
      f'{_first_line(e)}); run `gcloud auth application-default login` or '
      f'set GOOGLE_APPLICATION_CREDENTIALS')


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def _is_network(e: BaseException) -> bool:
  """Whether `e` says the endpoint could not be reached (after retries)."""
  # Imported here: asyncio alone would double the layer's import time.
  import asyncio  # noqa: PLC0415
  import aiohttp  # noqa: PLC0415
  return isinstance(e, (aiohttp.ClientConnectionError, asyncio.TimeoutError,
                        TimeoutError, ConnectionError))


def _translate(url: str, e: Exception) -> Exception:
  """The exception a caller sees for gcsfs's `e` raised on `url`."""
  import google.auth.exceptions  # noqa: PLC0415
  from gcsfs.retry import HttpError  # noqa: PLC0415
  if isinstance(e, (StorageError, FileExistsError, IsADirectoryError,
                    NotADirectoryError)):
    return e
  if isinstance(e, FileNotFoundError):
    bucket = paths.split_url(url)[1].split('/', 1)[0]
    if not _bucket_exists(bucket):
      return StorageError(f'{url}: bucket gs://{bucket} does not exist')
    return FileNotFoundError(f'No such file or object: {url}')
  if isinstance(e, google.auth.exceptions.DefaultCredentialsError):
    return _credentials_error(url, e)
  code = getattr(e, 'code', None)
  if isinstance(e, HttpError) and code == 401:
    return StorageError(f'{url}: not authorised (HTTP 401: '
                        f'{_first_line(e)}); check the credentials')
  if (isinstance(e, HttpError) and code == 403) or (
      type(e) is OSError and str(e).startswith('Forbidden')):
    return StorageError(f'{url}: permission denied; the credentials in use '
                        f'may not read or write this bucket')
  if _is_network(e):
    return StorageError(f'{url}: network error after retries with backoff '
                        f'({type(e).__name__}: {_first_line(e)})')
  return StorageError(f'{url}: {type(e).__name__}: {_first_line(e)}')


def _bucket_exists(bucket: str) -> bool:
  try:
    return bool(_gcs(f'gs://{bucket}').info(bucket))
  except FileNotFoundError:
    return False
  except Exception:  # noqa: BLE001 (cannot tell: report the object missing)
    return True


def _call(url: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
  """Runs a gcsfs call (which retries with backoff), translating errors."""
  try:
    return fn(*args, **kwargs)
  except Exception as e:  # noqa: BLE001 (translated, never swallowed)
    raise _translate(url, e) from e


def _key(url: str) -> str:
  return paths.split_url(url)[1]


def _url(key: str) -> str:
  return f'gs://{key}'


def _info(url: str) -> dict[str, Any] | None:
  """gcsfs's info on `url`, None when there is nothing there.

  fsspec's own exists/isfile/isdir answer False on any error, a network
  one included; this raises those instead.
  """
  try:
    return _call(url, _gcs(url).info, _key(url))
  except FileNotFoundError:
    return None


def exists(path: str) -> bool:
  """Whether a file or directory (on gs://, an object or prefix) exists."""
  if not paths.is_remote(path):
    return os.path.exists(path)
  return _info(path) is not None


def isdir(path: str) -> bool:
  """Whether `path` is a directory; on gs://, a prefix with objects under."""
  if not paths.is_remote(path):
    return os.path.isdir(path)
  info = _info(path)
  return info is not None and info['type'] == 'directory'


def isfile(path: str) -> bool:
  if not paths.is_remote(path):
    return os.path.isfile(path)
  info = _info(path)
  return info is not None and info['type'] == 'file'


def size(path: str) -> int:
  """The file's size in bytes (FileNotFoundError when missing)."""
  if not paths.is_remote(path):
    return os.path.getsize(path)
  info = _info(path)
  if info is None or info['type'] != 'file':
    raise FileNotFoundError(f'No such file or object: {path}')
  return int(info['size'])


def listdir(path: str) -> list[str]:
  """The names (not paths) in a directory, sorted.

  Args:
    path: a directory; on gs://, a prefix.

  Returns:
    Each entry's last component, directories included.
  """
  if not paths.is_remote(path):
    return sorted(os.listdir(path))
  fs = _gcs(path)
  key = _key(path).rstrip('/')
  entries = _call(path, fs.ls, key, detail=False)
  names = {e.rstrip('/').rsplit('/', 1)[-1] for e in entries
           if e.rstrip('/') != key}
  return sorted(names)


def glob(pattern: str) -> list[str]:
  """Paths matching a shell pattern (`*`, `?`, `[...]`, `**`), sorted.

  An empty list when nothing matches: the caller names what it looked for.

  Args:
    pattern: a local pattern or a gs:// URL with a pattern in its key.

  Returns:
    Matching paths, as URLs for a gs:// pattern.
  """
  if not paths.is_remote(pattern):
    return sorted(globlib.glob(pattern, recursive=True))
  fs = _gcs(pattern)
  return sorted(_url(k) for k in _call(pattern, fs.glob, _key(pattern)))


def makedirs(path: str, exist_ok: bool = True) -> None:
  """Creates a directory and its parents; nothing to do on gs://.

  Object storage has no directories: a prefix exists once an object is
  written under it.
  """
  if not paths.is_remote(path):
    os.makedirs(path, exist_ok=exist_ok)


def remove(path: str) -> None:
  """Deletes one file (FileNotFoundError when missing)."""
  if not paths.is_remote(path):
    os.remove(path)
    return
  if not isfile(path):
    raise FileNotFoundError(f'No such file or object: {path}')
  _call(path, _gcs(path).rm_file, _key(path))


def rmtree(path: str) -> None:
  """Deletes a directory and everything under it."""
  if not paths.is_remote(path):
    shutil.rmtree(path)
    return
  fs = _gcs(path)
  _call(path, fs.rm, _key(path).rstrip('/') + '/', recursive=True)


def _files_under(path: str) -> list[str]:
  """Relative paths ('/'-separated) of every file under a directory."""
  if not paths.is_remote(path):
    found = []
    for root, _, files in os.walk(path):
      rel = os.path.relpath(root, path)
      found += [f if rel == '.' else f'{rel}/{f}'.replace(os.sep, '/')
                for f in files]
    return sorted(found)
  fs = _gcs(path)
  key = _key(path).rstrip('/')
  return sorted(k[len(key) + 1:] for k in _call(path, fs.find, key))


def _copy_file(src: str, dst: str) -> None:
  src_remote, dst_remote = paths.is_remote(src), paths.is_remote(dst)
  if not src_remote and not dst_remote:
    os.makedirs(os.path.dirname(dst) or '.', exist_ok=True)
    shutil.copy2(src, dst)
  elif src_remote and dst_remote:
    # A server-side copy: the bytes never come through this host.
    _call(dst, _gcs(dst).copy, _key(src), _key(dst))
  elif dst_remote:
    _call(dst, _gcs(dst).put_file, src, _key(dst))
  else:
    os.makedirs(os.path.dirname(dst) or '.', exist_ok=True)
    _call(src, _gcs(src).get_file, _key(src), dst)


def copytree(src: str, dst: str) -> None:
  """Copies every file under `src` to the same place under `dst`.

  Works between any two of local and gs:// (an export written locally and
  uploaded, a workdir downloaded). Empty directories are not copied: object
  storage cannot hold them.

  Args:
    src: an existing directory.
    dst: where its files go; files already there are overwritten.
  """
  files = _files_under(src)
  if not files and not isdir(src):
    raise FileNotFoundError(f'No such directory: {src}')
  for rel in files:
    _copy_file(join_rel(src, rel), join_rel(dst, rel))


def join_rel(base: str, rel: str) -> str:
  """`base` joined with a '/'-separated relative path."""
  if paths.is_remote(base):
    return f'{base.rstrip("/")}/{rel}'
  return os.path.join(base, *rel.split('/'))


def move(src: str, dst: str) -> None:
  """Moves a file or directory tree to `dst`, which must not exist.

  Locally a rename. On gs:// (no rename there) every object is copied,
  each copy's size checked against its source, and only then are the
  sources deleted: an interruption leaves both copies, never neither. It is
  how damaged checkpoints are set aside, so losing data is not an option.

  Args:
    src: an existing file or directory.
    dst: the new path, on the same storage as `src`.
  """
  if paths.is_remote(src) != paths.is_remote(dst):
    raise StorageError(f'cannot move {src} to {dst}: not on the same '
                       f'storage (copytree then rmtree)')
  if exists(dst):
    raise FileExistsError(f'{dst} exists; not moving {src} over it')
  if not paths.is_remote(src):
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    shutil.move(src, dst)
    return
  fs = _gcs(src)
  if isfile(src):
    pairs = [(src, dst)]
  else:
    pairs = [(join_rel(src, r), join_rel(dst, r)) for r in _files_under(src)]
    if not pairs:
      raise FileNotFoundError(f'No such file or directory: {src}')
  for a, b in pairs:
    _copy_file(a, b)
  for a, b in pairs:
    if size(a) != size(b):
      raise StorageError(f'moving {src} to {dst}: the copy {b} has '
                         f'{size(b)} bytes, its source {size(a)}; the '
                         f'source is kept')
  for a, _ in pairs:
    _call(a, fs.rm_file, _key(a))


def open(path: str, mode: str = 'r') -> IO:  # noqa: A001 (the layer's open)
  """Opens a file to read or write whole; text is UTF-8.

  On gs:// a written object appears when the file is closed (a reader sees
  the old object or the new one, never part of it); reads are buffered
  ranged reads, so seeking in a large object downloads only what is read.
  An exception inside `with open(url, 'w')` still writes what was written
  so far, as a local file would: use `atomic_write` to keep the old content.

  Args:
    path: a local path or gs:// URL.
    mode: 'r', 'rb', 'w' or 'wb'.

  Returns:
    The open file.
  """
  if mode not in ('r', 'rb', 'w', 'wb'):
    raise ValueError(f"mode {mode!r}: use 'r', 'rb', 'w' or 'wb'")
  encoding = None if 'b' in mode else 'utf-8'
  if not paths.is_remote(path):
    return builtins.open(path, mode, encoding=encoding)
  if 'w' in mode:
    return _Upload(path, mode)
  if not isfile(path):
    if exists(path):
      raise IsADirectoryError(f'{path} is a directory')
    raise FileNotFoundError(f'No such file or object: {path}')
  return _call(path, _gcs(path).open, _key(path), mode, encoding=encoding)


class _Upload:
  """A local temporary file that becomes the object `name` when closed.

  Written locally rather than through gcsfs's upload buffer so that the one
  request that can fail (the upload, at close) goes through `_call` and its
  errors name the URL.
  """

  def __init__(self, url: str, mode: str):
    self.name = url
    ext = os.path.splitext(paths.basename(url))[1]
    fd, self._tmp = tempfile.mkstemp(suffix=ext, prefix='meshfit-upload-')
    os.close(fd)
    self._file = builtins.open(self._tmp, mode,
                               encoding=None if 'b' in mode else 'utf-8')

  def __getattr__(self, name: str) -> Any:
    return getattr(self._file, name)

  def __iter__(self) -> Iterator[Any]:
    return iter(self._file)

  def __enter__(self) -> '_Upload':
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()

  def close(self) -> None:
    if self._file.closed:
      return
    self._file.close()
    try:
      _call(self.name, _gcs(self.name).put_file, self._tmp, _key(self.name))
    finally:
      os.remove(self._tmp)


def read_bytes(path: str) -> bytes:
  with open(path, 'rb') as f:
    return f.read()


def read_text(path: str) -> str:
  with open(path, 'r') as f:
    return f.read()


@contextlib.contextmanager
def atomic_write(path: str, mode: str = 'w') -> Iterator[IO]:
  """Writes a file that readers see whole, or not at all.

  Locally: a uniquely named temporary file beside `path`, then os.replace.
  On gs://: a local temporary file, uploaded on success as one object (GCS
  objects appear whole). Either way an exception or a crash leaves `path`
  as it was and no temporary file behind; several processes may write the
  same path at once and each replaces it whole.

  Args:
    path: the file to write.
    mode: 'w' (text, UTF-8) or 'wb'.

  Yields:
    The open temporary file.
  """
  if mode not in ('w', 'wb'):
    raise ValueError(f"mode {mode!r}: use 'w' or 'wb'")
  encoding = None if 'b' in mode else 'utf-8'
  remote = paths.is_remote(path)
  # The extension stays last: some writers (matplotlib, pandas) choose the
  # format by it.
  ext = os.path.splitext(paths.basename(path))[1]
  if remote:
    fd, tmp = tempfile.mkstemp(suffix=ext, prefix='meshfit-upload-')
    os.close(fd)
  else:
    tmp = f'{os.path.splitext(path)[0]}.{uuid.uuid4().hex[:8]}.tmp{ext}'
  try:
    with builtins.open(tmp, mode, encoding=encoding) as f:
      yield f
    if remote:
      _call(path, _gcs(path).put_file, tmp, _key(path))
    else:
      os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


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
    _call(path, _gcs(path).pipe_file, _key(path), data, mode='create')
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
      self._fs = _gcs(path)
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
    return _call(self.path, self._fs.cat_file, _key(self.path),
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
      self._fs = _gcs(path)
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
      _call(self.name, self._fs.pipe_file, _key(self.name),
            bytes(self._content))
      self._flushed = len(self._content)

  def close(self) -> None:
    if self.closed:
      return
    try:
      super().close()  # flushes first
    finally:
      if not self._remote:
        self._file.close()
