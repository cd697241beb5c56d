"""The run config, checked: `parse` turns the ConfigDict of `configs/` (or a
config.json read back) into a `Config` and checks every key once, here;
`check_devices` checks it against the devices at hand. Nothing after them
re-checks: the rest of meshfit takes the typed sections it needs. Every
problem raises UsageError with a message that names the key, the value and
the fix; `train.py` turns it into `error: ...` and exit status 2.
"""

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import storage
from input_pipeline import csv_regression, tables
from meshfit.config.schema import (Config, DatasetConfig, OptimizerConfig,
                                   SweepConfig, build)
from meshfit.errors import UsageError
from meshfit.parallel import sharding
from models import mlp
from models.mlp import MlpConfig

OPTIMIZERS = ('sgd', 'adam', 'adamw')
SCHEDULES = ('constant', 'warmup_cosine')
NUMERIC_SCALINGS = ('standardize', 'quantile')
NUMERIC_EMBEDDINGS = ('none', 'ple')
LIKELIHOODS = ('squared_error', 'gaussian')
SELECTIONS = ('all', 'best', 'greedy')
KNOWN_DATASETS = tables.GENERATED_DATASETS + (csv_regression.NAME,)


def parse(raw: Mapping[str, Any] | Config) -> Config:
  """Checks every key of `raw` and returns it typed.

  Args:
    raw: a ConfigDict (or the nested dict of a config.json) with every key
      of configs/default.py; a `Config` is returned as it is.

  Raises:
    UsageError: the first problem found.
  """
  if isinstance(raw, Config):
    return raw
  config = build(Config, raw)
  _check_top(config)
  _check_dataset(config.dataset)
  _check_model(config.model)
  _check_optimizer(config.optimizer)
  _check_sweep(config)
  return config


def _require(ok: bool, message: str) -> None:
  if not ok:
    raise UsageError(message)


def _check_path(key: str, value: object) -> None:
  """A path key names a local path or a URL of a scheme meshfit knows
  (several comma-separated paths for train_path)."""
  if not isinstance(value, str):
    return
  for path in value.split(','):
    try:
      storage.check_scheme(path.strip())
    except storage.StorageError as e:
      raise UsageError(f'{key}: {e}') from None


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def _check_top(config: Config) -> None:
  _require(_is_int(config.seed), f'seed={config.seed!r} must be an integer')
  for key in ('eval_batch_size', 'max_checkpoints_to_keep',
              'profile_num_steps'):
    value = getattr(config, key)
    _require(_is_int(value) and value > 0,
             f'{key}={value!r} must be a positive integer')
  for key in ('batch_size', 'num_train_steps', 'log_every_steps',
              'eval_every_steps'):
    value = getattr(config, key)
    _require(_is_int(value) and value >= 0,
             f'{key}={value!r} must be a positive integer, or 0 to size it '
             'to the training table')
  _require(_is_number(config.train_epochs) and config.train_epochs > 0,
           f'train_epochs={config.train_epochs!r} must be a positive number '
           '(the epochs of a run whose num_train_steps is 0)')
  for key in ('profile_start_step', 'steps_per_call',
              'checkpoint_every_steps', 'early_stopping_evals'):
    value = getattr(config, key)
    _require(_is_int(value) and value >= 0,
             f'{key}={value!r} must be an integer >= 0')
  _require(_is_number(config.checkpoint_every_seconds)
           and config.checkpoint_every_seconds >= 0,
           f'checkpoint_every_seconds={config.checkpoint_every_seconds!r} '
           'must be a number of seconds >= 0 (0: no checkpoints by the clock)')
  cache_dir = config.compilation_cache_dir
  _require(isinstance(cache_dir, str),
           f'compilation_cache_dir={cache_dir!r} must be a directory path, '
           "or '' to turn the cache off")
  _check_path('compilation_cache_dir', cache_dir)
  _require(storage.is_remote(cache_dir)
           or not os.path.isfile(os.path.expanduser(cache_dir)),
           f'compilation_cache_dir={cache_dir!r} must be a directory path, '
           "or '' to turn the cache off")
  _require(isinstance(config.plots, bool),
           f'plots={config.plots!r} must be True or False')
  _require(isinstance(config.eval_during_training, bool),
           f'eval_during_training={config.eval_during_training!r} must be '
           'True or False')


