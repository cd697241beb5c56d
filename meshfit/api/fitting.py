"""`fit` and `load`: a run trained or opened from Python, as train.py does."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence

import jax
import ml_collections

from meshfit import storage
from meshfit.api import console, settings
from meshfit.api.model import Model
from meshfit.checkpoints.held import HeldCheckpoints
from meshfit.errors import UsageError
from meshfit.report import progress
from meshfit.train import loop

# The dataset every table given to `fit` is read as.
TABLE_DATASET = 'csv_regression'


def fit(data: settings.Data, target: str | Sequence[str], *,
        eval_data: settings.Data | None = None, workdir: str | None = None,
        config: str | ml_collections.ConfigDict | Mapping | None = None,
        verbose: int = 1) -> Model:
  """Trains a model on a table, as `python train.py` does.

  Args:
    data: the training table: a pandas DataFrame (read exactly as the same
      frame written to Parquet), or CSV or Parquet files as
      dataset.train_path takes them (a path, a glob, several separated by
      commas, gs:// URLs).
    target: the column to predict, or a tuple of them.
    eval_data: a table to score the final model on (as dataset.eval_path);
      None: the run's out-of-fold error estimates it.
    workdir: where the run lives (config.json, checkpoints, metrics.jsonl),
      local or gs://; a run already there resumes, as train.py resumes it.
      None: a temporary directory, removed with the model unless
      `Model.save` keeps it; its checkpoints stay in memory until the
      model is saved, evaluated or exported.
    config: None for configs/csv.py's settings; a config file's path; a
      ConfigDict; or a dict of dotted keys over configs/csv.py, e.g.
      `{'model.hidden_sizes': (64, 64)}`. Checked as train.py checks it.
    verbose: 0 shows warnings only; 1 a progress display (step, time left,
      losses, best step) and meshfit's report lines; 2 also every logged
      scalar and the libraries' INFO logs.

  Returns:
    The trained model (the best step by validation, else the last).

  Raises:
    UsageError: a bad config, target or workdir (train.py's exit 2).
    DataError: a table that cannot be used.
    StorageError: storage out of reach.
    NonFiniteLossError: the loss diverged.
  """
  raw = settings.resolve_config(config)
  raw.dataset.name = TABLE_DATASET
  try:
    raw.dataset.target_columns = settings.targets_of(target)
  except TypeError as e:
    raise UsageError(f'target: {e}') from None
  raw.dataset.train_path = settings.path_of(data, raw.dataset.data_dir,
                                            'dataset.train_path')
  if eval_data is not None:
    raw.dataset.eval_path = settings.path_of(eval_data, raw.dataset.data_dir,
                                             'dataset.eval_path')
  owned = held = None
  if workdir is None:
    owned = tempfile.TemporaryDirectory(prefix='meshfit-')
    workdir = owned.name
    # Nothing resumes a temporary run: its checkpoints wait in memory
    # until the model is saved (several processes write theirs in step).
    if jax.process_count() == 1:
      held = HeldCheckpoints(workdir)
  else:
    workdir = _checked_workdir(workdir)
  try:
    with console.shown(verbose):
      loop.train_and_evaluate(raw, workdir, console=progress.Console(
          progress=verbose >= 1, log_scalars=verbose >= 2), held=held)
    return Model(workdir, owned=owned, held=held)
  except BaseException:
    if owned is not None:
      owned.cleanup()
    raise


def load(workdir: str, step: int | None = None) -> Model:
  """Opens a trained run: train.py's or `fit`'s, local or gs://.

  Args:
    workdir: the run's directory.
    step: the checkpoint to use; None takes the best by validation (when
      the run validated) or else the newest intact one, as --mode=predict.

  Raises:
    UsageError: no run in `workdir`, or no such (or an unreadable)
      checkpoint.
  """
  return Model(_checked_workdir(workdir), step)


def _checked_workdir(workdir: str) -> str:
  """`workdir` as a string, of a scheme storage reads."""
  workdir = str(workdir)
  try:
    storage.check_scheme(workdir)
  except storage.StorageError as e:
    raise UsageError(f'workdir: {e}') from None
  return workdir
