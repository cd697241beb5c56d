"""Old spellings of config keys, read as the keys that replaced them.

Two choices that once took two keys each take one now:
`dataset.standardize` (False: raw numbers) is `dataset.numeric_scaling`
'none', and `dataset.validation_fraction` / `dataset.validation_folds` are
`dataset.validation` (a fraction, or a number of folds). A run saved before
(config.json, every checkpoint's config) and a config file written before
still load: `translate` reads them as the keys of now.
"""

from collections.abc import Mapping
from typing import Any

from meshfit.configs import default
from meshfit.errors import UsageError

# Each old key and the key that replaced it, as declared.
RENAMED = {old: s.key for s in default.SETTINGS for old in s.formerly}
# Each old key's type (to read it from a string) and how it is written now.
_OLD = {'dataset.standardize': (bool, "False is now "
                                "dataset.numeric_scaling='none'"),
        'dataset.validation_fraction': (float, 'the same fraction'),
        'dataset.validation_folds': (int, 'the same number of folds')}


def old_type(key: str) -> type:
  """The type an old key's values had."""
  return _OLD[key][0]


def how_to_write(key: str) -> str:
  """A line saying how an old key is written now."""
  return f'{key} is spelled the old way: write {RENAMED[key]} ({_OLD[key][1]})'


def flatten(config: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  """{'mesh.model': 1, ...}: every leaf of a nested mapping (a ConfigDict
  too) under its dotted key."""
  out = {}
  for key, value in config.items():
    if hasattr(value, 'items'):
      out.update(flatten(value, f'{prefix}{key}.'))
    else:
      out[f'{prefix}{key}'] = value
  return out


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
  """The nested dict of {dotted key: value}."""
  out: dict[str, Any] = {}
  for key, value in flat.items():
    *parents, leaf = key.split('.')
    node = out
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return out


def translate(flat: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
  """`flat` with its old keys read as the keys of now.

  An old key wins over the new key's value beside it: a config file that
  sets an old key starts from configs/default.py, which gives the new key
  its default, and meant what the old key says.

  Args:
    flat: {dotted key: value}, e.g. a saved config.json flattened.

  Returns:
    The translated keys, and a line for each old key met, saying how to
    write it now.

  Raises:
    UsageError: both old validation keys are set (they never could be).
  """
  out, notes = dict(flat), []
  if 'dataset.standardize' in out:
    if not out.pop('dataset.standardize'):
      out['dataset.numeric_scaling'] = 'none'
      notes.append("dataset.standardize=False is now written "
                   "dataset.numeric_scaling='none'")
    else:
      notes.append('dataset.standardize=True is what '
                   'dataset.numeric_scaling does unless it is none; drop it')
  if 'dataset.validation_folds' in out or 'dataset.validation_fraction' in out:
    folds = out.pop('dataset.validation_folds', 0)
    fraction = out.pop('dataset.validation_fraction', 0.0)
    if folds and fraction:
      raise UsageError(
          f'dataset.validation_folds={folds} and dataset.validation_fraction='
          f'{fraction:g} are both set; choose one: they are one key now, '
          f'dataset.validation={folds} (folds) or {fraction:g} (a fraction)')
    out['dataset.validation'] = folds or fraction
    given = ', '.join(f'{k}={flat[k]!r}' for k in (
        'dataset.validation_folds', 'dataset.validation_fraction')
                      if k in flat)
    notes.append(f'{given} is now written dataset.validation='
                 f'{out["dataset.validation"]!r}')
  return out, notes


def has_old_keys(flat: Mapping[str, Any]) -> bool:
  """Whether `flat` spells any key the old way."""
  return any(k in RENAMED for k in flat)


def new_key(key: str) -> str:
  """The key of now for `key`, old or not."""
  return RENAMED.get(key, key)
