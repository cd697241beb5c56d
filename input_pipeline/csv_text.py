"""How a CSV file's bytes become the text pandas parses, and its dialect.

What is particular to CSV files, under table_files.py's checks and messages
about whole files: compression (gzip read, others named with what to do), the
field separator (detected from the header) and the decimal mark it implies,
pandas' options and the cells it makes missing, and where a file that is not
UTF-8 first goes wrong.

pandas is not imported here: the callers pass its frames (table_files.py says
why it is imported late).
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import re
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

from meshfit import storage
from meshfit.input_pipeline import cells
from meshfit.input_pipeline.errors import DataError, one_line

if TYPE_CHECKING:
  import pandas as pd

# The first bytes of a compressed file: gzip is read (a .csv.gz, as pandas
# and Arrow read one); the others are named, with what to do.
_GZIP_MAGIC = b'\x1f\x8b'
_OTHER_COMPRESSIONS = {b'BZh': 'bzip2', b'PK\x03\x04': 'zip',
                       b'\xfd7zXZ\x00': 'xz', b'\x28\xb5\x2f\xfd': 'zstd'}


def _check_compression(head: bytes, name: str) -> bool:
  """Whether a CSV file starting with `head` is gzip-compressed.

  Raises:
    DataError: it is compressed otherwise (bzip2, zip, xz, zstd).
  """
  for magic, kind in _OTHER_COMPRESSIONS.items():
    if head.startswith(magic):
      raise DataError(f'{name} is compressed with {kind}; meshfit reads CSV '
                      'files as text or gzip-compressed (.csv.gz), and '
                      'Parquet: decompress it, or compress it with gzip')
  return head.startswith(_GZIP_MAGIC)


def csv_bytes(data: bytes, name: str) -> bytes:
  """A CSV file's text as bytes: `data`, decompressed if gzip.

  Args:
    data: the file's bytes.
    name: the file as messages name it (table_files.describe).

  Returns:
    The text's bytes.

  Raises:
    DataError: the file is compressed otherwise, or a broken gzip file.
  """
  if not _check_compression(data[:8], name):
    return data
  try:
    return gzip.decompress(data)
  except (OSError, EOFError) as e:
    raise DataError(f'{name} is not a readable gzip file ({one_line(e)}); '
                    'compress it again, or give it uncompressed') from None


@contextlib.contextmanager
def open_csv(path: str, name: str) -> Iterator[IO[bytes]]:
  """A CSV file opened to read its text as bytes (decompressed if gzip).

  Args:
    path: the file, local or gs://.
    name: the file as messages name it (table_files.describe).

  Yields:
    A binary file object of the text.
  """
  with storage.open(path, 'rb') as f:
    packed = _check_compression(f.read(8), name)
    f.seek(0)
    if not packed:
      yield f
      return
    with gzip.GzipFile(fileobj=f, mode='rb') as text:
      yield text


# The cells pandas' CSV reader makes missing: an empty one and
# cells.MISSING_TOKENS (column_plan makes a padded or Parquet one missing).
NA_VALUES = ['', *cells.MISSING_TOKENS]
# Field separators a header is checked for, in order of preference.
DELIMITERS = (',', ';', '\t', '|')
# The separator of files whose decimal mark is a comma: a spreadsheet in a
# decimal-comma locale writes CSV so (cells.py reads their numbers).
DECIMAL_COMMA_DELIMITER = ';'


def csv_options(delimiter: str) -> dict:
  """pandas.read_csv's options for a file of this field separator.

  Args:
    delimiter: the file's separator (`detect_delimiter`'s).

  Returns:
    Keyword arguments for pandas.read_csv.
  """
  # skipinitialspace: "a, b" headers and values are common in hand-made
  # files. index_col=False: rows with one field more than the header would
  # otherwise silently shift every column onto the first one as an index.
  options = dict(skipinitialspace=True, index_col=False, sep=delimiter,
                 keep_default_na=False)
  if delimiter == DECIMAL_COMMA_DELIMITER:
    options['decimal'] = ','
  return options


def marked(frame: pd.DataFrame, delimiter: str) -> pd.DataFrame:
  """`frame`, marked with its file's decimal mark for cells.py.

  Args:
    frame: a frame read from a file with this separator.
    delimiter: the file's separator.

  Returns:
    `frame` itself, its attrs holding a decimal comma where there is one.
  """
  if delimiter == DECIMAL_COMMA_DELIMITER:
    frame.attrs[cells.DECIMAL_ATTR] = ','
  return frame


def detect_delimiter(data: bytes) -> str:
  """The field separator of a CSV file, read from its header line.

  The one of DELIMITERS that the header holds most often (outside quotes);
  a comma when it holds none (a one-column file).

  Args:
    data: the file's first bytes, the header line among them.

  Returns:
    One of DELIMITERS.
  """
  header = data.split(b'\n', 1)[0].decode('utf-8', errors='replace')
  unquoted = re.sub(r'"[^"]*"', '', header)
  counts = {d: unquoted.count(d) for d in DELIMITERS}
  best = max(DELIMITERS, key=lambda d: counts[d])
  return best if counts[best] else ','


def not_utf8(name: str, pieces: Iterator[bytes]) -> DataError:
  """The error for a file that is not UTF-8: where, and what to do.

  pandas' own message counts bytes from the start of its buffer and says
  nothing of a line, so the file is read again up to its first bad byte.

  Args:
    name: the file as messages name it.
    pieces: the file's text bytes, in order (`read_in_pieces`).

  Returns:
    The DataError to raise, naming the line and byte.
  """
  buffer, offset, lines = b'', 0, 0
  for piece in [*pieces, None]:
    try:
      if piece is None:  # the end: a character cut short is bad too
        codecs.utf_8_decode(buffer, 'strict', True)
        break
      buffer += piece
      _, used = codecs.utf_8_decode(buffer, 'strict', False)
    except UnicodeDecodeError as e:
      lines += buffer.count(b'\n', 0, e.start)
      return DataError(
          f'{name} is not UTF-8: line {lines + 1} holds byte '
          f'0x{buffer[e.start]:02x} (byte {offset + e.start + 1} of the '
          'file), which UTF-8 text cannot; re-save the file as UTF-8 (in a '
          'spreadsheet: "CSV UTF-8"), or write it as Parquet')
    lines += buffer.count(b'\n', 0, used)
    offset += used
    buffer = buffer[used:]
  return DataError(f'{name} is not UTF-8 text; re-save the file as UTF-8, '
                   'or write it as Parquet')


def read_in_pieces(path: str, name: str) -> Iterator[bytes]:
  """A CSV file's text bytes, a MiB at a time (for `not_utf8`).

  Args:
    path: the file.
    name: the file as messages name it.

  Yields:
    Consecutive pieces of the text.
  """
  with open_csv(path, name) as f:
    while piece := f.read(1 << 20):
      yield piece
