"""Config checks before any work, and the config saved with a run.

Every check raises UsageError with a message that names the key, the value
and the fix; `train.py` turns it into `error: ...` and exit status 2.
"""

import json
import math
import os
from collections.abc import Iterable

import ml_collections

from configs import default
from input_pipeline import csv_regression, table_files, tables
from meshfit import optim, sharding
from meshfit.errors import UsageError
from models import mlp

# Keys that --mode=eval and --mode=predict may take from the command line:
# they change how a saved model is evaluated, not what it is.
EVAL_KEYS = ('eval_batch_size', 'dataset.eval_split', 'dataset.data_dir',
             'dataset.eval_path', 'dataset.prefetch_batches', 'mesh.data',
             'mesh.model', 'compilation_cache_dir', 'plots')

# Keys a resumed run may change: they decide how long and how observably it
# runs and where, not what the checkpointed state means. (num_train_steps
# also stretches or shrinks the warmup_cosine schedule from that step on.)
RESUME_SAFE_KEYS = EVAL_KEYS + (
    'num_train_steps', 'log_every_steps', 'eval_every_steps',
    'checkpoint_every_steps', 'max_checkpoints_to_keep', 'steps_per_call',
    'checkpoint_budget',
    'dataset.resident_table_mb', 'profile_start_step', 'profile_num_steps')


def _require(ok: bool, message: str) -> None:
  if not ok:
    raise UsageError(message)


def _positive_int(config: ml_collections.ConfigDict, key: str) -> None:
  value = get(config, key)
  _require(isinstance(value, int) and value > 0,
           f'{key}={value!r} must be a positive integer')


def get(config: ml_collections.ConfigDict, key: str):
  """The value of a dotted key such as 'mesh.model'."""
  for part in key.split('.'):
    config = config[part]
  return config


def flatten(config: ml_collections.ConfigDict,
            prefix: str = '') -> dict[str, object]:
  """{'mesh.model': 1, ...}: every leaf under its dotted key."""
  out = {}
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      out.update(flatten(value, f'{prefix}{key}.'))
    else:
      out[f'{prefix}{key}'] = value
  return out


def _validate_csv(dataset: ml_collections.ConfigDict) -> None:
  """The csv_regression keys: both files named, columns well chosen."""
  for key in ('train_path', 'eval_path'):
    value = dataset[key]
    _require(isinstance(value, str) and value,
             f'dataset.{key} is empty; csv_regression needs the path of a CSV '
             f'or Parquet file with a header row, e.g. '
             f'--config.dataset.{key}=data/{key.split("_")[0]}.csv')
  for key in ('target_columns', 'feature_columns'):
    value = dataset[key]
    _require(isinstance(value, tuple),
             f"dataset.{key}={value!r} must be a tuple of column names, e.g. "
             f"--config.dataset.{key}='(\"a\", \"b\")'")
  table_files.check_column_selection(dataset.target_columns,
                                     dataset.feature_columns)


