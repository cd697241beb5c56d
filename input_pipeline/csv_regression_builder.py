"""The TFDS builder of dataset `csv_regression` (see csv_regression.py).

Kept apart from csv_regression.py so that using a prepared dataset never
imports TFDS: only `csv_regression.prepare` imports this module, and only when
it has a dataset to prepare. It imports nothing of csv_regression.py, which
imports it: its name and version are written out here too (a test checks
that they agree).

A user's CSV or Parquet tables, read and checked by `columns`: splits
`train` (the training file) and `test` (the evaluation file), rows in file
order; features `x` (F,) and `y` (T,), float32; the column names in the
metadata (`feature_names`, `target_names`).
"""

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from input_pipeline import columns, table_files


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


class CsvRegression(tfds.core.GeneratorBasedBuilder):
  """A user's CSV or Parquet tables; see `csv_regression.prepare`."""

  name = 'csv_regression'  # csv_regression.NAME
  VERSION = tfds.core.Version('1.0.0')  # csv_regression.VERSION
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}

  def __init__(self, *, tables: columns.TrainingTables | None = None,
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

  def _read_tables(self) -> columns.TrainingTables:
    config = self.builder_config
    if self._tables is None:
      self._tables = columns.read_training_tables(
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
