"""The run config, checked: `parse` turns the ConfigDict of `configs/` (or a
config.json read back) into a `Config` and checks every key once, here,
with the check its declaration in configs/default.py names, then what keys
ask of each other;
`check_devices` checks it against the devices at hand. Nothing after them
re-checks: the rest of meshfit takes the typed sections it needs. Every
problem raises UsageError with a message that names the key, the value and
the fix; `train.py` turns it into `error: ...` and exit status 2.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from absl import logging

from meshfit.input_pipeline import csv_regression
from meshfit.config import spellings
from meshfit.config.schema import (SETTINGS, Config, DatasetConfig,
                                   SweepConfig, build)
from meshfit.errors import UsageError
from meshfit.parallel import sharding
from meshfit.models import mlp


def parse(raw: Mapping[str, Any] | Config) -> Config:
  """Checks every key of `raw` and returns it typed.

  Args:
    raw: a ConfigDict (or the nested dict of a config.json) with every key
      of configs/default.py; a `Config` is returned as it is. Keys spelled
      the old way (`spellings`) are read as the keys of now, with a warning.

  Raises:
    UsageError: the first problem found.
  """
  if isinstance(raw, Config):
    return raw
  flat = spellings.flatten(raw)
  if spellings.has_old_keys(flat):
    flat, notes = spellings.translate(flat)
    for note in notes:
      logging.warning('config: %s', note)
    raw = spellings.unflatten(flat)
  config = build(Config, raw)
  for key, setting in SETTINGS.items():
    value = config
    for part in key.split('.'):
      value = getattr(value, part)
    if (problem := setting.check.problem(key, value)) is not None:
      raise UsageError(problem)
  _check_dataset(config.dataset)
  _check_sweep(config)
  return _with_ridge_where_weighed(config)


def _require(ok: bool, message: str) -> None:
  if not ok:
    raise UsageError(message)


_VALIDATE = ('set dataset.validation to a number of folds (e.g. 5) or a '
             'fraction of the training rows to hold out (e.g. 0.2)')


def _check_dataset(dataset: DatasetConfig) -> None:
  """What the keys of config.dataset ask of each other."""
  if dataset.name != csv_regression.NAME:
    return
  _require(bool(dataset.train_path),
           'dataset.train_path is empty; csv_regression needs the path of a '
           'CSV or Parquet file with a header row, e.g. '
           '--config.dataset.train_path=data/train.csv')
  # Without an eval file the validation rows' metrics are the estimate of
  # the model's error: a run with neither would report nothing.
  _require(dataset.eval_path or dataset.validation,
           'dataset.eval_path is empty and the run validates on no rows '
           "(dataset.validation=0), so nothing would estimate the model's "
           f'error; {_VALIDATE} to estimate it on the training rows, or give '
           'an eval file: --config.dataset.eval_path=data/test.csv')
  check_column_selection(dataset.target_columns, dataset.feature_columns,
                         dataset.categorical_columns)


def check_column_selection(target_columns: Sequence[str],
                           feature_columns: Sequence[str],
                           categorical_columns: Sequence[str] = ()) -> None:
  """Targets given, no name twice, no target among the features.

  Raises:
    UsageError: naming the offending column and the setting to fix.
  """
  _require(bool(target_columns),
           'dataset.target_columns is empty; name the column(s) to predict, '
           "e.g. --config.dataset.target_columns='(\"y\",)'")
  for key, columns in (('dataset.target_columns', target_columns),
                       ('dataset.feature_columns', feature_columns),
                       ('dataset.categorical_columns', categorical_columns)):
    for column in columns:
      _require(isinstance(column, str) and bool(column),
               f'{key} holds {column!r}; give column names as non-empty '
               'strings')
      _require(list(columns).count(column) == 1,
               f'{key} names column {column!r} twice; name it once')
  both = [c for c in target_columns if c in feature_columns]
  _require(not both,
           f'column {both[0] if both else ""!r} is both a target '
           '(dataset.target_columns) and a feature (dataset.feature_columns); '
           'a model cannot take its own answer as input: remove it from '
           'dataset.feature_columns')
  targets = [c for c in categorical_columns if c in target_columns]
  _require(not targets,
           f'column {targets[0] if targets else ""!r} is a target '
           '(dataset.target_columns) and named in dataset.categorical_columns;'
           ' targets are numbers: remove it from dataset.categorical_columns')
  unused = [c for c in categorical_columns
            if feature_columns and c not in feature_columns]
  _require(not unused,
           f'column {unused[0] if unused else ""!r} is named in '
           'dataset.categorical_columns but not in dataset.feature_columns; '
           'add it to the features or remove it')


def _with_ridge_where_weighed(config: Config) -> Config:
  """`config` with model.ridge_blend off where the run cannot weigh a ridge
  part: a blend of values needs likelihood=squared_error, and its weight
  validation rows (the rule the setting's help states; configs/csv.py
  turns the ridge parts on for every run it starts)."""
  model = config.model
  if model.ridge_blend and (model.likelihood != 'squared_error'
                            or not config.dataset.validation):
    return dataclasses.replace(
        config, model=dataclasses.replace(model, ridge_blend=False))
  return config


def grid_size(sweep: SweepConfig) -> int:
  """The number of hyperparameter combinations of a sweep (1: none)."""
  size = 1
  for values in (sweep.learning_rates, sweep.weight_decays,
                 sweep.dropout_rates):
    size *= max(len(values), 1)
  return size


def _check_sweep(config: Config) -> None:
  """What the sweep, the members, the folds and the mesh ask of each
  other."""
  size = grid_size(config.sweep)
  members = config.model.ensemble_size
  folds = max(config.dataset.validation_folds, 1)
  _require(members % folds == 0,
           f'model.ensemble_size={members} is not a multiple of the {folds} '
           f'folds of dataset.validation={folds}; use a multiple of {folds} '
           '(member m holds out fold m % folds)')
  _require(members // folds % size == 0,
           f'model.ensemble_size={members} is not a multiple of the sweep\'s '
           f'{size} combinations'
           + (f' times the {folds} folds' if folds > 1 else '')
           + f'; use a multiple of {size * folds} (members take the '
           'combinations in turn' + (', each on every fold' if folds > 1
                                     else '') + ')')
  _require(config.sweep.select == 'all' or config.dataset.validation,
           f"sweep.select='{config.sweep.select}' chooses members on "
           f'validation rows; {_VALIDATE}, or select=all')
  _require(members % config.mesh.members == 0,
           f'mesh.members={config.mesh.members!r} must divide '
           f'model.ensemble_size={members}')


def check_devices(config: Config, num_devices: int,
                  devices_per_process: int | None = None) -> None:
  """Checks the mesh, batch sizes and hidden widths against the devices.

  Args:
    config: a parsed config.
    num_devices: devices in the job, over all hosts.
    devices_per_process: devices of each process, when there are several
      ('model' must fit inside one).

  Raises:
    UsageError: the first problem found.
  """
  data, model = sharding.mesh_shape(config.mesh.data, config.mesh.model,
                                    num_devices, config.mesh.members)
  if devices_per_process is not None and devices_per_process < num_devices:
    sharding.check_model_within_process(model, devices_per_process)
  for key in ('batch_size', 'eval_batch_size'):
    value = getattr(config, key)
    _require(value % data == 0,  # a batch_size of 0 is sized to divide
             f"{key} {value} is not divisible by the {data} devices of mesh "
             f"axis 'data'; use a multiple of {data}")
  for i, width in enumerate(config.model.hidden_sizes):
    if mlp.HIDDEN_AXIS in mlp.hidden_axes(i)[1:]:
      _require(width % model == 0,
               f'model.hidden_sizes[{i}]={width} is not divisible by the '
               f"{model} devices of mesh axis 'model' (hidden layer {i} is "
               f'split over it); use a multiple of {model} or a smaller '
               'mesh.model')
