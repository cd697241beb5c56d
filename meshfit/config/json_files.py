"""The config saved with a run: config.json, eval overrides, resume checks.

A workdir saved before a key existed takes that key's default from
configs/default.py, and one saved with keys spelled the old way is read as
now (`spellings`).
"""

import json
from collections.abc import Iterable, Mapping
from typing import Any

import ml_collections

from meshfit import storage
from meshfit.configs import default
from meshfit.configs.settings import EVAL, INVOKER, RESUME
from meshfit.config import Config, spellings
from meshfit.errors import UsageError
from meshfit.parallel import sharding

# Keys that --mode=eval and --mode=predict may take from the command line:
# they change how a saved model is evaluated, not what it is.
EVAL_KEYS = tuple(s.key for s in default.SETTINGS
                  if s.changes in (EVAL, INVOKER))

# Keys of the invoking user's machine, never taken from a workdir (which
# may be shared): the compilation cache holds native code this process
# would load and run.
INVOKER_KEYS = tuple(s.key for s in default.SETTINGS if s.changes == INVOKER)

# Keys a resumed run may change: they decide how long and how observably it
# runs and where, not what the checkpointed state means.
RESUME_SAFE_KEYS = EVAL_KEYS + tuple(s.key for s in default.SETTINGS
                                     if s.changes == RESUME)

# Keys meshfit no longer has, each with the value that meant what meshfit
# now does without it: a checkpoint trained with another value holds a model
# this meshfit cannot restore.
REMOVED_KEYS = {'model.linear_head': False}


flatten = spellings.flatten


def _translated(saved: Mapping[str, Any]) -> dict[str, Any]:
  """A saved config (plain, nested) with its old keys read as now's."""
  flat = flatten(saved)
  if not spellings.has_old_keys(flat):
    return dict(saved)
  return spellings.unflatten(spellings.translate(flat)[0])


def _tuples(value):
  """JSON has no tuples; the config's sequences are tuples."""
  if isinstance(value, list):
    return tuple(_tuples(v) for v in value)
  if isinstance(value, dict):
    return {k: _tuples(v) for k, v in value.items()}
  return value


def save_json(config: Config, path: str) -> None:
  """Writes the resolved config (atomically)."""
  with storage.atomic_write(path) as f:
    json.dump(config.to_dict(), f, indent=2, sort_keys=True)
    f.write('\n')


def _with_defaults(saved: dict, defaults: dict) -> dict:
  """`saved`, plus the keys it lacks taken from `defaults` (recursively)."""
  merged = dict(saved)
  for key, value in defaults.items():
    if key not in merged:
      merged[key] = value
    elif isinstance(value, dict) and isinstance(merged[key], dict):
      merged[key] = _with_defaults(merged[key], value)
  return merged


def shape_error(raw: Any) -> str | None:
  """What keeps `raw` (a config read back from JSON) from being a config:
  not an object, or a section of configs/default.py that is not one; None
  when it has a config's shape."""
  if not isinstance(raw, dict):
    return f'it holds {json.dumps(raw)[:60]}, not an object of config keys'
  sections = default.get_config().to_dict()
  for key, value in sections.items():
    if isinstance(value, dict) and key in raw and not isinstance(raw[key],
                                                                 dict):
      return (f'its {key!r} is {json.dumps(raw[key])[:60]}, not an object of '
              f'the {key}.* keys')
  return None


def with_defaults(raw: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """A config read back from JSON (its sequences as tuples), with the keys
  added to configs/default.py since it was saved at their defaults."""
  return ml_collections.ConfigDict(_with_defaults(
      _translated(_tuples(dict(raw))), default.get_config().to_dict()))


def load_json(path: str) -> ml_collections.ConfigDict:
  """Reads a config written by `save_json`.

  Keys added to configs/default.py since the run was saved take their
  default values, and keys spelled the old way are read as now's
  (`spellings`), so a workdir from an older meshfit still evaluates.

  Raises:
    UsageError: the file is missing, not JSON or not a config.
  """
  try:
    raw = json.loads(storage.read_text(path))
  except (FileNotFoundError, NotADirectoryError):
    raise UsageError(f'{path} does not exist: this workdir holds no run; '
                     'train one first (python train.py --workdir=...)'
                     ) from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UsageError(f'{path} is not valid JSON ({e}); restore it or train '
                     'into a new workdir') from None
  if (problem := shape_error(raw)) is not None:
    raise UsageError(f'{path} is not a run\'s config: {problem}; restore '
                     'the file the run wrote, or train into a new workdir')
  return with_defaults(raw)


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
    A copy of `saved` with those keys, and INVOKER_KEYS, from `given`.

  Raises:
    UsageError: a key that changes the model or data would be overridden.
  """
  saved_flat = flatten(saved)
  given_flat, _ = spellings.translate(flatten(given))
  keys = {spellings.new_key(k) for k in keys}
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
  for key in sorted(set(changed) | set(INVOKER_KEYS)):
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
                                   num_devices, config.mesh.members)
    if devices_per_process is not None and devices_per_process < num_devices:
      sharding.check_model_within_process(model, devices_per_process)
    return config
  except UsageError:
    fitted = ml_collections.ConfigDict(config.to_dict())
    fitted.mesh.members, fitted.mesh.data, fitted.mesh.model = 1, -1, 1
    return fitted


def check_known_keys(trained: Mapping[str, Any], step: int, directory: str
                     ) -> None:
  """Refuses a checkpoint whose config sets keys this meshfit lacks (a
  removed feature in use, or a newer meshfit's).

  Args:
    trained: the config saved in the checkpoint (as a plain dict).
    step: the checkpoint's step, for the message.
    directory: where the checkpoints are, for the message.

  Raises:
    UsageError: naming every such key and its value.
  """
  known = flatten(default.get_config().to_dict())
  saved = flatten(_translated(_tuples(dict(trained))))
  unknown = sorted(k for k in saved.keys() - known.keys()
                   if k not in REMOVED_KEYS or saved[k] != REMOVED_KEYS[k])
  if unknown:
    details = ', '.join(f'{k}={saved[k]!r}' for k in unknown)
    raise UsageError(
        f'the checkpoint of step {step} in {directory} was trained with '
        f'{details}, which this meshfit does not have; use the meshfit that '
        'trained it, or train into a new --workdir')


def check_resume_compatible(trained: Mapping[str, Any], config: Config,
                            step: int) -> None:
  """Refuses to resume a checkpoint with a config that changes its meaning.

  Args:
    trained: the config saved in the checkpoint (as a plain dict).
    config: the config of this run.
    step: the checkpoint's step, for the message.

  Raises:
    UsageError: naming every differing key outside RESUME_SAFE_KEYS.
  """
  now = flatten(config.to_dict())
  # A checkpoint older than a key was trained as its default is now (keys
  # join configs/default.py with the value that does what meshfit did
  # before them): a run that sets another value is another model.
  before = flatten(_with_defaults(_translated(_tuples(dict(trained))),
                                  default.get_config().to_dict()))
  differing = sorted(k for k in before.keys() & now.keys()
                     if before[k] != now[k] and k not in RESUME_SAFE_KEYS)
  if differing:
    details = ', '.join(f'{k} (checkpoint {before[k]!r}, now {now[k]!r})'
                        for k in differing)
    raise UsageError(
        f'the checkpoint of step {step} was trained with a different config: '
        f'{details}; use a new --workdir for a new run, or restore those '
        f'values (only {", ".join(RESUME_SAFE_KEYS)} may change on resume)')
