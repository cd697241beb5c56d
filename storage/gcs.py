"""The gs:// side of the layer: gcsfs's client, made on first use, and its
errors translated into what a user can act on (StorageError naming the URL,
FileNotFoundError as locally)."""

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from meshfit.storage import environment, paths
from meshfit.storage.errors import StorageError

_T = TypeVar('_T')
_lock = threading.Lock()


def client(url: str) -> Any:
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


def translate(url: str, e: Exception) -> Exception:
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
    return bool(client(f'gs://{bucket}').info(bucket))
  except FileNotFoundError:
    return False
  except Exception:  # noqa: BLE001 (cannot tell: report the object missing)
    return True


# After a call has failed for the network with its retries spent, calls to
# that endpoint in the next FAIL_FAST_SECONDS fail at once: a run stopping
# for that error must not wait out every other file's retries (~32 s each)
# on its way out.
FAIL_FAST_SECONDS = 60.0
_unreachable: dict[str, tuple[float, str]] = {}  # endpoint: (time, cause)


def call(url: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
  """Runs a gcsfs call (which retries with backoff), translating errors."""
  endpoint = environment.emulator_url() or 'storage.googleapis.com'
  down = _unreachable.get(endpoint)
  if down is not None and time.monotonic() - down[0] < FAIL_FAST_SECONDS:
    raise StorageError(f'{url}: network error, not retried: storage was '
                       f'unreachable {time.monotonic() - down[0]:.0f} s ago '
                       f'({down[1]})')
  try:
    result = fn(*args, **kwargs)
  except Exception as e:  # noqa: BLE001 (translated, never swallowed)
    if _is_network(e):
      _unreachable[endpoint] = (time.monotonic(),
                                f'{type(e).__name__}: {_first_line(e)}')
    raise translate(url, e) from e
  _unreachable.pop(endpoint, None)
  return result


def key(url: str) -> str:
  return paths.split_url(url)[1]


def url_of(key: str) -> str:
  return f'gs://{key}'


def info(url: str) -> dict[str, Any] | None:
  """gcsfs's info on `url`, None when there is nothing there.

  fsspec's own exists/isfile/isdir answer False on any error, a network
  one included; this raises those instead.
  """
  try:
    return call(url, client(url).info, key(url))
  except FileNotFoundError:
    return None
