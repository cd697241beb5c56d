"""The run's tables: prepared once per job, then read by every process."""

import dataclasses
import os

import jax
from jax.experimental import multihost_utils

from input_pipeline import csv_regression, tables
from input_pipeline.errors import DataError
from input_pipeline.tables import Table
from meshfit.config import DatasetConfig


@dataclasses.dataclass(frozen=True)
class Splits:
  """The resident training and evaluation tables of a run."""
  train: Table
  eval: Table


def _prepare(dataset: DatasetConfig) -> str:
  """The prepared dataset's directory, preparing it first if needed."""
  data_dir = os.path.expanduser(dataset.data_dir)
  if dataset.name == csv_regression.NAME:
    tables.check_data_dir(data_dir)
    return csv_regression.prepare(
        os.path.expanduser(dataset.train_path),
        os.path.expanduser(dataset.eval_path), dataset.target_columns,
        dataset.feature_columns, data_dir)
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


def load_splits(dataset: DatasetConfig) -> Splits:
  """Reads the training and evaluation splits of `dataset` into memory."""
  directory = _prepared_dir(dataset)
  return Splits(train=tables.read_split(directory, dataset.train_split),
                eval=tables.read_split(directory, dataset.eval_split))


def load_eval_split(dataset: DatasetConfig) -> Table:
  """Reads only the evaluation split (evaluation mode)."""
  return tables.read_split(_prepared_dir(dataset), dataset.eval_split)
