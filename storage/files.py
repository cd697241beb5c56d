"""File operations on local paths and gs:// URLs.

Every function takes a `str` path. A local path goes to the os function it
names, unchanged in behaviour; a gs:// URL goes to gcsfs. Failures the user
can fix (no bucket, no credentials, no permission, the network down after
retries) raise StorageError naming the URL; a missing object raises
FileNotFoundError, as a missing local file does.
"""

import builtins
import glob as globlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from meshfit.storage import gcs, paths
from meshfit.storage.errors import StorageError


def exists(path: str) -> bool:
  """Whether a file or directory (on gs://, an object or prefix) exists."""
  if not paths.is_remote(path):
    return os.path.exists(path)
  return gcs.info(path) is not None


def isdir(path: str) -> bool:
  """Whether `path` is a directory; on gs://, a prefix with objects under."""
  if not paths.is_remote(path):
    return os.path.isdir(path)
  info = gcs.info(path)
  return info is not None and info['type'] == 'directory'


def isfile(path: str) -> bool:
  if not paths.is_remote(path):
    return os.path.isfile(path)
  info = gcs.info(path)
  return info is not None and info['type'] == 'file'


def size(path: str) -> int:
  """The file's size in bytes (FileNotFoundError when missing)."""
  if not paths.is_remote(path):
    return os.path.getsize(path)
  info = gcs.info(path)
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
  fs = gcs.client(path)
  key = gcs.key(path).rstrip('/')
  entries = gcs.call(path, fs.ls, key, detail=False)
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
  fs = gcs.client(pattern)
  return sorted(gcs.url_of(k) for k in gcs.call(pattern, fs.glob, gcs.key(pattern)))


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
  gcs.call(path, gcs.client(path).rm_file, gcs.key(path))


def rmtree(path: str) -> None:
  """Deletes a directory and everything under it."""
  if not paths.is_remote(path):
    shutil.rmtree(path)
    return
  fs = gcs.client(path)
  gcs.call(path, fs.rm, gcs.key(path).rstrip('/') + '/', recursive=True)


def list_files(path: str) -> list[str]:
  """Every file under a directory, as sorted '/'-separated paths relative
  to it (a walk of the tree; [] for a missing directory)."""
  if not paths.is_remote(path):
    found = []
    for root, _, files in os.walk(path):
      rel = os.path.relpath(root, path)
      found += [f if rel == '.' else f'{rel}/{f}'.replace(os.sep, '/')
                for f in files]
    return sorted(found)
  fs = gcs.client(path)
  key = gcs.key(path).rstrip('/')
  return sorted(k[len(key) + 1:] for k in gcs.call(path, fs.find, key))


def _copy_file(src: str, dst: str) -> None:
  src_remote, dst_remote = paths.is_remote(src), paths.is_remote(dst)
  if not src_remote and not dst_remote:
    os.makedirs(os.path.dirname(dst) or '.', exist_ok=True)
    shutil.copy2(src, dst)
  elif src_remote and dst_remote:
    # A server-side copy: the bytes never come through this host.
    gcs.call(dst, gcs.client(dst).copy, gcs.key(src), gcs.key(dst))
  elif dst_remote:
    gcs.call(dst, gcs.client(dst).put_file, src, gcs.key(dst))
  else:
    os.makedirs(os.path.dirname(dst) or '.', exist_ok=True)
    gcs.call(src, gcs.client(src).get_file, gcs.key(src), dst)


def copy_file(src: str, dst: str) -> None:
  """Copies one file between any two of local and gs:// (server-side
  between two gs:// URLs); `dst`'s directories are created locally."""
  _copy_file(src, dst)


def copytree(src: str, dst: str, last: str | None = None) -> None:
  """Copies every file under `src` to the same place under `dst`.

  Works between any two of local and gs:// (an export written locally and
  uploaded, a workdir downloaded). Empty directories are not copied: object
  storage cannot hold them.

  Args:
    src: an existing directory.
    dst: where its files go; files already there are overwritten.
    last: a file (relative to `src`) copied after all the others, so that
      a reader who finds it under `dst` finds the rest too.
  """
  files = list_files(src)
  if not files and not isdir(src):
    raise FileNotFoundError(f'No such directory: {src}')
  for rel in sorted(files, key=lambda rel: rel == last):  # stable: `last` last
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
  fs = gcs.client(src)
  if isfile(src):
    pairs = [(src, dst)]
  else:
    pairs = [(join_rel(src, r), join_rel(dst, r)) for r in list_files(src)]
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
    gcs.call(a, fs.rm_file, gcs.key(a))


def rename(src: str, dst: str) -> None:
  """Renames a file or directory: a directory written beside `dst` appears
  there whole.

  Locally rename(2), in one step: an empty directory at `dst` is replaced,
  a directory with anything in it is not (OSError), so nothing written
  there since is lost. gs:// has no rename: there it is `move`, object by
  object, and any object under `dst` refuses it.

  Args:
    src: an existing file or directory.
    dst: the new path, on the same storage (and, locally, file system) as
      `src`.
  """
  if not paths.is_remote(src) and not paths.is_remote(dst):
    os.rename(src, dst)
    return
  move(src, dst)


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
  return gcs.call(path, gcs.client(path).open, gcs.key(path), mode, encoding=encoding)


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
      gcs.call(self.name, gcs.client(self.name).put_file, self._tmp, gcs.key(self.name))
    finally:
      os.remove(self._tmp)


def read_bytes(path: str) -> bytes:
  with open(path, 'rb') as f:
    return f.read()


def read_text(path: str) -> str:
  with open(path, 'r') as f:
    return f.read()
