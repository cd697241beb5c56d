"""Which columns of a user's training and evaluation files a run uses.

The targets are named by the config; the features are named too, or are
every other numeric column of the training file. Both files must have the
same header. The result is two float32 tables with their column names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from input_pipeline import table_files
from input_pipeline.errors import DataError

if TYPE_CHECKING:
  import pandas as pd


@dataclasses.dataclass(frozen=True)
class TrainingTables:
  """Both files of a run, checked against each other, as float32 arrays."""
  x_train_NxF: np.ndarray
  y_train_NxT: np.ndarray
  x_eval_NxF: np.ndarray
  y_eval_NxT: np.ndarray
  feature_names: tuple[str, ...]
  target_names: tuple[str, ...]
  # Columns left out of a `()` feature selection: text or unnamed.
  skipped_columns: tuple[str, ...] = ()


def _auto_features(frame: pd.DataFrame, target_columns: Sequence[str]
                   ) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(every other numeric, named column; the columns left out)."""
  features, skipped = [], []
  for column in frame.columns:
    if column in target_columns:
      continue
    # pandas names a column with an empty header 'Unnamed: <i>': most often
    # an index written by DataFrame.to_csv, which must not become a feature.
    unnamed = not isinstance(column, str) or column.startswith('Unnamed: ')
    if unnamed or not table_files.looks_numeric(frame[column]):
      skipped.append(str(column))
    else:
      features.append(column)
  return tuple(features), tuple(skipped)


def read_training_tables(
    train: tuple[str, bytes], eval_: tuple[str, bytes],
    target_columns: Sequence[str], feature_columns: Sequence[str]
) -> TrainingTables:
  """Parses and checks the training and evaluation files of a run.

  Args:
    train: (path, bytes) of the training file (dataset.train_path).
    eval_: (path, bytes) of the evaluation file (dataset.eval_path).
    target_columns: one or more columns to predict.
    feature_columns: input columns; () takes every other numeric column of
      the training file (text columns and unnamed ones are left out).

  Returns:
    Both splits as float32 arrays with their column names.

  Raises:
    DataError: any problem with the selection or either file; see
      `table_files.parse` and `table_files.numeric_matrix`. (The selection
      itself is checked with the config: `meshfit.config`.)
  """
  (train_path, train_data), (eval_path, eval_data) = train, eval_
  sources = ('dataset.train_path', 'dataset.eval_path')
  train_name = table_files.describe(train_path, sources[0])
  train_frame = table_files.parse(train_data, train_path, sources[0])
  eval_frame = table_files.parse(eval_data, eval_path, sources[1])
  for column in (*target_columns, *feature_columns):
    if column not in train_frame.columns:
      key = ('dataset.target_columns' if column in target_columns
             else 'dataset.feature_columns')
      raise table_files.missing_column_error(
          train_frame, column, train_name, f' named in {key}')
  only_train = [c for c in train_frame.columns if c not in eval_frame.columns]
  only_eval = [c for c in eval_frame.columns if c not in train_frame.columns]
  if only_train or only_eval:
    parts = [f'only in the training file: {", ".join(map(str, cols))}'
             for cols in [only_train] if cols]
    parts += [f'only in the evaluation file: {", ".join(map(str, cols))}'
              for cols in [only_eval] if cols]
    raise DataError(
        f'{train_name} and {table_files.describe(eval_path, sources[1])} '
        'have different columns '
        f'({"; ".join(parts)}); give both files the same header')
  skipped = ()
  if not feature_columns:
    feature_columns, skipped = _auto_features(train_frame, target_columns)
    if not feature_columns:
      raise DataError(
          f'{train_name} has no numeric column besides the targets '
          f'{", ".join(target_columns)} to use as a feature; add one, or '
          'name the features in dataset.feature_columns')
  arrays = []
  for frame, path, source in ((train_frame, train_path, sources[0]),
                              (eval_frame, eval_path, sources[1])):
    for columns in (feature_columns, target_columns):
      arrays.append(table_files.numeric_matrix(frame, columns, path, source))
  return TrainingTables(*arrays, feature_names=tuple(feature_columns),
                        target_names=tuple(target_columns),
                        skipped_columns=skipped)
