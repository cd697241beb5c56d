"""What one cell of a user's table means: a date, a number or a boolean.

Train, eval and predict read cells through these functions (column_plan.py
calls them), and the exported SavedModel reads dates with TensorFlow ops
built from the same regular expressions and the same arithmetic
(`date_seconds_of_fields` and `date_parts` take the array module as an
argument: numpy here, TensorFlow in meshfit/export_tf.py), so a cell is the
same date, or the same missing value, wherever it is read.

**Dates.** A date is `YYYY-MM-DD` (month and day may have one digit),
optionally followed by a time, `T` or a space then `HH:MM`, `HH:MM:SS` or
`HH:MM:SS.fff`, and that by `Z` or a UTC offset (`+02:00`, `+0200`,
`-05`); `YYYYMMDD` and `YYYY-MM` (the 1st of the month) are dates too. A
time with an offset is converted to UTC; one without is taken as UTC. A
cell of that shape that names no real date or time (`2021-13-45`,
`2021-02-29`, `24:00`) is not a date, like any other text.

**Numbers** are what pandas reads as numbers, and also text with commas
that group digits in threes (`1,234,567.5`; the first group is no `0`),
ending in a percent sign (`56.2%` is 56.2) or with one currency sign
before or after the number (`$1,234.50`, `-$5`, `12 €`; the sign is
dropped, as the percent sign is): a comma that groups anything else
(`4,5`, `0,500`) is not a number. In a semicolon-separated file (how a
spreadsheet in a decimal-comma locale writes CSV; table_files marks its
frames with DECIMAL_ATTR) a comma is the decimal mark instead, `0,500`
being 0.5 and `12,250` 12.25, a point is one too, and no digits are
grouped.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
from absl import logging

from meshfit.input_pipeline.errors import DataError

if TYPE_CHECKING:
  import pandas as pd

# What a cell is stripped of on every side: Python's whitespace (each
# character for which str.isspace() holds, the no-break and ideographic
# spaces too), which export_tf strips with a pattern made of the same
# characters (tf.strings.strip strips ASCII alone).
WHITESPACE = ('\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001'
              '\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028'
              '\u2029\u202f\u205f\u3000')
# The cells that mean "missing", once stripped, besides an empty one: in
# every column of a CSV or Parquet file, in training, predict and the
# SavedModel alike. pandas' own list (written out, so that it changes only
# here) and the UCI repository's '?'. A category whose real value is one of
# them (Namibia's code NA) is read as missing too: training warns of it.
MISSING_TOKENS = ('#N/A', '#N/A N/A', '#NA', '-1.#IND', '-1.#QNAN', '-NaN',
                  '-nan', '1.#IND', '1.#QNAN', '<NA>', 'N/A', 'NA', 'NULL',
                  'NaN', 'None', 'n/a', 'nan', 'null', '?')
_MISSING_TEXT = frozenset(MISSING_TOKENS) | {''}
# Rewritten, in order, into the form DATE_PATTERN reads (regular
# expressions that Python's re and RE2, TensorFlow's, read alike).
DATE_REWRITES = (
    (r'^([0-9]{4})([0-9]{2})([0-9]{2})$', r'\1-\2-\3'),  # 20200724
    (r'^([0-9]{4})-([0-9]{1,2})$', r'\1-\2-1'),  # 2020-07: its 1st day
)
# Groups: year, month, day, hour, minute, second (with a fraction), the
# offset's sign, hours and minutes. RE2 rewrites name at most 9 groups.
DATE_PATTERN = (
    r'^([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})'
    r'(?:[Tt ]([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}(?:\.[0-9]+)?))?'
    r'(?:[Zz]|([+-])([0-9]{2})(?::?([0-9]{2}))?)?)?$')
DATE_GROUPS = 9
# What the accepted forms are, for messages and model.json.
DATE_FORMS = ('YYYY-MM-DD, optionally with a time THH:MM[:SS[.fff]] and Z '
              'or a UTC offset (+02:00), which is converted to UTC; also '
              'YYYYMMDD and YYYY-MM')
# Days from 0000-03-01 to 1970-01-01 (H. Hinnant's civil calendar).
_EPOCH_SHIFT = 719468.0
_SECONDS_PER_DAY = 86400.0

# Where a frame says which decimal mark its file uses (pandas' DataFrame.attrs
# follow a frame's columns and slices): ',' or, when absent, '.'.
DECIMAL_ATTR = 'meshfit.decimal'
_THOUSANDS = re.compile(r'[+-]?[1-9][0-9]{0,2}(?:,[0-9]{3})+(?:\.[0-9]*)?')
_DECIMAL_COMMA = re.compile(r'[+-]?[0-9]*,[0-9]+')
# Currency signs a money column's cells may carry: a spreadsheet's export
# writes them, and the column is a number all the same.
CURRENCY_SIGNS = '$€£¥₹'
# A date like 03/15/2021, maybe with a time of day (10:30, 10:30:05 PM).
_SLASH_DATE = re.compile(r'[0-9]{1,2}[/.][0-9]{1,2}[/.][0-9]{2,4}'
                         r'([ T][0-9]{1,2}:[0-9]{2}(:[0-9]{2})?'
                         r'( ?[AaPp][Mm])?)?')


def as_text(value: Any) -> str:
  """A cell as text: integral floats lose their '.0'."""
  if isinstance(value, float) and value.is_integer():
    return str(int(value))
  return str(value).strip(WHITESPACE)


def without_tokens(values: pd.Series) -> pd.Series:
  """`values` with every text cell that means missing (MISSING_TOKENS or
  nothing, once stripped) made missing.

  pandas' CSV reader makes the exact tokens missing; a Parquet file's text,
  or a token padded with spaces, is made so here, for every reader alike.
  """
  if not is_text(values):
    return values
  if values.dtype != object:  # pandas' string dtype: Arrow strips it whole
    tokens = values.str.strip(WHITESPACE).isin(_MISSING_TEXT).to_numpy(
        bool, na_value=False)
  else:  # objects may be other than text (Parquet's mixed columns)
    tokens = np.fromiter((isinstance(v, str) and v.strip(WHITESPACE)
                          in _MISSING_TEXT for v in values.tolist()), bool,
                         len(values))
  return values.mask(tokens) if tokens.any() else values


def is_missing_token(text: str) -> bool:
  """Whether a cell's text means missing (see MISSING_TOKENS)."""
  return text.strip(WHITESPACE) in _MISSING_TEXT


