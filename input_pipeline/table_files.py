"""Users' CSV and Parquet tables: checked reading, and writing predictions.

A file is Parquet when its name ends in `.parquet` or `.pq` and CSV (comma
separated, with a header row) otherwise. Every problem with a file's content
raises `UsageError` naming the file and, where there is one, the column and
the first bad row. Rows are counted as *data rows*, 1-based, the header not
counted: data row 1 is the first row under the header (line 2 of a plain
CSV file).

pandas and pyarrow are imported by the functions that parse or write a file,
not with this module: they take about half a second to import, and a
training run on an already prepared dataset never parses a file.
"""

from __future__ import annotations

import dataclasses
import io
import os
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from meshfit.errors import UsageError

if TYPE_CHECKING:
  import pandas as pd

PARQUET_SUFFIXES = ('.parquet', '.pq')
# Appended to a target's name for its column in a predictions table.
PREDICTION_SUFFIX = '_pred'
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def is_parquet(path: str) -> bool:
  """Whether `path` is read and written as Parquet (else CSV)."""
  return path.lower().endswith(PARQUET_SUFFIXES)


def _one_line(error: Exception) -> str:
  """A library's message on one line: `train.py` prints a single error line."""
  return ' '.join(str(error).split())


def describe(path: str, source: str = '') -> str:
  """How messages name a file: its path, and the setting it came from."""
  return f'{path!r} ({source})' if source else repr(path)


def read_bytes(path: str, source: str = '') -> bytes:
  """The whole file, or UsageError if it is missing or not a file.

  Args:
    path: the file.
    source: the setting or flag the path came from, named in messages.

  Returns:
    The file's bytes.
  """
  name = describe(path, source)
  if not path:
    raise UsageError(f'no file given{f" for {source}" if source else ""}; '
                     'give the path of a CSV or Parquet file')
  if not os.path.exists(path):
    raise UsageError(f'{name} does not exist; give the path of a CSV or '
                     'Parquet file with a header row')
  if not os.path.isfile(path):
    raise UsageError(f'{name} is not a file; give the path of a CSV or '
                     'Parquet file with a header row')
  with open(path, 'rb') as f:
    return f.read()


def _duplicate_error(name: str, header: Sequence[object]) -> UsageError | None:
  """An error for the first column name that the header repeats, if any."""
  first_seen = {}
  for i, column in enumerate(header):
    # Empty names are told apart by position ('Unnamed: <i>') instead.
    if isinstance(column, str) and column and column in first_seen:
      return UsageError(
          f'{name} names column {column!r} twice (columns '
          f'{first_seen[column] + 1} and {i + 1} of the header); rename or '
          'remove one of them')
    first_seen.setdefault(column, i)
  return None


def _parse_csv(data: bytes, name: str) -> pd.DataFrame:
  import pandas as pd  # noqa: PLC0415  (see the module doc)
  # skipinitialspace: "a, b" headers and values are common in hand-made
  # files. index_col=False: rows with one field more than the header would
  # otherwise silently shift every column onto the first one as an index.
  options = dict(skipinitialspace=True, index_col=False)
  try:
    with warnings.catch_warnings():
      # The warning for rows longer than the header: data would be dropped.
      warnings.simplefilter('error', pd.errors.ParserWarning)
      # pandas renames a repeated column 'a' to 'a.1'; read the header raw.
      header = pd.read_csv(io.BytesIO(data), header=None, nrows=1, dtype=str,
                           keep_default_na=False, **options).iloc[0].tolist()
      frame = pd.read_csv(io.BytesIO(data), **options)
  except pd.errors.EmptyDataError:
    raise UsageError(f'{name} is empty; it needs a header row and at least '
                     'one data row') from None
  except (pd.errors.ParserError, pd.errors.ParserWarning, UnicodeDecodeError,
          ValueError) as e:
    raise UsageError(f'{name} is not a readable CSV file ({_one_line(e)}); '
                     'check that every row has as many comma-separated '
                     'fields as the header, or name a Parquet file .parquet'
                     ) from None
  if (error := _duplicate_error(name, header)) is not None:
    raise error
  return frame


