"""TFDS builder `csv_regression`: a user's own CSV or Parquet tables.

The config keys `dataset.train_path`, `dataset.eval_path`,
`dataset.target_columns` and `dataset.feature_columns` choose the data. They
become one `CsvRegressionConfig` whose name is a sha256 of both files' bytes
and the column selection, so the dataset is prepared once into
`<data_dir>/csv_regression/<key>/<version>/` and found there again while the
files are unchanged; a changed file (or selection) gets a new key and is
prepared afresh. Where the files live does not enter the key: a moved file is
still reused.

Splits: `train` (the training file) and `test` (the evaluation file), rows in
file order. Features: `x` (F,) and `y` (T,), float32. The column names are
stored in the dataset's metadata (`feature_names`, `target_names`).
"""

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence

import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from input_pipeline import table_files
from meshfit.errors import UsageError

NAME = 'csv_regression'
# Changing how files are parsed or what is stored must change the key.
_KEY_SCHEMA = 'meshfit.csv_regression/1'


@dataclasses.dataclass
class CsvRegressionConfig(tfds.core.BuilderConfig):
  """One pair of files and a column selection, named by their content key.

  Attributes:
    train_path: the training file (split `train`).
    eval_path: the evaluation file (split `test`).
    feature_names: the F feature columns, resolved (never empty).
    target_names: the T target columns.
  """

  train_path: str = ''
  eval_path: str = ''
  feature_names: tuple[str, ...] = ()
  target_names: tuple[str, ...] = ()


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


class CsvRegression(tfds.core.GeneratorBasedBuilder):
  """A user's CSV or Parquet tables; see `prepare` and the module doc."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}

  def __init__(self, *, tables: table_files.TrainingTables | None = None,
               **kwargs):
    """Builds the builder of one `CsvRegressionConfig`.

    Args:
      tables: the config's files, already read and checked; None reads them
        again from the config's paths when the dataset is prepared.
      **kwargs: for `tfds.core.DatasetBuilder`; `config` is required.
    """
    # `prepare` hands in what it read to compute the key: reading the files
    # again could see other bytes than the key was made from.
    self._tables = tables
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    config = self.builder_config
    if config is None:
      raise ValueError('csv_regression needs a CsvRegressionConfig; use '
                       'csv_regression.prepare()')
    return self.dataset_info_from_configs(
        description=__doc__,
        features=tfds.features.FeaturesDict({
            'x': tfds.features.Tensor(shape=(len(config.feature_names),),
                                      dtype=np.float32),
            'y': tfds.features.Tensor(shape=(len(config.target_names),),
                                      dtype=np.float32),
        }),
        supervised_keys=('x', 'y'),
        # Rows stay in file order, so split `test` lines up with its file.
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict(
            feature_names=list(config.feature_names),
            target_names=list(config.target_names),
            train_path=config.train_path,
            eval_path=config.eval_path,
        ),
    )

  def _read_tables(self) -> table_files.TrainingTables:
    config = self.builder_config
    if self._tables is None:
      self._tables = table_files.read_training_tables(
          (config.train_path, table_files.read_bytes(config.train_path)),
          (config.eval_path, table_files.read_bytes(config.eval_path)),
          config.target_names, config.feature_names)
    return self._tables

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Local files only; nothing to download.
    tables = self._read_tables()
    return {
        'train': self._generate_examples(tables.x_train_NxF,
                                         tables.y_train_NxT),
        'test': self._generate_examples(tables.x_eval_NxF, tables.y_eval_NxT),
    }

  def _generate_examples(self, x_NxF: np.ndarray, y_NxT: np.ndarray):
    for i in range(x_NxF.shape[0]):
      yield i, {'x': x_NxF[i], 'y': y_NxT[i]}


def builder_dir(data_dir: str, key: str) -> str:
  """Where the dataset of content key `key` is prepared."""
  return os.path.join(data_dir, NAME, key, str(CsvRegression.VERSION))


def prepare(train_path: str, eval_path: str, target_columns: Sequence[str],
            feature_columns: Sequence[str],
            data_dir: str) -> tfds.core.DatasetBuilder:
  """Returns the prepared dataset of these files, preparing it if needed.

  Args:
    train_path: CSV or Parquet training file with a header row.
    eval_path: CSV or Parquet evaluation file with the same columns.
    target_columns: one or more columns to predict.
    feature_columns: input columns; () means every other numeric column.
    data_dir: TFDS data directory; created if missing.

  Returns:
    A builder read from the prepared directory, with splits `train` and
    `test`; `info.metadata` holds `feature_names` and `target_names`.

  Raises:
    UsageError: bad selection, or a missing, unreadable or bad file (the
      message names the file, the column and the first bad row).
  """
  table_files.check_column_selection(target_columns, feature_columns)
  train_data = table_files.read_bytes(train_path, 'dataset.train_path')
  eval_data = table_files.read_bytes(eval_path, 'dataset.eval_path')
  key = content_key(train_data, eval_data, target_columns, feature_columns)
  directory = builder_dir(data_dir, key)
  # dataset_info.json is written last, when the split files are complete.
  if not os.path.exists(os.path.join(directory, 'dataset_info.json')):
    tables = table_files.read_training_tables(
        (train_path, train_data), (eval_path, eval_data), target_columns,
        feature_columns)
    if tables.skipped_columns:
      logging.info('csv_regression: columns left out of the features (text '
                   'or unnamed): %s', ', '.join(tables.skipped_columns))
    logging.info('csv_regression: preparing %d train and %d test rows of %s '
                 'and %s into %s.', tables.x_train_NxF.shape[0],
                 tables.x_eval_NxF.shape[0], train_path, eval_path, directory)
    config = CsvRegressionConfig(
        name=key, description=f'{train_path} and {eval_path}',
        train_path=os.path.abspath(train_path),
        eval_path=os.path.abspath(eval_path),
        feature_names=tables.feature_names,
        target_names=tables.target_names)
    builder = CsvRegression(config=config, data_dir=data_dir, tables=tables)
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  try:
    return tfds.builder_from_directory(directory)
  except Exception as e:  # A damaged directory; its contents vary.
    raise UsageError(f'cannot read the prepared dataset in {directory!r} '
                     f'({type(e).__name__}: {e}); delete that directory and '
                     'run again to prepare it afresh') from e


def column_names(builder: tfds.core.DatasetBuilder
                 ) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
  """(feature names, target names) of a prepared csv_regression dataset.

  Returns None for datasets that store no names (e.g. synthetic ones).
  """
  metadata = builder.info.metadata
  if not metadata or 'feature_names' not in metadata:
    return None
  return (tuple(metadata['feature_names']), tuple(metadata['target_names']))
