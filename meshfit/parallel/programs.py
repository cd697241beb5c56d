"""One jitted program per static set-up, for the life of the process.

`jax.jit` keeps its compiled programs with the function object it wraps: a
factory that calls `jax.jit` anew on every run traces, lowers and compiles
again (or reads the persistent cache) each time. `memoize` hands a factory's
earlier result back for the same arguments, so a second fit of the same
shapes in one process (a refit, a cross-validation fold) compiles nothing.
"""

import collections
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

_F = TypeVar('_F', bound=Callable[..., Any])
# Per factory: enough for the set-ups a process alternates between.
MAX_ENTRIES = 32
# Every memoized factory's cache, for `clear`.
_CACHES: list[collections.OrderedDict] = []


def _key(value: Any) -> Any:
  """`value` where it is hashable (equal values share a program), else its
  identity: a pytree of shardings, an optimizer (the caller keeps passing
  the same object, e.g. model/setup.py's cached set-up)."""
  try:
    hash(value)
    return value
  except TypeError:
    return ('id', id(value))


def memoize(factory: _F) -> _F:
  """`factory` (of jitted functions) returning its earlier result for
  arguments equal to earlier ones (unhashable ones: the same objects).

  The arguments are kept with the result, so that an identity in the key
  is never another object's.
  """
  cache: collections.OrderedDict = collections.OrderedDict()
  _CACHES.append(cache)
  lock = threading.Lock()

  @functools.wraps(factory)
  def wrapper(*args, **kwargs):
    key = (tuple(_key(a) for a in args),
           tuple(sorted((k, _key(v)) for k, v in kwargs.items())))
    with lock:
      if key in cache:
        cache.move_to_end(key)
        return cache[key][0]
    result = factory(*args, **kwargs)
    with lock:
      cache[key] = (result, args, kwargs)
      while len(cache) > MAX_ENTRIES:
        cache.popitem(last=False)
    return result

  return wrapper  # type: ignore[return-value]


def clear() -> None:
  """Forgets every program made so far: the next run jits, and compiles
  (or reads the persistent compilation cache), anew."""
  for cache in _CACHES:
    cache.clear()