def _check_dataset(dataset: DatasetConfig) -> None:
  _require(dataset.name in KNOWN_DATASETS,
           f'dataset.name {dataset.name!r} is unknown; use one of '
           f'{", ".join(KNOWN_DATASETS)}')
  _require(dataset.numeric_scaling in NUMERIC_SCALINGS,
           f'dataset.numeric_scaling {dataset.numeric_scaling!r} is unknown; '
           f'use one of {", ".join(NUMERIC_SCALINGS)}')
  _require(_is_number(dataset.validation_fraction)
           and 0 <= dataset.validation_fraction < 1,
           f'dataset.validation_fraction={dataset.validation_fraction!r} must '
           'be in [0, 1) (0: no validation)')
  folds = dataset.validation_folds
  _require(_is_int(folds) and (folds == 0 or folds >= 2),
           f'dataset.validation_folds={folds!r} must be 0 (no folds) or a '
           'number of folds >= 2')
  _require(not (folds and dataset.validation_fraction),
           f'dataset.validation_folds={folds} holds out every training row '
           'once (a fold per member) and dataset.validation_fraction='
           f'{dataset.validation_fraction:g} a fraction for every member; '
           'choose one: set the other to 0')
  _require(_is_int(dataset.prefetch_batches) and dataset.prefetch_batches > 0,
           f'dataset.prefetch_batches={dataset.prefetch_batches!r} must be a '
           'positive integer')
  _require(_is_int(dataset.resident_table_mb)
           and dataset.resident_table_mb >= 0,
           f'dataset.resident_table_mb={dataset.resident_table_mb!r} must be '
           'an integer >= 0')
  _require(_is_int(dataset.category_min_count)
           and dataset.category_min_count >= 1,
           f'dataset.category_min_count={dataset.category_min_count!r} must '
           'be a positive integer: how many training rows a category value '
           'needs to get a code of its own (1: every value seen)')
  for key in ('data_dir', 'train_path', 'eval_path'):
    _check_path(f'dataset.{key}', getattr(dataset, key))
  if dataset.name != csv_regression.NAME:
    return
  _require(isinstance(dataset.train_path, str) and dataset.train_path,
           'dataset.train_path is empty; csv_regression needs the path of a '
           'CSV or Parquet file with a header row, e.g. '
           '--config.dataset.train_path=data/train.csv')
  _require(isinstance(dataset.eval_path, str),
           f'dataset.eval_path={dataset.eval_path!r} must be the path of a '
           "CSV or Parquet file, or '' to estimate the error on validation "
           'rows')
  # Without an eval file the validation rows' metrics are the estimate of
  # the model's error: a run with neither would report nothing.
  _require(dataset.eval_path or dataset.validation_folds
           or dataset.validation_fraction > 0,
           'dataset.eval_path is empty and the run validates on no rows '
           '(dataset.validation_folds=0, dataset.validation_fraction=0), so '
           "nothing would estimate the model's error; set "
           'dataset.validation_folds=5 (or dataset.validation_fraction=0.2) '
           'to estimate it on the training rows, or give an eval file: '
           '--config.dataset.eval_path=data/test.csv')
  for key in ('target_columns', 'feature_columns', 'categorical_columns'):
    value = getattr(dataset, key)
    _require(isinstance(value, tuple),
             f"dataset.{key}={value!r} must be a tuple of column names, e.g. "
             f"--config.dataset.{key}='(\"a\", \"b\")'")
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


def _check_model(model: MlpConfig) -> None:
  hidden = model.hidden_sizes
  _require(isinstance(hidden, tuple)
           and all(_is_int(h) and h > 0 for h in hidden),
           f'model.hidden_sizes={hidden} must hold positive integers '
           '(() is a linear model)')
  _require(model.activation in mlp.ACTIVATIONS,
           f'model.activation {model.activation!r} is unknown; use one of '
           f'{", ".join(sorted(mlp.ACTIVATIONS))}')
  _require(_is_number(model.dropout_rate) and 0.0 <= model.dropout_rate < 1.0,
           f'model.dropout_rate={model.dropout_rate} must be in [0, 1)')
  for key in ('dtype', 'param_dtype'):
    value = getattr(model, key)
    _require(value in mlp.DTYPES, f'model.{key} {value!r} is unknown; use one '
             f'of {", ".join(mlp.DTYPES)}')
  for key in ('raw_numbers', 'ridge_blend'):
    value = getattr(model, key)
    _require(isinstance(value, bool),
             f'model.{key}={value!r} must be True or False')
  _require(model.numeric_embedding in NUMERIC_EMBEDDINGS,
           f'model.numeric_embedding {model.numeric_embedding!r} is unknown; '
           f'use one of {", ".join(NUMERIC_EMBEDDINGS)}')
  for key in ('ple_bins', 'numeric_embedding_dim', 'category_embedding_dim',
              'ensemble_size'):
    value = getattr(model, key)
    _require(_is_int(value) and value > 0,
             f'model.{key}={value!r} must be a positive integer')
  for key in ('category_onehot_max', 'category_member_min_count'):
    value = getattr(model, key)
    _require(_is_int(value) and value >= 0,
             f'model.{key}={value!r} must be a non-negative integer')
  _require(model.likelihood in LIKELIHOODS,
           f'model.likelihood {model.likelihood!r} is unknown; use one of '
           f'{", ".join(LIKELIHOODS)}')
  _require(_is_number(model.nll_beta) and 0 <= model.nll_beta <= 1,
           f'model.nll_beta={model.nll_beta!r} must be in [0, 1]')
  _require(not model.ridge_blend or model.likelihood == 'squared_error',
           'model.ridge_blend=True blends predicted values, and '
           f"model.likelihood='{model.likelihood}' predicts distributions; "
           'set model.ridge_blend=False')


