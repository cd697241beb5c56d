"""Path arithmetic on local paths and URLs, without touching storage."""

import os
import posixpath
import re

from meshfit.storage.errors import StorageError

# The URL schemes meshfit reads and writes; '' is a local path.
SCHEMES = ('gs',)
_SCHEME = re.compile(r'^([A-Za-z][A-Za-z0-9+.-]*)://')


def split_url(path: str) -> tuple[str, str]:
  """Splits `path` into its scheme ('' for local) and the rest.

  Args:
    path: a local path or a URL such as `gs://bucket/key`.

  Returns:
    (scheme, rest): `('gs', 'bucket/key')` or `('', path)`.
  """
  match = _SCHEME.match(path)
  if not match:
    return '', path
  return match.group(1).lower(), path[match.end():]


def check_scheme(path: str) -> None:
  """Raises StorageError unless `path` is local or a URL meshfit knows.

  Args:
    path: a path or URL.
  """
  scheme, rest = split_url(path)
  if scheme and scheme not in SCHEMES:
    known = ', '.join(f'{s}://' for s in SCHEMES)
    raise StorageError(f'{path}: unknown URL scheme {scheme}://; meshfit '
                       f'reads and writes local paths and {known} URLs')
  if scheme and not rest.split('/', 1)[0]:
    raise StorageError(f'{path}: no bucket name in the URL')


def is_remote(path: str) -> bool:
  """Whether `path` is a URL (checked: an unknown scheme raises)."""
  check_scheme(path)
  return bool(split_url(path)[0])


def join(*parts: str) -> str:
  """Joins like os.path.join; on a URL with '/' whatever the OS."""
  if is_remote(parts[0]):
    return posixpath.join(*parts)
  return os.path.join(*parts)


def basename(path: str) -> str:
  """The last component: 'c' of `gs://b/a/c` and of `/a/c`."""
  scheme, rest = split_url(path)
  return posixpath.basename(rest.rstrip('/')) if scheme else (
      os.path.basename(path))


def dirname(path: str) -> str:
  """All but the last component; a bucket's URL is its own dirname."""
  scheme, rest = split_url(path)
  if not scheme:
    return os.path.dirname(path)
  parent = posixpath.dirname(rest.rstrip('/'))
  return f'{scheme}://{parent or rest.rstrip("/")}'


def absolute(path: str) -> str:
  """A local path made absolute; a URL unchanged (it is absolute already)."""
  if is_remote(path):
    return path
  return os.path.abspath(path)


def resolve(path: str) -> str:
  """A local path made absolute with every symlink followed (what it
  names); a URL unchanged. Two paths that lead to one file resolve alike."""
  if is_remote(path):
    return path
  return os.path.realpath(path)
