"""The run config's types: one frozen dataclass per section of
configs/default.py, built from a ConfigDict or a config.json read back.

The dataclasses declare no defaults: configs/default.py holds every key's
default, once (tests/test_config.py fails if a dataclass grows one).
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from meshfit.errors import UsageError
from models.mlp import MlpConfig


@dataclasses.dataclass(frozen=True)
class DatasetConfig:
  """config.dataset: which data, and how it is read (configs/default.py)."""
  name: str
  data_dir: str
  train_path: str
  eval_path: str
  target_columns: tuple[str, ...]
  feature_columns: tuple[str, ...]
  categorical_columns: tuple[str, ...]
  category_min_count: int
  train_split: str
  eval_split: str
  standardize: bool
  numeric_scaling: str
  validation_fraction: float
  validation_folds: int
  prefetch_batches: int
  resident_table_mb: int


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """config.optimizer: optax optimizer and learning-rate schedule."""
  name: str
  learning_rate: float
  schedule: str
  warmup_steps: int
  end_learning_rate_factor: float
  cosine_cycles: int
  weight_decay: float
  momentum: float
  grad_clip_norm: float


@dataclasses.dataclass(frozen=True)
class SweepConfig:
  """config.sweep: per-member hyperparameters and how members are chosen."""
  learning_rates: tuple[float, ...]
  weight_decays: tuple[float, ...]
  dropout_rates: tuple[float, ...]
  select: str


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """config.mesh: the (members, data, model) device mesh; -1 takes what is
  left (data or model)."""
  members: int
  data: int
  model: int


@dataclasses.dataclass(frozen=True)
class Config:
  """The whole run config; each key is declared in configs/default.py."""
  seed: int
  dataset: DatasetConfig
  model: MlpConfig
  optimizer: OptimizerConfig
  batch_size: int
  eval_batch_size: int
  num_train_steps: int
  train_epochs: float
  steps_per_call: int
  log_every_steps: int
  eval_every_steps: int
  checkpoint_every_steps: int
  checkpoint_every_seconds: float
  max_checkpoints_to_keep: int
  early_stopping_evals: int
  sweep: SweepConfig
  mesh: MeshConfig
  compilation_cache_dir: str
  plots: bool
  eval_during_training: bool
  profile_start_step: int
  profile_num_steps: int

  def to_dict(self) -> dict[str, Any]:
    """The config as nested plain values (as config.json holds it)."""
    return dataclasses.asdict(self)


_SECTIONS = {'dataset': DatasetConfig, 'model': MlpConfig,
             'optimizer': OptimizerConfig, 'sweep': SweepConfig,
             'mesh': MeshConfig}
# Sequences arrive as lists from JSON; the config holds tuples.
_TUPLES = ('dataset.target_columns', 'dataset.feature_columns',
           'dataset.categorical_columns', 'model.hidden_sizes',
           'sweep.learning_rates', 'sweep.weight_decays',
           'sweep.dropout_rates')


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
    elif key in _TUPLES and isinstance(value, (list, tuple)):
      value = tuple(value)
    values[field.name] = value
  return cls(**values)