def is_constant(values: pd.Series) -> bool:
  """Whether every cell of `values` (none missing) holds one value, told
  apart as their text is (`as_text`: 1.0 and 1 are one value)."""
  if values.dtype.kind in 'biuf':
    # The same answer as the text's, without a Python call a cell (which
    # took most of the time to prepare a table of numbers).
    return bool(values.min() == values.max())
  return values.map(as_text).nunique() == 1


def _days_from_civil(xp, y, m, d):
  """Days since 1970-01-01 of a proleptic Gregorian date (float64)."""
  y = y - xp.where(m <= 2, 1.0, 0.0)
  era = xp.floor(y / 400.0)
  yoe = y - era * 400.0
  mp = xp.floor((m + 9.0) - 12.0 * xp.floor((m + 9.0) / 12.0))
  doy = xp.floor((153.0 * mp + 2.0) / 5.0) + d - 1.0
  doe = (yoe * 365.0 + xp.floor(yoe / 4.0) - xp.floor(yoe / 100.0) + doy)
  return era * 146097.0 + doe - _EPOCH_SHIFT


def _civil_from_days(xp, days):
  """(year, month, day) of whole days since 1970-01-01 (float64)."""
  z = days + _EPOCH_SHIFT
  era = xp.floor(z / 146097.0)
  doe = z - era * 146097.0
  yoe = xp.floor((doe - xp.floor(doe / 1460.0) + xp.floor(doe / 36524.0)
                  - xp.floor(doe / 146096.0)) / 365.0)
  doy = doe - (365.0 * yoe + xp.floor(yoe / 4.0) - xp.floor(yoe / 100.0))
  mp = xp.floor((5.0 * doy + 2.0) / 153.0)
  day = doy - xp.floor((153.0 * mp + 2.0) / 5.0) + 1.0
  month = mp + xp.where(mp < 10.0, 3.0, -9.0)
  year = yoe + era * 400.0 + xp.where(month <= 2.0, 1.0, 0.0)
  return year, month, day