def _parse_parquet(data: bytes, name: str) -> pd.DataFrame:
  import pyarrow as pa  # noqa: PLC0415  (see the module doc)
  import pyarrow.parquet as pq  # noqa: PLC0415
  if not data:
    raise UsageError(f'{name} is empty; it needs at least one column and '
                     'one row')
  try:
    table = pq.read_table(io.BytesIO(data))
  except (pa.ArrowException, OSError) as e:
    raise UsageError(f'{name} is not a readable Parquet file '
                     f'({_one_line(e)}); write it again, or name a CSV file '
                     '.csv') from None
  if (error := _duplicate_error(name, table.column_names)) is not None:
    raise error
  return table.to_pandas()


def parse(data: bytes, path: str, source: str = '') -> pd.DataFrame:
  """Parses a file's bytes into a frame whose columns are the header's names.

  Args:
    data: the file's content, as returned by `read_bytes`.
    path: the file's name: decides CSV or Parquet and is named in messages.
    source: the setting or flag the path came from, named in messages.

  Returns:
    One frame row per data row, in file order, columns as in the file.

  Raises:
    UsageError: the file is empty, has a header but no data rows, repeats a
      column name or cannot be parsed.
  """
  name = describe(path, source)
  frame = (_parse_parquet if is_parquet(path) else _parse_csv)(data, name)
  if frame.shape[1] == 0:
    raise UsageError(f'{name} has no columns; it needs a header row')
  if frame.shape[0] == 0:
    raise UsageError(f'{name} has a header row but no data rows')
  return frame


def read_frame(path: str, source: str = '') -> pd.DataFrame:
  """Reads a CSV or Parquet file; see `parse` for what is checked."""
  return parse(read_bytes(path, source), path, source)


def _missing_column_error(frame: pd.DataFrame, column: str, name: str,
                          role: str) -> UsageError:
  hint = ''
  if ',' in column:
    quoted = ', '.join(f'"{c.strip()}"' for c in column.split(','))
    hint = f" (to name several columns give a tuple, e.g. '({quoted})')"
  return UsageError(
      f'{name} has no column {column!r}{role}{hint}; its columns are: '
      f'{", ".join(map(str, frame.columns))}')


def _is_number_dtype(values: pd.Series) -> bool:
  import pandas as pd  # noqa: PLC0415  (see the module doc)
  return bool(pd.api.types.is_bool_dtype(values)
              or pd.api.types.is_numeric_dtype(values))