def validate(config: ml_collections.ConfigDict, num_devices: int) -> None:
  """Checks every setting against the others and the devices at hand.

  Args:
    config: the resolved run config.
    num_devices: devices in the job, over all hosts.

  Raises:
    UsageError: the first problem found.
  """
  _require(isinstance(config.seed, int), f'seed={config.seed!r} must be an '
           'integer')
  _require(config.dataset.name in tables.KNOWN_DATASETS,
           f'dataset.name {config.dataset.name!r} is unknown; use one of '
           f'{", ".join(tables.KNOWN_DATASETS)}')
  _positive_int(config, 'dataset.prefetch_batches')
  if config.dataset.name == csv_regression.NAME:
    _validate_csv(config.dataset)

  hidden = tuple(config.model.hidden_sizes)
  _require(all(isinstance(h, int) and h > 0 for h in hidden),
           f'model.hidden_sizes={hidden} must hold positive integers '
           '(() is a linear model)')
  _require(config.model.activation in mlp.ACTIVATIONS,
           f'model.activation {config.model.activation!r} is unknown; use '
           f'one of {", ".join(sorted(mlp.ACTIVATIONS))}')
  _require(0.0 <= config.model.dropout_rate < 1.0,
           f'model.dropout_rate={config.model.dropout_rate} must be in [0, 1)')
  for key in ('model.dtype', 'model.param_dtype'):
    _require(get(config, key) in mlp.DTYPES,
             f'{key} {get(config, key)!r} is unknown; use one of '
             f'{", ".join(mlp.DTYPES)}')

  opt = config.optimizer
  _require(opt.name in optim.OPTIMIZERS, f'optimizer.name {opt.name!r} is '
           f'unknown; use one of {", ".join(optim.OPTIMIZERS)}')
  _require(opt.schedule in optim.SCHEDULES, f'optimizer.schedule '
           f'{opt.schedule!r} is unknown; use one of '
           f'{", ".join(optim.SCHEDULES)}')
  _require(math.isfinite(opt.learning_rate) and opt.learning_rate > 0,
           f'optimizer.learning_rate={opt.learning_rate} must be positive')
  _require(opt.warmup_steps >= 0,
           f'optimizer.warmup_steps={opt.warmup_steps} must be >= 0')
  _require(0.0 <= opt.end_learning_rate_factor <= 1.0,
           'optimizer.end_learning_rate_factor='
           f'{opt.end_learning_rate_factor} must be in [0, 1]')
  _require(opt.weight_decay >= 0,
           f'optimizer.weight_decay={opt.weight_decay} must be >= 0')
  _require(0.0 <= opt.momentum < 1.0,
           f'optimizer.momentum={opt.momentum} must be in [0, 1)')
  _require(opt.grad_clip_norm >= 0, f'optimizer.grad_clip_norm='
           f'{opt.grad_clip_norm} must be >= 0 (0 disables clipping)')

  for key in ('batch_size', 'eval_batch_size', 'num_train_steps',
              'log_every_steps', 'eval_every_steps', 'checkpoint_every_steps',
              'max_checkpoints_to_keep', 'profile_num_steps'):
    _positive_int(config, key)
  for key in ('dataset.resident_table_mb', 'profile_start_step',
              'steps_per_call'):
    _require(isinstance(get(config, key), int) and get(config, key) >= 0,
             f'{key}={get(config, key)!r} must be an integer >= 0')

  _require(isinstance(config.checkpoint_budget, (int, float))
           and 0 < config.checkpoint_budget <= 1,
           f'checkpoint_budget={config.checkpoint_budget!r} must be in (0, 1]')
  cache_dir = config.compilation_cache_dir
  _require(isinstance(cache_dir, str)
           and not os.path.isfile(os.path.expanduser(cache_dir)),
           f'compilation_cache_dir={cache_dir!r} must be a directory path, '
           "or '' to turn the cache off")

  data, model = sharding.mesh_shape(config.mesh.data, config.mesh.model,
                                    num_devices)
  for key in ('batch_size', 'eval_batch_size'):
    _require(config[key] % data == 0,
             f"{key} {config[key]} is not divisible by the {data} devices of "
             f"mesh axis 'data'; use a multiple of {data}")
  for i, width in enumerate(hidden):
    if mlp.MLP in mlp.hidden_axes(i)[1:]:
      _require(width % model == 0,
               f'model.hidden_sizes[{i}]={width} is not divisible by the '
               f"{model} devices of mesh axis 'model' (hidden layer {i} is "
               f'split over it); use a multiple of {model} or a smaller '
               'mesh.model')


def check_workdir(workdir: str) -> None:
  """The workdir must be a directory (or not exist yet)."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise UsageError(f'workdir {workdir} is a file; give a directory path')


def _tuples(value):
  """JSON has no tuples; the config's sequences are tuples."""
  if isinstance(value, list):
    return tuple(_tuples(v) for v in value)
  if isinstance(value, dict):
    return {k: _tuples(v) for k, v in value.items()}
  return value


def save_json(config: ml_collections.ConfigDict, path: str) -> None:
  """Writes the resolved config (atomically)."""
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    f.write(config.to_json(indent=2, sort_keys=True) + '\n')
  os.replace(tmp, path)


def _with_defaults(saved: dict, defaults: dict) -> dict:
  """`saved`, plus the keys it lacks taken from `defaults` (recursively)."""
  merged = dict(saved)
  for key, value in defaults.items():
    if key not in merged:
      merged[key] = value
    elif isinstance(value, dict) and isinstance(merged[key], dict):
      merged[key] = _with_defaults(merged[key], value)
  return merged


