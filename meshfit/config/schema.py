"""The run config's types: one frozen dataclass per section, made from the
declarations of configs/default.py and built from a ConfigDict or a
config.json read back.

A section's fields are its declared keys, with their declared types and no
defaults (the declaration holds the default, once): read configs/default.py
for what they are. The model section is models/mlp.py's `MlpConfig`, which
models define for themselves (a model knows nothing of configs);
tests/test_config.py holds its fields to the declarations.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from meshfit.configs import default
from meshfit.configs.settings import Setting
from meshfit.errors import UsageError
from meshfit.models.mlp import MlpConfig

SETTINGS: dict[str, Setting] = {s.key: s for s in default.SETTINGS}


def _fields(section: str) -> list[tuple[str, Any]]:
  return [(s.name, s.type) for s in default.SETTINGS if s.section == section]


def _section(name: str, section: str, doc: str, **namespace: Any) -> type:
  cls = dataclasses.make_dataclass(name, _fields(section), frozen=True,
                                   namespace=namespace)
  cls.__module__, cls.__doc__ = __name__, doc  # for pickle and readers
  return cls


def _validation_folds(self) -> int:
  """k of k-fold cross-fitting (`validation` >= 2), else 0."""
  return int(self.validation) if self.validation >= 1 else 0


def _validation_fraction(self) -> float:
  """The fraction of the training rows held out (`validation` in (0, 1)),
  else 0."""
  return float(self.validation) if 0 < self.validation < 1 else 0.0


DatasetConfig = _section(
    'DatasetConfig', 'dataset',
    'config.dataset: which data, and how it is read.',
    validation_folds=property(_validation_folds),
    validation_fraction=property(_validation_fraction))
OptimizerConfig = _section(
    'OptimizerConfig', 'optimizer',
    'config.optimizer: optax optimizer and learning-rate schedule.')
SweepConfig = _section(
    'SweepConfig', 'sweep',
    'config.sweep: per-member hyperparameters and how members are chosen.')
MeshConfig = _section(
    'MeshConfig', 'mesh',
    'config.mesh: the (members, data, model) device mesh; -1 takes what is '
    'left (data or model).')

_SECTIONS = {'dataset': DatasetConfig, 'model': MlpConfig,
             'optimizer': OptimizerConfig, 'sweep': SweepConfig,
             'mesh': MeshConfig}


def _config_fields() -> list[tuple[str, Any]]:
  """The top-level keys and the sections, in declaration order."""
  fields, seen = [], set()
  for setting in default.SETTINGS:
    name = setting.section.split('.')[0] or setting.name
    if name not in seen:
      seen.add(name)
      fields.append((name, _SECTIONS[name] if setting.section
                     else setting.type))
  return fields


def _to_dict(self) -> dict[str, Any]:
  """The config as nested plain values (as config.json holds it)."""
  return dataclasses.asdict(self)


Config = dataclasses.make_dataclass('Config', _config_fields(), frozen=True,
                                    namespace={'to_dict': _to_dict})
Config.__module__ = __name__
Config.__doc__ = 'The whole run config; configs/default.py declares each key.'


def build(cls, raw: Mapping[str, Any], prefix: str = ''):
  """`cls` from the keys of `raw` named as its fields (others ignored)."""
  values = {}
  for field in dataclasses.fields(cls):
    key = f'{prefix}{field.name}'
    if field.name not in raw:
      raise UsageError(f'the config has no key {key!r}; start the config file '
                       'from configs/default.py, which declares every key')
    value = raw[field.name]
    if not prefix and field.name in _SECTIONS:
      value = build(_SECTIONS[field.name], value, f'{field.name}.')
    elif SETTINGS[key].is_tuple and isinstance(value, (list, tuple)):
      value = tuple(value)
    values[field.name] = value
  return cls(**values)
