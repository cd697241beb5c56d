"""The run's tables: prepared once per job, then read by every process."""

import dataclasses
import os

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from input_pipeline import csv_regression, table_files, tables
from input_pipeline.column_plan import ColumnPlan
from input_pipeline.errors import DataError
from input_pipeline.tables import Table
from meshfit.config import DatasetConfig

# Mixed into the seed of the validation split, so that it is drawn apart
# from the epochs' orders (which use the seed itself).
_VALIDATION_STREAM = 0x5EED


@dataclasses.dataclass(frozen=True)
class Splits:
  """The resident tables of a run.

  Attributes:
    train: the rows to train on.
    eval: the evaluation split.
    validation: rows held out of the training split to pick the best step,
      or None without validation.
    train_key: names the training data's content; every checkpoint records
      it, and a run resumes only on the same data.
  """
  train: Table
  eval: Table
  validation: Table | None = None
  train_key: str = ''


def _prepare(dataset: DatasetConfig) -> str:
  """The prepared dataset's directory, preparing it first if needed."""
  data_dir = os.path.expanduser(dataset.data_dir)
  if dataset.name == csv_regression.NAME:
    tables.check_data_dir(data_dir)
    return csv_regression.prepare(
        os.path.expanduser(dataset.train_path),
        os.path.expanduser(dataset.eval_path), dataset.target_columns,
        dataset.feature_columns, dataset.categorical_columns, data_dir)
  return tables.prepare_generated(dataset.name, data_dir)


def _prepared_dir(dataset: DatasetConfig) -> str:
  """Prepares the dataset if needed (process 0 only; others wait for it).

  For csv_regression every process reads the files (to find their content
  key), so they must be readable from every host.
  """
  error = None
  if jax.process_index() == 0:
    try:
      _prepare(dataset)
    except DataError as e:
      # Raised after the barrier: the others would wait there forever.
      # They then find nothing prepared, read the same files and fail too.
      error = e
  if jax.process_count() > 1:
    # Every process writing the same files at once would corrupt them.
    multihost_utils.sync_global_devices('meshfit:prepare_dataset')
  if error is not None:
    raise error
  return _prepare(dataset)


def load_splits(dataset: DatasetConfig, seed: int) -> Splits:
  """Reads the training and evaluation splits of `dataset` into memory.

  With `dataset.validation_fraction`, that fraction of the training rows,
  drawn from `seed` (the same rows every run), is held out for validation.
  """
  directory = _prepared_dir(dataset)
  if dataset.name == csv_regression.NAME:
    train = csv_regression.read_split(directory, dataset.train_split)
    evaluation = csv_regression.read_split(directory, dataset.eval_split)
    key = csv_regression.manifest(directory)['train_key']
  else:
    train = tables.read_split(directory, dataset.train_split)
    evaluation = tables.read_split(directory, dataset.eval_split)
    key = f'{dataset.name}:{dataset.train_split}'
  validation = None
  if dataset.validation_fraction:
    train, validation = hold_out(train, dataset.validation_fraction, seed)
  return Splits(train, evaluation, validation, key)


def hold_out(table: Table, fraction: float, seed: int) -> tuple[Table, Table]:
  """(the rest, `fraction` of the rows drawn from `seed`), rows in order.

  Raises:
    DataError: too few rows to hold any out and keep some to train on.
  """
  n = table.num_examples
  held = int(round(fraction * n))
  if held < 1 or held >= n:
    raise DataError(f'the training split has {n} rows: too few to hold out '
                    f'{fraction:g} of them for validation and train on the '
                    'rest; give more rows or set dataset.validation_fraction=0')
  rng = np.random.Generator(np.random.Philox(key=[seed, _VALIDATION_STREAM]))
  chosen = np.zeros(n, bool)
  chosen[rng.permutation(n)[:held]] = True
  return table.rows(np.flatnonzero(~chosen)), table.rows(np.flatnonzero(chosen))


def load_eval_split(dataset: DatasetConfig,
                    plan: ColumnPlan | None = None) -> Table:
  """The evaluation split, encoded with a trained model's column plan.

  A user's evaluation file is read and encoded anew with the checkpoint's
  plan (never re-fit on a training file that may have changed since); rows
  without a target are left out, with a warning.
  """
  if dataset.name != csv_regression.NAME:
    return tables.read_split(_prepared_dir(dataset), dataset.eval_split)
  path = os.path.expanduser(dataset.eval_path)
  frame = table_files.read_frame(path, 'dataset.eval_path')
  x_NxF, unseen = plan.encode(frame, path, 'dataset.eval_path')
  y_NxT = plan.targets_of(frame, path, 'dataset.eval_path')
  keep = ~np.isnan(y_NxT).any(axis=1)
  if not keep.all():
    logging.warning('%d of the %d rows of %s have no %s and are left out of '
                    'the evaluation.', int((~keep).sum()), len(frame), path,
                    ' or '.join(plan.targets))
  if unseen:
    logging.warning('%s hold categories the training file did not have '
                    '(unknown to the model): %s.', path, ', '.join(
                        f'{c} ({n} rows)' for c, n in unseen.items()))
  return Table(x_NxF[keep], y_NxT[keep], plan)
