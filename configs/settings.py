"""How a setting is declared: a `Setting` per key (configs/default.py).

One declaration holds a key's default, what it means, the values it
accepts and what may change it in a saved run. meshfit derives the rest
from the declarations: the ConfigDict that `--config.KEY=VALUE` overrides
(`config_dict`), the typed config and its checks (meshfit/config), the keys
an evaluation or a resumed run may change, and the settings table of
docs/usage.md (`python -m meshfit.config.docs`).
"""

import dataclasses
import math
import os
import typing
from collections.abc import Callable, Iterable
from typing import Any

import ml_collections

from meshfit import storage

# What may change a trained run's value of a key. NEVER: what the model is
# and what it learns from. RESUME: how long and how observably a run goes
# on, and where; a resumed run may set another value. EVAL: how a saved
# model is evaluated; `--mode=eval`/`predict` may set it, as may a resumed
# run. INVOKER: the invoking user's machine's (an EVAL key that eval,
# predict and export always take from their own config, never from a
# workdir another user may write).
NEVER, RESUME, EVAL, INVOKER = 'never', 'resume', 'eval', 'invoker'


@dataclasses.dataclass(frozen=True)
class Check:
  """The values a key accepts.

  Attributes:
    problem: (key, value) -> what is wrong with the value and how to fix
      it, or None if it is accepted.
    values: the accepted values in words, as docs/usage.md's table shows
      them (a function for lists known only once their module is imported).
  """
  problem: Callable[[str, Any], str | None]
  values: str | Callable[[], str]

  def describe(self) -> str:
    """The accepted values in words."""
    return self.values() if callable(self.values) else self.values


@dataclasses.dataclass(frozen=True)
class Setting:
  """One config key, declared once.

  Attributes:
    key: the dotted key, e.g. 'model.hidden_sizes'.
    default: its value in configs/default.py.
    help: what it means, in a line or two.
    check: the values it accepts.
    changes: NEVER, RESUME, EVAL or INVOKER: what may give a trained run another
      value.
    type: the value's type in the typed config (default: the default's).
    formerly: the keys it replaced, still read from saved runs and config
      files (meshfit/config/spellings.py says how their values translate).
  """
  key: str
  default: Any
  help: str
  check: Check
  changes: str = NEVER
  type: Any = None
  formerly: tuple[str, ...] = ()

  def __post_init__(self):
    if self.type is None:
      object.__setattr__(self, 'type', type(self.default))
    if self.changes not in (NEVER, RESUME, EVAL, INVOKER):
      raise ValueError(f'{self.key}: changes={self.changes!r}')

  @property
  def section(self) -> str:
    """'' for a top-level key, else its section ('model')."""
    return self.key.rpartition('.')[0]

  @property
  def name(self) -> str:
    """The key within its section ('hidden_sizes')."""
    return self.key.rpartition('.')[2]

  @property
  def is_tuple(self) -> bool:
    """Whether the value is a tuple (JSON gives it back as a list)."""
    return (typing.get_origin(self.type) or self.type) is tuple


def config_dict(settings: Iterable[Setting]) -> ml_collections.ConfigDict:
  """The ConfigDict of the declared defaults, sections as nested ConfigDicts.

  Args:
    settings: the declarations, in the order the config lists them.
  """
  config = ml_collections.ConfigDict()
  for setting in settings:
    node = config
    for part in setting.section.split('.') if setting.section else ():
      if part not in node:
        node[part] = ml_collections.ConfigDict()
      node = node[part]
    node[setting.name] = setting.default
  return config


# Checks: each says what it accepts in the message a bad value gets
# ('batch_size=-1 must be ...'), so the docs' table and the error agree.


def is_int(value: Any) -> bool:
  """An int, and not a bool (which Python counts as one)."""
  return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
  """A finite int or float, and not a bool."""
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def must(ok: Callable[[Any], bool], values: str, why: str = '') -> Check:
  """A check whose message is 'key=value must be <values><why>'."""
  return Check(lambda key, value: None if ok(value) else
               f'{key}={value!r} must be {values}{why}', values)


def integer(minimum: int | None = None, *, words: str | None = None,
            why: str = '') -> Check:
  """An int (not a bool) of at least `minimum`; `words` says so if the
  default wording ('a positive integer') would not."""
  if minimum is None:
    return must(is_int, words or 'an integer', why)
  words = words or {0: 'an integer >= 0', 1: 'a positive integer'}.get(
      minimum, f'an integer >= {minimum}')
  return must(lambda v: is_int(v) and v >= minimum, words, why)


def number(low: float, high: float = math.inf, *, low_open: bool = False,
           high_open: bool = True, words: str | None = None,
           why: str = '') -> Check:
  """A finite int or float in the interval [low, high) (or as opened)."""
  def ok(v):
    return (is_number(v) and (v > low if low_open else v >= low)
            and (v < high if high_open else v <= high))
  if words:
    pass
  elif high == math.inf:
    words = 'positive' if (low, low_open) == (0, True) else (
        f'{">" if low_open else ">="} {low:g}')
  else:
    words = (f'in {"(" if low_open else "["}{low:g}, {high:g}'
             f'{")" if high_open else "]"}')
  return must(ok, words, why)


def boolean() -> Check:
  """True or False."""
  return must(lambda v: isinstance(v, bool), 'True or False')


def text() -> Check:
  """Any string."""
  return must(lambda v: isinstance(v, str), 'a string')


def one_of(choices: Iterable[str] | Callable[[], Iterable[str]]) -> Check:
  """One of the given names (or of those a function gives, for lists that
  live in a module too heavy to import when the config is read)."""
  def names() -> tuple[str, ...]:
    return tuple(choices() if callable(choices) else choices)

  def problem(key, value):
    if isinstance(value, str) and value in names():
      return None
    return f'{key} {value!r} is unknown; use one of {", ".join(names())}'
  return Check(problem, lambda: ', '.join(names()))


def path(empty: str = '') -> Check:
  """A local path or a URL of a scheme meshfit reads (several,
  comma-separated, are each checked); `empty` says what '' means."""
  def problem(key, value):
    if not isinstance(value, str):
      return f'{key}={value!r} must be a path (a string)'
    for part in value.split(','):
      try:
        storage.check_scheme(part.strip())
      except storage.StorageError as e:
        return f'{key}: {e}'
    return None
  return Check(problem, 'a path or gs:// URL' + (f"; '': {empty}"
                                                 if empty else ''))


def directory(empty: str) -> Check:
  """A directory's path or URL (not a file's); `empty` says what ''
  means."""
  paths = path()

  def problem(key, value):
    if isinstance(value, str) and (scheme := paths.problem(key, value)):
      return scheme
    if (not isinstance(value, str) or (
        not storage.is_remote(value)
        and os.path.isfile(os.path.expanduser(value)))):
      return f"{key}={value!r} must be a directory path, or '' to {empty}"
    return None
  return Check(problem, f"a directory path or gs:// URL; '' to {empty}")


def tuple_of(ok: Callable[[Any], bool], values: str, example: str) -> Check:
  """A tuple whose every item is `ok`; `example` shows how to write one on
  the command line."""
  def problem(key, value):
    if isinstance(value, tuple) and all(ok(v) for v in value):
      return None
    return (f'{key}={value!r} must be a tuple of {values}, e.g. '
            f"--config.{key}='{example}'")
  return Check(problem, f'a tuple of {values}')
