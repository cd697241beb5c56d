"""--mode=eval: a saved checkpoint's metrics on the eval split, and a figure;
for a run without an eval file, the estimate of its error it recorded."""

import hashlib
import json
import posixpath
import re

import jax
import ml_collections
import numpy as np

from meshfit import storage
from meshfit.input_pipeline.tables import Table
from meshfit import config as config_lib
from meshfit.checkpoints import reading
from meshfit.config import Config, json_files
from meshfit.data import splits as splits_lib
from meshfit.errors import UsageError
from meshfit.model import inference, optim
from meshfit.model.setup import Setup
from meshfit.model.state import TrainState
from meshfit.parallel import compilation_cache
from meshfit.report import plots, writers


def evaluate(config: ml_collections.ConfigDict | Config, workdir: str,
             step: int | None = None) -> dict[str, float | int | str]:
  """Evaluates a saved checkpoint on the eval split.

  Writes eval/step_N.json and eval/step_N_predictions.png (predicted against
  actual, and residuals); for a model that predicts a distribution, also
  eval/step_N_calibration.png (observed against nominal coverage). An eval
  file other than the run's own (`dataset.eval_path` overridden) gets names
  of its own, `step_N_<file>-<hash>`, so that it never replaces the run's.
  A user's run without an eval file (and none given) reports the estimate
  of its error its checkpoint recorded on the validation rows (out of fold
  with cross-fitting, else held out), marked by "split" and a "note", and
  draws no figure (the rows are not the checkpoint's to score again).

  Args:
    config: the run's saved config (evaluation keys may be overridden).
    workdir: the run's workdir.
    step: the checkpoint to evaluate; None takes the best by validation
      (when the run validated) or else the newest intact one.

  Returns:
    {"step", "split", "num_examples", "mse", "rmse", "mae", "r2",
    "targets": {name: {"mse", "rmse", "mae", "r2"}}}: overall values average
    the targets', each target's are in its own units. A gaussian model adds
    "nll" (per example, original units), "coverage_50", "coverage_90",
    "coverage_95" and "coverage" (every level); an ensemble of several
    members "members" (the weight and hyperparameters of those used); a
    model with ridge parts "ridge_weight" (their weight per target).
    The estimate has "split": "out_of_fold" or "held_out", and "note".

  Raises:
    UsageError: no such checkpoint; or, without an eval file, a checkpoint
      of a step that was not validated (it recorded no estimate).
  """
  config = config_lib.parse(config)
  config_lib.check_devices(config, jax.device_count())
  compilation_cache.configure(config.compilation_cache_dir)
  with reading.SavedModel(workdir, step) as saved:
    # The checkpoint's own record of its model decides, not config.json.
    config = saved.model_config(config)
    table = None
    if splits_lib.has_eval_split(config.dataset):
      table = splits_lib.load_eval_split(config.dataset, saved.plan)
    elif saved.estimate is None:
      raise UsageError(
          f'the run in {workdir} has no eval file, and the checkpoint of '
          f'step {saved.step} recorded no estimate of its error (those of '
          'the validated steps do: the best and the last); leave out --step '
          'for the best, or score a file with '
          '--config.dataset.eval_path=FILE')
    setup, state = saved.restore(config)
  step = saved.step
  result = (score(config, setup, state, table, step) if table is not None
            else _with_members(config, state, saved.estimate,
                               saved.plan.targets))
  name = output_name(config, workdir, step)
  eval_dir = storage.join(workdir, 'eval')
  created = not storage.exists(eval_dir)
  try:
    _write_outputs(config, workdir, name, result, setup, state, table, step)
  except BaseException:
    # An eval/ made for nothing: the run is left as it was.
    if (created and jax.process_index() == 0 and storage.isdir(eval_dir)
        and not storage.listdir(eval_dir)):
      storage.rmtree(eval_dir)
    raise
  return result


def _write_outputs(config: Config, workdir: str, name: str, result: dict,
                   setup: Setup, state: TrainState, table: Table | None,
                   step: int) -> None:
  """eval/<name>.json and, where asked, its figures."""
  if jax.process_index() == 0:
    storage.makedirs(storage.join(workdir, 'eval'))
    with storage.atomic_write(storage.join(workdir, 'eval',
                                           f'{name}.json')) as f:
      json.dump(writers.json_safe(result), f, indent=2)
      f.write('\n')
  if config.plots and table is not None:
    # Every process takes part in the predictions; process 0 draws them.
    pred_NxT = inference.predict_table(setup, state, table.x_NxF,
                                     config.eval_batch_size)['pred']
    if jax.process_index() == 0 and setup.distribution:
      levels = [float(level) for level in result['coverage']]
      plots.write_calibration_figure(
          storage.join(workdir, 'eval', f'{name}_calibration.png'),
          levels, np.array([[result['targets'][t]['coverage'][str(level)]
                             for t in table.target_names]
                            for level in levels]), table.target_names,
          title=f'{storage.basename(storage.absolute(workdir))}: step {step}, '
                f'interval coverage on {config.dataset.eval_split!r}')
    if jax.process_index() == 0:
      plots.write_predictions_figure(
          storage.join(workdir, 'eval', f'{name}_predictions.png'),
          table.y_NxT, pred_NxT, table.target_names,
          train_mean_T=(None if setup.arch.layout.scaling == 'none' else
                        np.asarray(jax.device_get(state.stats.y_mean_T))),
          title=(f'{storage.basename(storage.absolute(workdir))}: step {step}'
                 f', split {config.dataset.eval_split!r} of '
                 f'{config.dataset.name}'))


# The most characters of an eval file's name kept in eval/'s names for it.
STEM_CHARS = 64


def output_name(config: Config, workdir: str, step: int) -> str:
  """eval/'s name for this evaluation: `step_N` on the run's own eval
  file, `step_N_<file>-<hash of its path>` on another."""
  eval_path = config.dataset.eval_path
  try:
    own = json_files.load_json(storage.join(workdir, 'config.json'))
  except UsageError:  # no saved config: nothing of the run's to keep apart
    return f'step_{step}'
  if not eval_path or eval_path == own.dataset.eval_path:
    return f'step_{step}'
  # Cut short: the hash tells files apart, and a long file name plus the
  # prefix and the figures' suffixes must fit the file system's limit.
  stem = re.sub(r'[^A-Za-z0-9_.-]+', '_', posixpath.splitext(
      storage.basename(eval_path))[0])[:STEM_CHARS]
  digest = hashlib.sha256(storage.absolute(eval_path).encode()).hexdigest()
  return f'step_{step}_{stem}-{digest[:8]}'


def score(config: Config, setup: Setup, state: TrainState, table: Table,
          step: int) -> dict:
  """What `evaluate` reports of `state` on `table` (and writes to
  eval/step_N.json): metrics, and the members and ridge weights used."""
  result = {'step': step, 'split': config.dataset.eval_split,
            **({'eval_path': config.dataset.eval_path}
               if config.dataset.eval_path else {}),
            **inference.evaluate_table(setup, state, table,
                                       config.eval_batch_size)}
  return _with_members(config, state, result, table.target_names)


def _with_members(config: Config, state: TrainState, result: dict,
                  target_names: tuple[str, ...]) -> dict:
  """`result` with the members and ridge weights of `state` that made it."""
  result = dict(result)
  if state.num_members > 1:
    result['members'] = inference.members_summary(
        state, optim.Hyperparameters.of(config))
  weights = inference.ridge_weights(state, target_names)
  if weights is not None:
    result['ridge_weight'] = weights
  return result
