"""Users' CSV and Parquet tables, read with every cell checked.

A file is Parquet when its name ends in `.parquet` or `.pq` and CSV (comma
separated, with a header row) otherwise. Every problem with a file's content
raises `DataError` naming the file and, where there is one, the column and
the first bad row. Rows are counted as *data rows*, 1-based, the header not
counted: data row 1 is the first row under the header (line 2 of a plain
CSV file).

pandas and pyarrow are imported by the functions that parse or write a file,
not with this module: they are slow to import, and a training run on an
already prepared dataset never parses a file.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from input_pipeline.errors import DataError

if TYPE_CHECKING:
  import pandas as pd

PARQUET_SUFFIXES = ('.parquet', '.pq')
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
  """The whole file, or DataError if it is missing or not a file.

  Args:
    path: the file.
    source: the setting or flag the path came from, named in messages.

  Returns:
    The file's bytes.
  """
  name = describe(path, source)
  if not path:
    raise DataError(f'no file given{f" for {source}" if source else ""}; '
                     'give the path of a CSV or Parquet file')
  if not os.path.exists(path):
    raise DataError(f'{name} does not exist; give the path of a CSV or '
                     'Parquet file with a header row')
  if not os.path.isfile(path):
    raise DataError(f'{name} is not a file; give the path of a CSV or '
                     'Parquet file with a header row')
  with open(path, 'rb') as f:
    return f.read()


def _duplicate_error(name: str, header: Sequence[object]) -> DataError | None:
  """An error for the first column name that the header repeats, if any."""
  first_seen = {}
  for i, column in enumerate(header):
    # Empty names are told apart by position ('Unnamed: <i>') instead.
    if isinstance(column, str) and column and column in first_seen:
      return DataError(
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
    raise DataError(f'{name} is empty; it needs a header row and at least '
                     'one data row') from None
  except (pd.errors.ParserError, pd.errors.ParserWarning, UnicodeDecodeError,
          ValueError) as e:
    raise DataError(f'{name} is not a readable CSV file ({_one_line(e)}); '
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
    raise DataError(f'{name} is empty; it needs at least one column and '
                     'one row')
  try:
    table = pq.read_table(io.BytesIO(data))
  except (pa.ArrowException, OSError) as e:
    raise DataError(f'{name} is not a readable Parquet file '
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
    DataError: the file is empty, has a header but no data rows, repeats a
      column name or cannot be parsed.
  """
  name = describe(path, source)
  frame = (_parse_parquet if is_parquet(path) else _parse_csv)(data, name)
  if frame.shape[1] == 0:
    raise DataError(f'{name} has no columns; it needs a header row')
  if frame.shape[0] == 0:
    raise DataError(f'{name} has a header row but no data rows')
  return frame


def read_frame(path: str, source: str = '') -> pd.DataFrame:
  """Reads a CSV or Parquet file; see `parse` for what is checked."""
  return parse(read_bytes(path, source), path, source)


def missing_column_error(frame: pd.DataFrame, column: str, name: str,
                          role: str) -> DataError:
  hint = ''
  if ',' in column:
    quoted = ', '.join(f'"{c.strip()}"' for c in column.split(','))
    hint = f" (to name several columns give a tuple, e.g. '({quoted})')"
  return DataError(
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
    DataError: a column is missing, or a cell is empty, NaN, infinite, not
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
      raise missing_column_error(frame, column, name, role)
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
    raise DataError(
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
    DataError: the file is unreadable, lacks one of `feature_names` (named)
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
    DataError: a column is missing or named twice.
  """
  name = describe(path, source)
  if (error := _duplicate_error(f'the columns to keep from {name}',
                                list(columns))) is not None:
    raise error
  for column in columns:
    if column not in frame.columns:
      raise missing_column_error(frame, column, name, ' (asked to keep it)')
  return frame[list(columns)].reset_index(drop=True)