def date_seconds_of_fields(xp, fields, matched):
  """Seconds since 1970 UTC of DATE_PATTERN's groups; NaN where not a date.

  Args:
    xp: the array module: numpy, or export_tf's TensorFlow shim (`floor`,
      `where` and `nan` on float64 arrays).
    fields: the DATE_GROUPS groups as float64 arrays, an absent group 0;
      the offset's sign as +1, -1 (0 if absent).
    matched: bool array: the cell matched DATE_PATTERN.

  Returns:
    float64 seconds, NaN where the cell is no real date and time.
  """
  year, month, day, hour, minute, second, sign, off_h, off_m = fields
  first = _days_from_civil(xp, year, month, xp.ones_like(day))
  following = _days_from_civil(
      xp, year + xp.where(month >= 12.0, 1.0, 0.0),
      month - xp.where(month >= 12.0, 12.0, 0.0) + 1.0, xp.ones_like(day))
  valid = (matched & (month >= 1.0) & (month <= 12.0) & (day >= 1.0)
           & (day <= following - first) & (hour <= 23.0) & (minute <= 59.0)
           & (second < 60.0) & (off_h <= 23.0) & (off_m <= 59.0))
  seconds = ((first + day - 1.0) * _SECONDS_PER_DAY + hour * 3600.0
             + minute * 60.0 + second - sign * (off_h * 3600.0 + off_m * 60.0))
  return xp.where(valid, seconds, xp.nan * xp.ones_like(seconds))


def date_parts(xp, seconds) -> dict[str, Any]:
  """The numbers a date becomes (column_plan.DATETIME_PARTS and 'hour')."""
  whole = xp.floor(seconds / _SECONDS_PER_DAY)
  year, month, day = _civil_from_days(xp, whole)
  january = _days_from_civil(xp, year, xp.ones_like(year), xp.ones_like(year))
  weekday = whole + 3.0  # 1970-01-01 was a Thursday; Monday is 0
  return {
      'days': seconds / _SECONDS_PER_DAY,
      'year': year, 'month': month, 'day': day,
      'weekday': weekday - 7.0 * xp.floor(weekday / 7.0),
      'dayofyear': whole - january + 1.0,
      'hour': xp.floor((seconds - whole * _SECONDS_PER_DAY) / 3600.0),
  }