def _as_numbers(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
  """(float64 values, which cells hold something that is not a number)."""
  import pandas as pd  # noqa: PLC0415  (see the module doc)
  if _is_number_dtype(values):
    numbers = values.to_numpy(np.float64, na_value=np.nan)
    return numbers, np.zeros(len(values), bool)
  numbers = pd.to_numeric(values, errors='coerce').to_numpy(
      np.float64, na_value=np.nan)
  # Coercion turns both text and empty cells into NaN; only text is "not a
  # number", empty cells are reported as missing.
  return numbers, np.isnan(numbers) & values.notna().to_numpy()


def looks_numeric(values: pd.Series) -> bool:
  """Numbers, or text of which at least one cell reads as a number.

  A text column with one typo among its numbers counts as numeric, so the
  typo is reported instead of the column being silently left out.
  """
  if _is_number_dtype(values):
    return True
  numbers, _ = _as_numbers(values)
  return bool(np.isfinite(numbers).any())


def numeric_matrix(frame: pd.DataFrame, columns: Sequence[str], path: str,
                   source: str = '', role: str = '') -> np.ndarray:
  """The named columns as float32, every value checked.

  Args:
    frame: a frame from `read_frame` / `parse`.
    columns: column names, in the order of the result's columns; other
      columns of the frame are ignored.
    path: the file the frame came from, named in messages.
    source: the setting or flag the path came from, named in messages.
    role: what the columns are, for the missing-column message (e.g.
      'a feature the model was trained on').

  Returns:
    matrix_NxC, float32, rows in file order.

  Raises:
    UsageError: a column is missing, or a cell is empty, NaN, infinite, not
      a number or beyond float32; the message names the column and the first
      bad data row (1-based, header not counted) over all `columns`.
  """
  name = describe(path, source)
  role = f' ({role})' if role else ''
  n = frame.shape[0]
  matrix_NxC = np.empty((n, len(columns)), np.float32)
  first_bad = None  # (row, column index, problem, bad cells in column)
  for c, column in enumerate(columns):
    if column not in frame.columns:
      raise _missing_column_error(frame, column, name, role)
    values = frame[column]
    numbers, not_number = _as_numbers(values)
    bad = not_number | ~np.isfinite(numbers) | (
        np.abs(numbers) > _FLOAT32_MAX)
    if bad.any():
      row = int(np.argmax(bad))
      if first_bad is None or row < first_bad[0]:
        cell = values.iloc[row]
        if not_number[row]:
          problem = f'{cell!r} is not a number'
        elif np.isnan(numbers[row]):
          problem = 'the value is missing (empty or NaN)'
        elif np.isinf(numbers[row]):
          problem = f'{numbers[row]:g} is not a finite number'
        else:
          problem = f'{numbers[row]:g} is too large for float32'
        first_bad = (row, c, problem, int(bad.sum()))
      continue
    matrix_NxC[:, c] = numbers
  if first_bad is not None:
    row, c, problem, count = first_bad
    more = f' ({count} bad values in this column)' if count > 1 else ''
    raise UsageError(
        f'{name}, column {columns[c]!r}, data row {row + 1} (1-based, header '
        f'not counted): {problem}{more}; fix or remove that row')
  return matrix_NxC


def read_features(path: str, feature_names: Sequence[str],
                  source: str = '') -> np.ndarray:
  """The feature matrix for a trained model's `feature_names`.

  Args:
    path: a CSV or Parquet file; extra columns are ignored.
    feature_names: the columns to read, in the model's order.
    source: the flag the path came from (e.g. '--input'), named in messages.

  Returns:
    x_NxF, float32, rows in file order.

  Raises:
    UsageError: the file is unreadable, lacks one of `feature_names` (named)
      or holds a bad value in one of them.
  """
  return numeric_matrix(read_frame(path, source), feature_names, path, source,
                        role='a feature the model was trained on')


def pass_through(frame: pd.DataFrame, columns: Sequence[str], path: str,
                 source: str = '') -> pd.DataFrame:
  """Columns to copy unchanged into a predictions table (ids, keys, ...).

  Args:
    frame: a frame from `read_frame` / `parse`.
    columns: the names to keep, in output order; any dtype.
    path: the file the frame came from, named in messages.
    source: the setting or flag the path came from, named in messages.

  Returns:
    Those columns, rows in file order, with a fresh 0..N-1 index.

  Raises:
    UsageError: a column is missing or named twice.
  """
  name = describe(path, source)
  if (error := _duplicate_error(f'the columns to keep from {name}',
                                list(columns))) is not None:
    raise error
  for column in columns:
    if column not in frame.columns:
      raise _missing_column_error(frame, column, name, ' (asked to keep it)')
  return frame[list(columns)].reset_index(drop=True)


def prediction_columns(target_names: Sequence[str]) -> list[str]:
  """`<target>_pred`, one per target."""
  return [f'{t}{PREDICTION_SUFFIX}' for t in target_names]


def write_predictions(path: str, pred_NxT: np.ndarray,
                      target_names: Sequence[str],
                      keep: pd.DataFrame | None = None) -> None:
  """Writes one row per input row: kept columns, then `<target>_pred`.

  Written to a temporary file and renamed, so `path` never holds half a
  table. Floats are written at full precision: reading the file back gives
  the same float32 values.

  Args:
    path: output file; Parquet for `.parquet` / `.pq`, else CSV.
    pred_NxT: predictions in the targets' original units, rows in input
      order.
    target_names: the T target names.
    keep: pass-through columns from `pass_through`, N rows, or None.

  Raises:
    UsageError: a kept column has the name of a prediction column, or the
      output directory does not exist.
    ValueError: the shapes of `pred_NxT`, `target_names` and `keep` disagree.
  """
  import pandas as pd  # noqa: PLC0415  (see the module doc)
  if pred_NxT.ndim != 2 or pred_NxT.shape[1] != len(target_names):
    raise ValueError(f'pred_NxT has shape {pred_NxT.shape} for '
                     f'{len(target_names)} targets')
  keep = pd.DataFrame() if keep is None else keep
  if len(keep.columns) and len(keep) != pred_NxT.shape[0]:
    raise ValueError(f'{len(keep)} kept rows for {pred_NxT.shape[0]} '
                     'predictions')
  names = prediction_columns(target_names)
  clash = sorted(set(names) & set(keep.columns))
  if clash:
    raise UsageError(f'cannot keep column(s) {", ".join(clash)}: the '
                     'predictions table writes its own column of that name; '
                     'keep other columns')
  directory = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(directory):
    raise UsageError(f'cannot write {path!r}: directory {directory!r} does '
                     'not exist; create it first')
  predictions = pd.DataFrame(
      {n: pred_NxT[:, t] for t, n in enumerate(names)})
  table = pd.concat([keep.reset_index(drop=True), predictions], axis=1)
  tmp = f'{path}.tmp'
  if is_parquet(path):
    table.to_parquet(tmp, index=False, engine='pyarrow')
  else:
    table.to_csv(tmp, index=False)
  os.replace(tmp, path)


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


def check_column_selection(target_columns: Sequence[str],
                           feature_columns: Sequence[str]) -> None:
  """Targets given, no name twice, no target among the features.

  Raises:
    UsageError: naming the offending column and the setting to fix.
  """
  if not target_columns:
    raise UsageError('dataset.target_columns is empty; name the column(s) to '
                     "predict, e.g. --config.dataset.target_columns='(\"y\",)'")
  for key, columns in (('dataset.target_columns', target_columns),
                       ('dataset.feature_columns', feature_columns)):
    for column in columns:
      if not isinstance(column, str) or not column:
        raise UsageError(f'{key} holds {column!r}; give column names as '
                         'non-empty strings')
      if list(columns).count(column) > 1:
        raise UsageError(f'{key} names column {column!r} twice; name it once')
  both = [c for c in target_columns if c in feature_columns]
  if both:
    raise UsageError(
        f'column {both[0]!r} is both a target (dataset.target_columns) and a '
        'feature (dataset.feature_columns); a model cannot take its own '
        'answer as input: remove it from dataset.feature_columns')


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
    if unnamed or not looks_numeric(frame[column]):
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
    UsageError: any problem with the selection or either file; see
      `parse`, `numeric_matrix` and `check_column_selection`.
  """
  check_column_selection(target_columns, feature_columns)
  (train_path, train_data), (eval_path, eval_data) = train, eval_
  sources = ('dataset.train_path', 'dataset.eval_path')
  train_frame = parse(train_data, train_path, sources[0])
  eval_frame = parse(eval_data, eval_path, sources[1])
  for column in (*target_columns, *feature_columns):
    if column not in train_frame.columns:
      key = ('dataset.target_columns' if column in target_columns
             else 'dataset.feature_columns')
      raise _missing_column_error(train_frame, column,
                                  describe(train_path, sources[0]),
                                  f' named in {key}')
  only_train = [c for c in train_frame.columns if c not in eval_frame.columns]
  only_eval = [c for c in eval_frame.columns if c not in train_frame.columns]
  if only_train or only_eval:
    parts = [f'only in the training file: {", ".join(map(str, cols))}'
             for cols in [only_train] if cols]
    parts += [f'only in the evaluation file: {", ".join(map(str, cols))}'
              for cols in [only_eval] if cols]
    raise UsageError(
        f'{describe(train_path, sources[0])} and '
        f'{describe(eval_path, sources[1])} have different columns '
        f'({"; ".join(parts)}); give both files the same header')
  skipped = ()
  if not feature_columns:
    feature_columns, skipped = _auto_features(train_frame, target_columns)
    if not feature_columns:
      raise UsageError(
          f'{describe(train_path, sources[0])} has no numeric column besides '
          f'the targets {", ".join(target_columns)} to use as a feature; add '
          'one, or name the features in dataset.feature_columns')
  arrays = []
  for frame, path, source in ((train_frame, train_path, sources[0]),
                              (eval_frame, eval_path, sources[1])):
    arrays.append(numeric_matrix(frame, feature_columns, path, source))
    arrays.append(numeric_matrix(frame, target_columns, path, source))
  return TrainingTables(*arrays, feature_names=tuple(feature_columns),
                        target_names=tuple(target_columns),
                        skipped_columns=skipped)
