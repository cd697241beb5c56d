"""Dotted-key overrides of a config, as `--config.KEY=VALUE` applies them.

`with_overrides` is what a notebook or a script calls with
`{'model.hidden_sizes': (64, 64)}`; `unknown_key_message` is the message
train.py and it give for a key configs/default.py does not declare.
"""

import difflib
from collections.abc import Mapping
from typing import Any

import ml_collections
from absl import flags, logging
from ml_collections.config_flags import config_path, tuple_parser

from meshfit.configs import default
from meshfit.config import spellings
from meshfit.errors import UsageError

# How a string becomes a value of each field type: the parsers
# ml_collections' config flags use for `--config.KEY=VALUE`.
_PARSERS = {
    bool: flags.BooleanParser(),
    int: flags.IntegerParser(),
    float: flags.FloatParser(),
    tuple: tuple_parser.TupleParser(),
}


def declared_keys() -> list[str]:
  """Every dotted key configs/default.py declares, sections included."""
  def keys(tree: Mapping[str, Any], prefix: str = '') -> list[str]:
    out = []
    for name, value in tree.items():
      out.append(prefix + name)
      if isinstance(value, Mapping):
        out += keys(value, f'{prefix}{name}.')
    return out
  return keys(default.get_config().to_dict())


def unknown_key_message(key: str, given: str) -> str | None:
  """What is wrong with a key configs/default.py does not declare.

  Args:
    key: a dotted config key.
    given: how the user wrote it, for the message (e.g. the command line's
      `--config.KEY=VALUE`).

  Returns:
    None if the key is declared, else the message, naming the nearest
    declared key.
  """
  known = declared_keys()
  if key in known:
    return None
  if key in spellings.RENAMED:
    return f'config key {key!r} in {given}: {spellings.how_to_write(key)}'
  close = difflib.get_close_matches(key, known, n=1)
  hint = f'did you mean {close[0]!r}? ' if close else ''
  return (f'unknown config key {key!r} in {given}; {hint}'
          'configs/default.py declares every key')


def _new_spellings(overrides: Mapping[str, Any]) -> dict[str, Any]:
  """`overrides` with keys spelled the old way read as now's (a warning
  says how to write them)."""
  old = {k: v for k, v in overrides.items() if k in spellings.RENAMED}
  if not old:
    return dict(overrides)
  for key, value in old.items():
    logging.warning('config: %s', spellings.how_to_write(key))
    if isinstance(value, str):
      try:
        old[key] = _PARSERS[spellings.old_type(key)].parse(value)
      except ValueError as e:
        raise UsageError(f'{key}={value!r}: {e}') from None
  new, _ = spellings.translate(old)
  return {**{k: v for k, v in overrides.items() if k not in old}, **new}


def with_overrides(config: ml_collections.ConfigDict,
                   overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """A copy of `config` with each dotted key of `overrides` set.

  Values are taken as `--config.KEY=VALUE` takes them: a string given for a
  number, bool or tuple key is parsed as the command line parses it
  ('(64, 64)', '3e-3', 'false'); other values must have the key's type
  (an int may stand for a float, a list for a tuple). Whether a value is
  allowed is `parse`'s to say, as it is for the command line. A key spelled
  the old way (`spellings`) is read as now's, with a warning.

  Args:
    config: the config to start from (it is not changed).
    overrides: {'model.hidden_sizes': (64, 64), 'mesh.model': 2, ...}.

  Returns:
    The new config, locked if `config` was.

  Raises:
    UsageError: a key is not declared, names a section rather than a
      setting, or its value cannot be of the key's type.
  """
  out = ml_collections.ConfigDict(config.to_dict())
  for key, value in _new_spellings(overrides).items():
    given = f'{key}={value!r}'
    if (message := unknown_key_message(key, given)) is not None:
      raise UsageError(message)
    try:
      field_type = config_path.get_type(key, out)
    except (AttributeError, KeyError):
      raise UsageError(f'config key {key!r} is declared but missing from this '
                       'config; start it from configs/default.py') from None
    if field_type is ml_collections.ConfigDict:
      raise UsageError(f'{given}: {key!r} is a section of the config; set '
                       f'its keys one by one, e.g. {key}.<name>')
    if isinstance(value, str) and field_type in _PARSERS:
      try:
        value = _PARSERS[field_type].parse(value)
      except ValueError as e:
        raise UsageError(f'{given}: {e}') from None
    elif isinstance(value, list) and field_type is tuple:
      value = tuple(value)
    try:
      config_path.set_value(key, out, value)
    except TypeError:
      raise UsageError(f'{given}: {key} takes a value of type '
                       f'{field_type.__name__}, not {type(value).__name__}'
                       ) from None
  if config.is_locked:
    out.lock()
  return out