def date_seconds(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
  """Seconds since 1970 UTC of a column's cells, as the SavedModel reads
  them.

  Args:
    values: text cells, or pandas datetimes (a Parquet timestamp column;
      naive ones are UTC).

  Returns:
    (float64 seconds, NaN where missing or not a date; bool mask of the
    cells that hold something that is not a date).
  """
  import pandas as pd  # noqa: PLC0415  (slow to import: see table_files)
  if pd.api.types.is_datetime64_any_dtype(values):
    stamps = pd.to_datetime(values, utc=True)
    epoch = pd.Timestamp('1970-01-01', tz='UTC')
    seconds = ((stamps - epoch) / pd.Timedelta(seconds=1)).to_numpy(
        np.float64, na_value=np.nan)
    return seconds, np.zeros(len(values), bool)
  blank = values.isna().to_numpy()
  # Stripped as the SavedModel strips it; a missing token is no date.
  text = pd.Series(['' if b or (isinstance(v, str) and is_missing_token(v))
                    else v.strip(WHITESPACE) if isinstance(v, str)
                    else as_text(v) for v, b in zip(values, blank)],
                   dtype=object)
  for pattern, rewrite in DATE_REWRITES:
    text = text.str.replace(pattern, rewrite, regex=True)
  groups = text.str.extract(DATE_PATTERN)
  matched = groups[0].notna().to_numpy()
  fields = [pd.to_numeric(groups[i]).fillna(0.0).to_numpy(np.float64)
            if i != 6 else groups[i].map({'+': 1.0, '-': -1.0}).fillna(
                0.0).to_numpy(np.float64) for i in range(DATE_GROUPS)]
  with np.errstate(invalid='ignore'):
    seconds = date_seconds_of_fields(np, fields, matched)
  blank = blank | (text == '').to_numpy()
  return seconds, np.isnan(seconds) & ~blank


def looks_like_slash_dates(text: pd.Series) -> str | None:
  """The first cell, if most cells are dates like 03/15/2021 (not read:
  month or day first cannot be told from one cell)."""
  if not len(text):
    return None
  shaped = text.map(lambda v: _SLASH_DATE.fullmatch(v) is not None)
  return text[shaped].iloc[0] if shaped.mean() >= 0.9 else None


def numbers(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
  """float64 numbers of a column's cells, and which hold text.

  Returns:
    (numbers, NaN where missing or text; bool mask of the text cells).
  """
  import pandas as pd  # noqa: PLC0415  (slow to import: see table_files)
  parsed = pd.to_numeric(values, errors='coerce').to_numpy(
      np.float64, na_value=np.nan, copy=True)
  text = np.isnan(parsed) & values.notna().to_numpy()
  rows = np.flatnonzero(text)  # few, or a column of grouped numbers or money
  comma = values.attrs.get(DECIMAL_ATTR) == ','
  # One pass over a plain list: indexing the Series cell by cell cost a
  # million such cells 8 s.
  got = [_marked_number(v, comma) for v in values.to_numpy()[rows].tolist()]
  read = np.fromiter((g is not None for g in got), bool, len(got))
  parsed[rows[read]] = [g for g in got if g is not None]
  text[rows[read]] = False
  return parsed, text


def _marked_number(value: Any, decimal_comma: bool = False) -> float | None:
  """A cell pandas did not read as a number, read without its marks (a
  percent sign, a currency sign, thousands groups, or with `decimal_comma`
  a decimal comma); None if it is text."""
  cell = str(value).strip()
  cell = cell[:-1].rstrip() if cell.endswith('%') else _no_currency(cell)
  if decimal_comma:
    if _DECIMAL_COMMA.fullmatch(cell):
      cell = cell.replace(',', '.')
  elif _THOUSANDS.fullmatch(cell):
    cell = cell.replace(',', '')
  try:
    return float(cell)
  except ValueError:
    return None


def _no_currency(cell: str) -> str:
  """The cell without one currency sign before its number (after its
  sign, if any: '-$5', '$-5') or after it ('12 €')."""
  sign = cell[:1] if cell[:1] in '+-' else ''
  rest = cell[len(sign):].lstrip()
  if rest[:1] and rest[0] in CURRENCY_SIGNS:
    return sign + rest[1:].lstrip()
  if cell[-1:] and cell[-1] in CURRENCY_SIGNS:
    return cell[:-1].rstrip()
  return cell


def booleans(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
  """1.0 / 0.0 of a boolean column's cells (true/false in any case, or 1
  and 0), NaN where missing; and the mask of cells that are neither."""
  import pandas as pd  # noqa: PLC0415  (slow to import: see table_files)
  if pd.api.types.is_bool_dtype(values):
    return (values.astype(float).to_numpy(np.float64, na_value=np.nan),
            np.zeros(len(values), bool))
  present = values.notna().to_numpy()
  keys = values.map(lambda v: as_text(v).lower() if isinstance(v, str)
                    else str(v).lower() if isinstance(v, (bool, np.bool_))
                    else as_text(v))
  out = keys.map({'true': 1.0, 'false': 0.0, '1': 1.0, '0': 0.0}).to_numpy(
      np.float64, na_value=np.nan)
  return out, np.isnan(out) & present


def bad_dates(values: pd.Series, bad: np.ndarray, column: str,
               file_name: str, first_row: int, training: bool) -> None:
  """Raises DataError naming the first cell that is no date (`training`),
  or warns with their count (predict: the exported model reads them as
  missing, and so does predict).

  Args:
    values: the column's cells.
    bad: which of them are no date (`date_seconds`).
    column: the column's name.
    file_name: the file, as messages name it.
    first_row: the data row index of `values`' first cell.
    training: raise (else warn).
  """
  row = int(np.argmax(bad))
  where = f'data row {first_row + row + 1}'
  if training:
    count = int(bad.sum())
    more = f' ({count} such cells in this column)' if count > 1 else ''
    raise DataError(
        f'{file_name}, column {column!r}, {where} (1-based, header not '
        f'counted): {values.iloc[row]!r} is not a date{more}; write dates '
        f'as {DATE_FORMS}, or leave the cell empty for a missing '
        'value')
  logging.warning(
      '%s, column %r: %d cells are not dates (first: %s, %r); they are read '
      'as missing, as the exported model reads them. Dates are %s.',
      file_name, column, int(bad.sum()), where, values.iloc[row],
      DATE_FORMS)


def checked_numbers(values: pd.Series, column: str, file_name: str,
             target: bool = False, first_row: int = 0,
             training: bool = True, boolean: bool = False) -> np.ndarray:
  """float64 values of a number (or boolean) column, NaN where missing.

  Args:
    values: the column's cells.
    column: the column's name.
    file_name: the file, as messages name it.
    target: the column is a target.
    first_row: the data row index of `values`' first cell.
    training: the plan may still change (advice may name its settings).
    boolean: the column is a boolean (true/false, 1/0).

  Raises:
    DataError: a cell holds text (or is infinite or beyond float32), or a
      boolean's is neither true nor false; the message names the column
      and the first such data row, and names training settings only where
      they can still apply (`training`).
  """
  if boolean:
    parsed, text = booleans(values)
  else:
    parsed, text = numbers(values)
  bad = text | np.isinf(parsed) | (np.abs(np.nan_to_num(parsed))
                                    > np.finfo(np.float32).max)
  if bad.any():
    row = int(np.argmax(bad))
    cell = values.iloc[row]
    problem = (f'{parsed[row]:g} is not a finite float32 number'
               if not text[row] else f'{cell!r} is not true or false'
               if boolean else f'{cell!r} is not a number')
    count = int(bad.sum())
    more = f' ({count} such cells in this column)' if count > 1 else ''
    fix = ('fix that cell, or leave it empty for a missing value'
           if target or boolean or not training else
           'fix that cell, leave it empty for a missing value, or name '
           'the column in dataset.categorical_columns to treat it as text')
    if (text[row] and not boolean and values.attrs.get(DECIMAL_ATTR) != ','
        and _DECIMAL_COMMA.fullmatch(str(cell).strip())):
      shown = str(cell).strip()
      fix += ('; a decimal comma is read in a semicolon-separated file '
              f'alone: write {shown.replace(",", ".")} for {shown}, or '
              'separate the fields with semicolons')
    raise DataError(
        f'{file_name}, column {column!r}, data row {first_row + row + 1} '
        f'(1-based, header not counted): {problem}{more}; {fix}')
  return parsed


def holds_lists(values: pd.Series) -> bool:
  """Whether cells hold lists or structs (Parquet's nested types)."""
  return values.dtype == object and bool(values.map(
      lambda v: isinstance(v, (list, tuple, dict, np.ndarray))).any())


def is_text(values: pd.Series) -> bool:
  """Whether a column holds text (pandas' string dtype, or objects)."""
  import pandas as pd  # noqa: PLC0415  (slow to import: see table_files)
  return values.dtype == object or pd.api.types.is_string_dtype(values)


def is_boolean_text(present: pd.Series) -> bool:
  """Whether a column's present cells are all true or false, as text."""
  if not is_text(present) or not len(present):
    return False
  lowered = {str(v).strip().lower() for v in present.unique()}
  return lowered <= {'true', 'false'}