def load_json(path: str) -> ml_collections.ConfigDict:
  """Reads a config written by `save_json`.

  Keys added to configs/default.py since the run was saved take their
  default values, so a workdir from an older meshfit still evaluates.
  """
  try:
    with open(path, encoding='utf-8') as f:
      return ml_collections.ConfigDict(_with_defaults(
          _tuples(json.load(f)), default.get_config().to_dict()))
  except FileNotFoundError:
    raise UsageError(f'{path} does not exist: this workdir holds no run; '
                     'train one first (python train.py --workdir=...)'
                     ) from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UsageError(f'{path} is not valid JSON ({e}); restore it or train '
                     'into a new workdir') from None


def merge_eval_overrides(saved: ml_collections.ConfigDict,
                         given: ml_collections.ConfigDict,
                         keys: Iterable[str]) -> ml_collections.ConfigDict:
  """The saved run config with evaluation keys taken from `given`.

  Args:
    saved: the config the run was trained with.
    given: the config from the command line.
    keys: the dotted keys the user set; those that differ from `saved` must
      be evaluation keys.

  Returns:
    A copy of `saved` with those keys from `given`.

  Raises:
    UsageError: a key that changes the model or data would be overridden.
  """
  saved_flat, given_flat = flatten(saved), flatten(given)
  changed = sorted(k for k in keys
                   if k in given_flat and given_flat[k] != saved_flat.get(k))
  bad = [k for k in changed if k not in EVAL_KEYS]
  if bad:
    details = ', '.join(f'{k} (trained {saved_flat.get(k)!r}, given '
                        f'{given_flat[k]!r})' for k in bad)
    raise UsageError(
        f'evaluation takes the model from the workdir and cannot change '
        f'{details}; drop those overrides (only {", ".join(EVAL_KEYS)} may '
        'change) or train a new run')
  merged = ml_collections.ConfigDict(saved.to_dict())
  for key in changed:
    *parents, leaf = key.split('.')
    node = merged
    for p in parents:
      node = node[p]
    node[leaf] = given_flat[key]
  return merged


def fit_saved_mesh(config: ml_collections.ConfigDict, num_devices: int,
                   devices_per_process: int | None = None
                   ) -> ml_collections.ConfigDict:
  """The saved mesh if it tiles these devices, else all devices on 'data'.

  A model trained on a pod is often evaluated on a smaller machine: the
  training mesh says nothing about how to evaluate, so an unfit one is
  replaced rather than refused.

  Args:
    config: the saved run config.
    num_devices: devices in the job, over all hosts.
    devices_per_process: devices of each process, when there are several
      ('model' must fit inside one).
  """
  try:
    _, model = sharding.mesh_shape(config.mesh.data, config.mesh.model,
                                   num_devices)
    if devices_per_process is not None and devices_per_process < num_devices:
      sharding.check_model_within_process(model, devices_per_process)
    return config
  except UsageError:
    fitted = ml_collections.ConfigDict(config.to_dict())
    fitted.mesh.data, fitted.mesh.model = -1, 1
    return fitted


def check_resume_compatible(trained: dict, config: ml_collections.ConfigDict,
                            step: int) -> None:
  """Refuses to resume a checkpoint with a config that changes its meaning.

  Args:
    trained: the config saved in the checkpoint (as a plain dict).
    config: the config of this run.
    step: the checkpoint's step, for the message.

  Raises:
    UsageError: naming every differing key outside RESUME_SAFE_KEYS.
  """
  before = flatten(ml_collections.ConfigDict(_tuples(trained)))
  now = flatten(config)
  differing = sorted(k for k in before.keys() & now.keys()
                     if before[k] != now[k] and k not in RESUME_SAFE_KEYS)
  if differing:
    details = ', '.join(f'{k} (checkpoint {before[k]!r}, now {now[k]!r})'
                        for k in differing)
    raise UsageError(
        f'the checkpoint of step {step} was trained with a different config: '
        f'{details}; use a new --workdir for a new run, or restore those '
        f'values (only {", ".join(RESUME_SAFE_KEYS)} may change on resume)')
