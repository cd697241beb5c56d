"""TFDS builders and the loader that turns a split into global, sharded batches."""

import dataclasses
import os

import jax
import ml_collections
from jax.experimental import multihost_utils

# Importing a builder module registers it with TFDS.
from input_pipeline import synthetic_regression  # noqa: F401
from input_pipeline import tables
from input_pipeline.tables import Table


@dataclasses.dataclass(frozen=True)
class Splits:
  """The resident training and evaluation tables of a run."""
  train: Table
  eval: Table


def _prepared_builder(dataset: ml_collections.ConfigDict):
  """Prepares the dataset if needed (process 0 only; others wait for it)."""
  data_dir = os.path.expanduser(dataset.data_dir)
  if jax.process_index() == 0:
    tables.prepare(dataset.name, data_dir)
  if jax.process_count() > 1:
    # Every process writing the same files at once would corrupt them.
    multihost_utils.sync_global_devices('meshfit:prepare_dataset')
  return tables.prepare(dataset.name, data_dir)


def load_splits(dataset: ml_collections.ConfigDict) -> Splits:
  """Reads the training and evaluation splits of `dataset` into memory."""
  builder = _prepared_builder(dataset)
  return Splits(train=tables.load_table(builder, dataset.train_split),
                eval=tables.load_table(builder, dataset.eval_split))


def load_eval_split(dataset: ml_collections.ConfigDict) -> Table:
  """Reads only the evaluation split (evaluation mode)."""
  return tables.load_table(_prepared_builder(dataset), dataset.eval_split)
