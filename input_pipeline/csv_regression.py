"""Dataset `csv_regression`: a user's own CSV or Parquet tables, as TFDS data.

The config keys `dataset.train_path`, `dataset.eval_path`,
`dataset.target_columns` and `dataset.feature_columns` choose the data. They
become one `CsvRegressionConfig` (csv_regression_builder.py) whose name is a
sha256 of both files' bytes and the column selection, so the dataset is
prepared once into `<data_dir>/csv_regression/<key>/<version>/` and found
there again while the files are unchanged; a changed file (or selection) gets
a new key and is prepared afresh. Where the files live does not enter the key:
a moved file is still reused.

Splits: `train` (the training file) and `test` (the evaluation file), rows in
file order. Features: `x` (F,) and `y` (T,), float32. The column names are
stored in the dataset's metadata (`feature_names`, `target_names`).

The TFDS builder itself is in csv_regression_builder.py, imported only when
a dataset is prepared: finding one prepared needs no TFDS. (It does not
import this module; a test checks that their name and version agree.)
"""

import hashlib
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from absl import logging

from input_pipeline import columns, table_files

if TYPE_CHECKING:
  import tensorflow_datasets as tfds

NAME = 'csv_regression'
# The builder's version: the last part of each prepared dataset's directory.
VERSION = '1.0.0'
# Changing how files are parsed or what is stored must change the key.
_KEY_SCHEMA = 'meshfit.csv_regression/1'


def content_key(train_data: bytes, eval_data: bytes,
                target_columns: Sequence[str],
                feature_columns: Sequence[str]) -> str:
  """The builder config name for these file contents and this selection."""
  digest = hashlib.sha256()
  selection = json.dumps([_KEY_SCHEMA, list(target_columns),
                          list(feature_columns)])
  for part in (selection.encode(), train_data, eval_data):
    # Length prefixes: no two different inputs concatenate to the same bytes.
    digest.update(len(part).to_bytes(8, 'little'))
    digest.update(part)
  return f'sha256_{digest.hexdigest()[:32]}'


def builder_dir(data_dir: str, key: str) -> str:
  """Where the dataset of content key `key` is prepared."""
  return os.path.join(data_dir, NAME, key, VERSION)


def prepare(train_path: str, eval_path: str, target_columns: Sequence[str],
            feature_columns: Sequence[str], data_dir: str) -> str:
  """Where the dataset of these files is prepared, preparing it if needed.

  Args:
    train_path: CSV or Parquet training file with a header row.
    eval_path: CSV or Parquet evaluation file with the same columns.
    target_columns: one or more columns to predict.
    feature_columns: input columns; () means every other numeric column.
    data_dir: TFDS data directory; created if missing.

  Returns:
    The directory of the prepared dataset (for `tables.read_split`), with
    splits `train` and `test`; its metadata holds `feature_names` and
    `target_names`.

  Raises:
    DataError: a missing, unreadable or bad file (the message names the
      file, the column and the first bad row).
  """
  train_data = table_files.read_bytes(train_path, 'dataset.train_path')
  eval_data = table_files.read_bytes(eval_path, 'dataset.eval_path')
  key = content_key(train_data, eval_data, target_columns, feature_columns)
  directory = builder_dir(data_dir, key)
  # dataset_info.json is written last, when the split files are complete.
  if not os.path.exists(os.path.join(directory, 'dataset_info.json')):
    tables = columns.read_training_tables(
        (train_path, train_data), (eval_path, eval_data), target_columns,
        feature_columns)
    if tables.skipped_columns:
      logging.info('csv_regression: columns left out of the features (text '
                   'or unnamed): %s', ', '.join(tables.skipped_columns))
    logging.info('csv_regression: preparing %d train and %d test rows of %s '
                 'and %s into %s.', tables.x_train_NxF.shape[0],
                 tables.x_eval_NxF.shape[0], train_path, eval_path, directory)
    # Imported only here, to prepare: TFDS takes a while to import.
    import tensorflow_datasets as tfds  # noqa: PLC0415
    from input_pipeline.csv_regression_builder import (  # noqa: PLC0415
        CsvRegression, CsvRegressionConfig)
    config = CsvRegressionConfig(
        name=key, description=f'{train_path} and {eval_path}',
        train_path=os.path.abspath(train_path),
        eval_path=os.path.abspath(eval_path),
        feature_names=tables.feature_names,
        target_names=tables.target_names)
    builder = CsvRegression(config=config, data_dir=data_dir, tables=tables)
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return directory


def column_names(builder: 'tfds.core.DatasetBuilder'
                 ) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
  """(feature names, target names) of a prepared csv_regression dataset.

  Returns None for datasets that store no names (e.g. synthetic ones).
  """
  metadata = builder.info.metadata
  if not metadata or 'feature_names' not in metadata:
    return None
  return (tuple(metadata['feature_names']), tuple(metadata['target_names']))
