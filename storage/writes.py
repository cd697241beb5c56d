"""Writing a local file or gs:// object whole: `atomic_write`, what is
written in place rather than replaced (devices, FIFOs), and the write
failures a user can fix (a full disk, no permission, a name too long) as
one StorageError naming the path."""

import builtins
import contextlib
import errno
import os
import signal
import stat
import tempfile
import threading
import uuid
from collections.abc import Iterator
from typing import IO

from meshfit.storage import gcs, paths
from meshfit.storage.errors import StorageError

# Write failures a user can fix, each with what to do about it.
_WRITE_FIXES = {
    errno.ENOSPC: 'free some space there or write elsewhere',
    errno.EDQUOT: 'free some of your quota there or write elsewhere',
    errno.EACCES: 'name a place you may write to',
    errno.EPERM: 'name a place you may write to',
    errno.EROFS: 'write elsewhere (a read-only file system)',
    errno.ENAMETOOLONG: 'name a shorter path',
    errno.EFBIG: 'write elsewhere (a file larger than the file system takes)',
}
# The longest file name (in bytes) of the file systems meshfit writes to.
MAX_NAME_BYTES = 255


def write_errno(e: BaseException) -> int | None:
  """The errno of a write failure a user can fix (disk full, no
  permission, a name too long) in `e` or the exceptions that caused it, or
  None. TensorStore and TensorFlow say it in their messages only."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in _WRITE_FIXES:
      return e.errno
    text = str(e)
    for code in _WRITE_FIXES:
      if os.strerror(code) in text:
        return code
    e = e.__cause__ or e.__context__
  return None


def write_error(path: str, e: BaseException, doing: str = '',
                after: str = '') -> StorageError | None:
  """A one-line StorageError for a write failure a user can fix (see
  `write_errno`), or None for any other failure.

  Args:
    path: what could not be written.
    e: the failure.
    doing: what was being written, e.g. 'the predictions'.
    after: what the user should know besides, e.g. what is intact.

  Returns:
    The error to raise, or None where `e` is no such failure.
  """
  code = write_errno(e)
  if code is None:
    return None
  what = f'{doing} to {path}' if doing else path
  return StorageError(f'cannot write {what}: {os.strerror(code)}; '
                      f'{_WRITE_FIXES[code]}{"; " + after if after else ""}')


def writes_in_place(path: str) -> bool:
  """Whether `atomic_write` writes into `path` rather than replacing it: a
  device, FIFO or socket (/dev/null, /dev/stdout, a named pipe) is the
  reader's, not a file to swap for another; a gs:// URL never is."""
  if paths.is_remote(path):
    return False
  if os.path.abspath(path).startswith(('/dev/', '/proc/')):
    return True  # no place for a temporary file, and not ours to replace
  try:
    return not stat.S_ISREG(os.stat(path).st_mode)
  except FileNotFoundError:
    return False


def check_writable(path: str) -> None:
  """Raises StorageError when a local `path` could certainly not be
  written (no permission on it or on its directory), so that a caller can
  say so before its work rather than after; gs:// is not checked.

  Args:
    path: a file to be written by `atomic_write`.
  """
  if paths.is_remote(path):
    return
  if writes_in_place(path):
    place = path
  else:
    place = os.path.dirname(os.path.realpath(path))
  if os.path.exists(place) and not os.access(place, os.W_OK):
    raise StorageError(f'cannot write {path}: {os.strerror(errno.EACCES)} '
                       f'in {place}; {_WRITE_FIXES[errno.EACCES]}')


def _temporary_path(target: str) -> str:
  """A unique name beside `target` that the file system takes: its stem is
  cut where a long name would pass MAX_NAME_BYTES with the suffix."""
  directory, name = os.path.split(target)
  stem, ext = os.path.splitext(name)
  if len(ext.encode()) > 16:  # no format's extension: part of the name
    stem, ext = name, ''
  suffix = f'.{uuid.uuid4().hex[:8]}.tmp{ext}'
  room = MAX_NAME_BYTES - len(suffix.encode())
  stem = stem.encode()[:room].decode(errors='ignore')
  return os.path.join(directory, stem + suffix)


class _Terminated(SystemExit):
  """SIGTERM during a write: the process exits as it would have, after the
  temporary file is removed."""


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
  """While the block runs in the main thread, a SIGTERM that would kill the
  process at once (its default action) exits it through Python instead
  (status 143, as the signal's), so that `finally` blocks run. A handler
  someone installed (training's preemption watch) is left alone."""
  if (threading.current_thread() is not threading.main_thread()
      or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
    yield
    return

  def exit_(signum: int, frame: object) -> None:
    raise _Terminated(128 + signum)
  signal.signal(signal.SIGTERM, exit_)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def atomic_write(path: str, mode: str = 'w') -> Iterator[IO]:
  """Writes a file that readers see whole, or not at all.

  Locally: a uniquely named temporary file beside `path`, then os.replace;
  a symlink is followed (the file it names is replaced, the link stays). A
  device, FIFO or socket (`writes_in_place`) is written into, never
  replaced. On gs://: a local temporary file, uploaded on success as one
  object (GCS objects appear whole). Either way an exception, or a SIGTERM
  (the process then exits with status 143), leaves `path` as it was and no
  temporary file behind (a SIGKILL can leave one); several processes may
  write the same path at once and each replaces it whole.

  Args:
    path: the file to write.
    mode: 'w' (text, UTF-8) or 'wb'.

  Yields:
    The open temporary file.

  Raises:
    StorageError: a failure the user can fix (`write_error`): disk full, no
      permission, a name too long for the file system.
  """
  if mode not in ('w', 'wb'):
    raise ValueError(f"mode {mode!r}: use 'w' or 'wb'")
  encoding = None if 'b' in mode else 'utf-8'
  remote = paths.is_remote(path)
  tmp = None
  try:
    with _sigterm_as_exit():
      if writes_in_place(path):
        with builtins.open(path, mode, encoding=encoding) as f:
          yield f
        return
      if remote:
        # The extension stays last: some writers (matplotlib, pandas)
        # choose the format by it.
        ext = os.path.splitext(paths.basename(path))[1]
        fd, tmp = tempfile.mkstemp(suffix=ext, prefix='meshfit-upload-')
        os.close(fd)
      else:
        tmp = _temporary_path(os.path.realpath(path))
      with builtins.open(tmp, mode, encoding=encoding) as f:
        yield f
      if remote:
        gcs.call(path, gcs.client(path).put_file, tmp, gcs.key(path))
      else:
        os.replace(tmp, os.path.realpath(path))
  except OSError as e:
    error = write_error(path, e)
    if error is None:
      raise
    raise error from e
  finally:
    if tmp is not None and os.path.exists(tmp):
      os.remove(tmp)