def grid_size(sweep: SweepConfig) -> int:
  """The number of hyperparameter combinations of a sweep (1: none)."""
  size = 1
  for values in (sweep.learning_rates, sweep.weight_decays,
                 sweep.dropout_rates):
    size *= max(len(values), 1)
  return size


def _check_sweep(config: Config) -> None:
  sweep = config.sweep
  for key, low, high in (('learning_rates', 0, math.inf),
                         ('weight_decays', 0, math.inf),
                         ('dropout_rates', 0, 1)):
    values = getattr(sweep, key)
    _require(isinstance(values, tuple)
             and all(_is_number(v) and low <= v < high for v in values)
             and (key != 'learning_rates' or all(v > 0 for v in values)),
             f'sweep.{key}={values!r} must be a tuple of numbers in '
             f'{"(" if key == "learning_rates" else "["}{low}, {high}), '
             f"e.g. --config.sweep.{key}='(0.001, 0.003)'")
  _require(sweep.select in SELECTIONS, f'sweep.select {sweep.select!r} is '
           f'unknown; use one of {", ".join(SELECTIONS)}')
  size = grid_size(sweep)
  members = config.model.ensemble_size
  folds = max(config.dataset.validation_folds, 1)
  _require(members % folds == 0,
           f'model.ensemble_size={members} is not a multiple of '
           f'dataset.validation_folds={folds}; use a multiple of {folds} '
           '(member m holds out fold m % folds)')
  _require(members // folds % size == 0,
           f'model.ensemble_size={members} is not a multiple of the sweep\'s '
           f'{size} combinations'
           + (f' times the {folds} folds' if folds > 1 else '')
           + f'; use a multiple of {size * folds} (members take the '
           'combinations in turn' + (', each on every fold' if folds > 1
                                     else '') + ')')
  _require(sweep.select == 'all' or config.dataset.validation_fraction > 0
           or config.dataset.validation_folds,
           f"sweep.select='{sweep.select}' chooses members on validation "
           'rows; set dataset.validation_fraction (e.g. 0.2) or '
           'dataset.validation_folds, or select=all')
  _require(not config.model.ridge_blend
           or config.dataset.validation_fraction > 0
           or config.dataset.validation_folds,
           'model.ridge_blend=True weighs the ridge part on validation rows; '
           'set dataset.validation_fraction (e.g. 0.2) or '
           'dataset.validation_folds, or model.ridge_blend=False')
  _require(_is_int(config.mesh.members) and config.mesh.members > 0
           and members % config.mesh.members == 0,
           f'mesh.members={config.mesh.members!r} must divide '
           f'model.ensemble_size={members}')


def _check_optimizer(opt: OptimizerConfig) -> None:
  _require(opt.name in OPTIMIZERS, f'optimizer.name {opt.name!r} is unknown; '
           f'use one of {", ".join(OPTIMIZERS)}')
  _require(opt.schedule in SCHEDULES, f'optimizer.schedule {opt.schedule!r} '
           f'is unknown; use one of {", ".join(SCHEDULES)}')
  _require(_is_number(opt.learning_rate) and opt.learning_rate > 0,
           f'optimizer.learning_rate={opt.learning_rate} must be positive')
  _require(_is_int(opt.warmup_steps) and opt.warmup_steps >= 0,
           f'optimizer.warmup_steps={opt.warmup_steps} must be >= 0')
  _require(_is_int(opt.cosine_cycles) and opt.cosine_cycles >= 1,
           f'optimizer.cosine_cycles={opt.cosine_cycles!r} must be a '
           'positive integer')
  _require(_is_number(opt.end_learning_rate_factor)
           and 0.0 <= opt.end_learning_rate_factor <= 1.0,
           'optimizer.end_learning_rate_factor='
           f'{opt.end_learning_rate_factor} must be in [0, 1]')
  _require(_is_number(opt.weight_decay) and opt.weight_decay >= 0,
           f'optimizer.weight_decay={opt.weight_decay} must be >= 0')
  _require(_is_number(opt.momentum) and 0.0 <= opt.momentum < 1.0,
           f'optimizer.momentum={opt.momentum} must be in [0, 1)')
  _require(_is_number(opt.grad_clip_norm) and opt.grad_clip_norm >= 0,
           f'optimizer.grad_clip_norm={opt.grad_clip_norm} must be >= 0 (0 '
           'disables clipping)')


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
