"""Users' CSV and Parquet tables: reading them, checked.

A file is Parquet when its name ends in `.parquet` or `.pq` and CSV (a header
row; fields separated by commas, semicolons, tabs or bars, detected from the
header: csv_text.py reads a CSV file's dialect) otherwise. Every problem with
a file raises `DataError` naming the file and, where there is one, the column
and the first bad row (what a cell may hold is the column plan's to check:
column_plan.py). Rows are counted as *data rows*, 1-based, the header not
counted: data row 1 is the first row under the header (line 2 of a plain CSV
file).

A path may be local or a gs:// URL: files are read through the `storage`
layer, a large one in pieces (ranged reads on gs://), never downloaded whole
to be parsed a chunk at a time.

pandas and pyarrow are imported by the functions that parse or write a file,
not with this module: they are slow to import, and a training run on an
already prepared dataset never parses a file.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import gzip
import io
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from meshfit import storage
from meshfit.input_pipeline import cells, csv_text
from meshfit.input_pipeline.errors import DataError, one_line
from meshfit.input_pipeline.paths import named

if TYPE_CHECKING:
  import pandas as pd

PARQUET_SUFFIXES = ('.parquet', '.pq')


def is_parquet(path: str) -> bool:
  """Whether `path` is read and written as Parquet (else CSV)."""
  return path.lower().endswith(PARQUET_SUFFIXES)


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
  check_file(path, source)
  with storage.open(path, 'rb') as f:
    return f.read()


def _unreachable(path: str) -> str | None:
  """Why a local path that does not exist cannot be reached, if it is
  something (a loop of symbolic links); None otherwise."""
  if storage.is_remote(path):
    return None
  try:
    storage.open(path, 'rb').close()
  except OSError as e:
    if e.errno == errno.ELOOP:
      return ('is a loop of symbolic links (each names another, none a '
              'file); point the link at the file')
  return None


def check_file(path: str, source: str = '') -> None:
  """DataError unless `path` names an existing file (`read_bytes`'s).

  Also for what the storage layer refuses (an unknown URL scheme, a bucket
  that does not exist), the message naming `source`.
  """
  name = describe(path, source)
  if not path:
    raise DataError(f'no file given{f" for {source}" if source else ""}; '
                     'give the path of a CSV or Parquet file')
  with named(source):
    # One request on gs:// when it is a file, the usual case.
    is_file = storage.isfile(path)
    missing = not is_file and not storage.exists(path)
  if missing and (why := _unreachable(path)) is not None:
    raise DataError(f'{name} {why}')
  if missing:
    raise DataError(f'{name} does not exist; give the path of a CSV or '
                     'Parquet file with a header row')
  if not is_file:
    raise DataError(f'{name} is not a file; give the path of a CSV or '
                     'Parquet file with a header row')


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
  data = csv_text.csv_bytes(data, name)
  delimiter = csv_text.detect_delimiter(data)
  options = csv_text.csv_options(delimiter)
  try:
    with warnings.catch_warnings():
      # The warning for rows longer than the header: data would be dropped.
      warnings.simplefilter('error', pd.errors.ParserWarning)
      # pandas renames a repeated column 'a' to 'a.1'; read the header raw.
      header = pd.read_csv(io.BytesIO(data), header=None, nrows=1, dtype=str,
                           **options).iloc[0].tolist()
      frame = pd.read_csv(io.BytesIO(data), na_values=csv_text.NA_VALUES,
                          **options)
  except pd.errors.EmptyDataError:
    raise DataError(f'{name} is empty; it needs a header row and at least '
                     'one data row') from None
  except UnicodeDecodeError:
    raise csv_text.not_utf8(name, iter([data])) from None
  except (pd.errors.ParserError, pd.errors.ParserWarning, ValueError) as e:
    separated = {',': 'comma', ';': 'semicolon', '\t': 'tab',
                 '|': 'bar'}[delimiter]
    raise DataError(f'{name} is not a readable CSV file ({one_line(e)}); '
                     f'check that every row has as many {separated}-separated '
                     'fields as the header, or name a Parquet file .parquet'
                     ) from None
  if (error := _duplicate_error(name, header)) is not None:
    raise error
  return csv_text.marked(frame, delimiter)


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
                     f'({one_line(e)}); write it again, or name a CSV file '
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


def iter_frames(path: str, source: str, chunk_rows: int
                ) -> Iterator[tuple[pd.DataFrame, int]]:
  """A file's rows in frames of up to `chunk_rows`, never the whole file.

  Checked as `parse` checks a whole file (the same messages).

  Yields:
    (frame, the data row index of its first row, 0-based).
  """
  name = describe(path, source)
  check_file(path, source)
  frames = (_parquet_frames if is_parquet(path) else _csv_frames)(
      path, name, chunk_rows)
  first = 0
  columns = None
  for frame in frames:
    if columns is None:
      columns = frame.shape[1]
      if columns == 0:
        raise DataError(f'{name} has no columns; it needs a header row')
    if len(frame):
      yield frame, first
      first += len(frame)
  if not first:
    raise DataError(f'{name} has a header row but no data rows')


def _csv_frames(path: str, name: str, chunk_rows: int
                ) -> Iterator[pd.DataFrame]:
  import pandas as pd  # noqa: PLC0415  (see the module doc)
  with csv_text.open_csv(path, name) as f:
    head = f.read(1 << 16)
  if not head.strip():
    raise DataError(f'{name} is empty; it needs a header row and at least '
                     'one data row')
  delimiter = csv_text.detect_delimiter(head)
  options = csv_text.csv_options(delimiter)
  separated = {',': 'comma', ';': 'semicolon', '\t': 'tab',
               '|': 'bar'}[delimiter]
  errors = (pd.errors.ParserError, pd.errors.ParserWarning, ValueError)
  try:
    with warnings.catch_warnings():
      warnings.simplefilter('error', pd.errors.ParserWarning)
      with csv_text.open_csv(path, name) as f:
        header = pd.read_csv(f, header=None, nrows=1, dtype=str,
                             **options).iloc[0].tolist()
      if (error := _duplicate_error(name, header)) is not None:
        raise error
      # On gs:// a buffered file of sequential ranged reads: the file
      # streams through, as a local one does.
      with csv_text.open_csv(path, name) as f, pd.read_csv(
          f, na_values=csv_text.NA_VALUES, chunksize=chunk_rows,
          **options) as reader:
        for frame in reader:
          yield csv_text.marked(frame, delimiter)
  except pd.errors.EmptyDataError:
    raise DataError(f'{name} is empty; it needs a header row and at least '
                     'one data row') from None
  except UnicodeDecodeError:
    raise csv_text.not_utf8(name, csv_text.read_in_pieces(path, name)) from None
  except (gzip.BadGzipFile, EOFError) as e:
    raise DataError(f'{name} is not a readable gzip file ({one_line(e)}); '
                    'compress it again, or give it uncompressed') from None
  except errors as e:
    raise DataError(f'{name} is not a readable CSV file ({one_line(e)}); '
                     f'check that every row has as many {separated}-separated '
                     'fields as the header, or name a Parquet file .parquet'
                     ) from None


def _parquet_frames(path: str, name: str, chunk_rows: int
                    ) -> Iterator[pd.DataFrame]:
  import pyarrow as pa  # noqa: PLC0415  (see the module doc)
  import pyarrow.parquet as pq  # noqa: PLC0415
  remote = storage.is_remote(path)
  try:
    if not storage.size(path):
      raise DataError(f'{name} is empty; it needs at least one column and '
                      'one row')
    with contextlib.ExitStack() as stack:
      # pyarrow reads a local file itself. On gs:// pre_buffer makes a row
      # group's column chunks one ranged read instead of one each (0.28 of
      # the local rate without, 0.63 with: docs/storage.md).
      parquet = pq.ParquetFile(
          stack.enter_context(storage.open(path, 'rb')) if remote else path,
          pre_buffer=remote)
      if (error := _duplicate_error(name, parquet.schema_arrow.names)
          ) is not None:
        raise error
      if not parquet.metadata.num_rows:
        yield parquet.schema_arrow.empty_table().to_pandas()
      # A row group at a time: pre-buffering holds what it reads until the
      # read is over, so this bounds it by a row group, not the file.
      for group in range(parquet.num_row_groups):
        for batch in parquet.iter_batches(batch_size=chunk_rows,
                                          row_groups=[group]):
          yield batch.to_pandas()
  except (pa.ArrowException, OSError) as e:
    raise DataError(f'{name} is not a readable Parquet file '
                     f'({one_line(e)}); write it again, or name a CSV file '
                     '.csv') from None


def missing_tokens(path: str, columns: Sequence[str], rows: int
                   ) -> dict[str, collections.Counter]:
  """How often each of `columns` holds each of cells.MISSING_TOKENS (once
  stripped) in the file's first `rows` data rows, read as the file has them
  (the readers make them missing): for a warning when one is a real value.

  Args:
    path: a file `iter_frames` has read (so it is known to be readable).
    columns: the columns to count in.
    rows: how many data rows to read, from the first.

  Returns:
    {column: Counter of token -> cells}, for the columns that hold one.
  """
  import pandas as pd  # noqa: PLC0415  (see the module doc)
  import pyarrow.parquet as pq  # noqa: PLC0415
  if not columns:
    return {}
  if is_parquet(path):
    with storage.open(path, 'rb') as f:
      batch = next(pq.ParquetFile(f).iter_batches(batch_size=rows,
                                                  columns=list(columns)))
      frame = batch.to_pandas()
  else:
    with csv_text.open_csv(path, path) as f:
      delimiter = csv_text.detect_delimiter(f.read(1 << 16))
    with csv_text.open_csv(path, path) as f:
      frame = pd.read_csv(f, usecols=list(columns), nrows=rows, dtype=str,
                          na_filter=False, **csv_text.csv_options(delimiter))
  out = {}
  for column in columns:
    counts = collections.Counter(
        v.strip(cells.WHITESPACE) for v in frame[column].tolist()
        if isinstance(v, str) and cells.is_missing_token(v))
    counts.pop('', None)  # an empty cell is missing, as everyone reads it
    if counts:
      out[column] = counts
  return out


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


def pass_through(frame: pd.DataFrame, columns: Sequence[str], path: str,
                 source: str = '') -> pd.DataFrame:
  """Columns to copy unchanged into a predictions table (ids, keys, ...).

  An id is a join key: a CSV file's cells are kept as the text they are
  (`00123`, `NA`, `1e5` and a blank stay so, an integer column with a gap
  stays integers), read again from `path` with no conversion at all; a
  Parquet file's columns keep their values and Arrow types.

  Args:
    frame: a frame from `read_frame` / `parse` of `path`.
    columns: the names to keep, in output order; any dtype.
    path: the file the frame came from, read again for these columns.
    source: the setting or flag the path came from, named in messages.

  Returns:
    Those columns, rows in file order, with a fresh 0..N-1 index.

  Raises:
    DataError: a column is missing or named twice.
  """
  import pandas as pd  # noqa: PLC0415  (see the module doc)
  import pyarrow.parquet as pq  # noqa: PLC0415
  name = describe(path, source)
  if (error := _duplicate_error(f'the columns to keep from {name}',
                                list(columns))) is not None:
    raise error
  for column in columns:
    if column not in frame.columns:
      raise missing_column_error(frame, column, name, ' (asked to keep it)')
  data = read_bytes(path, source)
  if not is_parquet(path):
    data = csv_text.csv_bytes(data, name)
  if is_parquet(path):
    kept = pq.read_table(io.BytesIO(data), columns=list(columns)).to_pandas(
        types_mapper=pd.ArrowDtype)
  else:
    # By position: the frame's names are pandas' (stripped, 'Unnamed: 3').
    positions = sorted(list(frame.columns).index(c) for c in columns)
    options = {**csv_text.csv_options(csv_text.detect_delimiter(data)),
               'skipinitialspace': False}
    options.pop('decimal', None)
    kept = pd.read_csv(io.BytesIO(data), usecols=positions, dtype=str,
                       na_filter=False, **options)
    kept.columns = [frame.columns[i] for i in positions]
  if len(kept) != len(frame):
    raise DataError(f'{name} changed while it was read; run again')
  return kept[list(columns)].reset_index(drop=True)
