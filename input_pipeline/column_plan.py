"""Every column of a user's table has a kind, decided from the training file.

The plan is fit once, on the training file, and stored with the model (in
every checkpoint's meta); train, eval, predict and export all encode a file
with it, so a value means the same to the model wherever it comes from.
`encode` turns a frame into the model's input matrix, one float32 column per
input, in plan order:

- **number**: the value; a missing cell (empty, NaN, NA, ?, ...) is NaN, to
  be filled and flagged on device (meshfit/data/features.py).
- **boolean**: 1 or 0 (NaN when missing).
- **category**: text, or integer codes named in `dataset.categorical_columns`.
  The training file's values seen at least `min_count` times
  (`dataset.category_min_count`) form the vocabulary; a cell becomes its
  code, 2 + its index there. A missing cell is code 1 when the training
  file had missing cells (else 0), and anything else (a value too rare in
  training or never seen) code 0, the unknown bucket, which rare training
  values teach the model.
- **datetime**: dates or timestamps (cells.py says which forms; or
  Parquet's own), expanded into numbers: days since 1970, year, month, day,
  weekday, day of the year, and the hour when times of day vary.
- **left_out**: ids and free text, with nearly one value per row; columns
  that hold one value (or none) in every training row, which teach the
  model nothing and must not move a prediction; lists and structs. Named,
  with the reason, in one warning line by the caller.

pandas is imported by the functions that need it, not with this module.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from input_pipeline import cells, table_files
from input_pipeline.errors import DataError

if TYPE_CHECKING:
  import pandas as pd

KINDS = ('number', 'boolean', 'category', 'datetime', 'left_out')
# A category value seen fewer times in training is unknown (the unknown
# bucket learns from the rare values): `fit`'s default, and older plans'.
# Text in a mostly numeric column recurs when seen this often.
MIN_COUNT = 2
# Text with more distinct values than this fraction of its cells is an id
# or free text, not a category.
MAX_DISTINCT_FRACTION = 0.9
# A column whose cells are numbers at least this often is numeric: the other
# cells are errors to report, not a sign that the column is text.
NUMERIC_FRACTION = 0.9
# A mostly numeric column with at most this many distinct numbers, whose
# text cells each recur, is a category (codes and a level or two of text).
MAX_LEVELS_WITH_TEXT = 32
# A target of text with at most this many values is a classification's
# classes (named in its error), not numbers with typos.
MAX_CLASSES = 20
# How many cells a column needs before its distinct fraction says anything.
MIN_CELLS_FOR_ID = 20
UNKNOWN_CODE, MISSING_CODE, FIRST_VALUE_CODE = 0, 1, 2
DATETIME_PARTS = ('days', 'year', 'month', 'day', 'weekday', 'dayofyear')
PLAN_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Column:
  """One column of the training file and how the model sees it.

  Attributes:
    name: the column's header.
    kind: one of KINDS.
    has_missing: the training file has missing cells in it.
    vocabulary: a category's values, in code order (code = 2 + index).
    parts: a datetime's numbers, a subset of DATETIME_PARTS plus 'hour'.
    reason: why a column is left out.
  """
  name: str
  kind: str
  has_missing: bool = False
  vocabulary: tuple[str, ...] = ()
  parts: tuple[str, ...] = ()
  reason: str = ''

  @property
  def input_names(self) -> tuple[str, ...]:
    """The model's input columns that this column becomes."""
    if self.kind == 'left_out':
      return ()
    if self.kind == 'datetime':
      return tuple(f'{self.name}.{p}' for p in self.parts)
    return (self.name,)

  @property
  def num_codes(self) -> int:
    """Size of a category's code space (unknown, missing, vocabulary)."""
    return FIRST_VALUE_CODE + len(self.vocabulary)


@dataclasses.dataclass(frozen=True)
class ColumnPlan:
  """The kinds of a table's columns, fit on the training file.

  Attributes:
    features: the feature columns, in the model's order (left-out ones
      included, with their reason).
    targets: the target columns' names.
    min_count: how many training rows a category value needed to get a code
      of its own (fewer: unknown).
  """
  features: tuple[Column, ...]
  targets: tuple[str, ...]
  min_count: int = MIN_COUNT

  @property
  def used(self) -> tuple[Column, ...]:
    """The columns the model reads (every kind but left_out)."""
    return tuple(c for c in self.features if c.kind != 'left_out')

  @property
  def feature_names(self) -> tuple[str, ...]:
    """The names of the columns the model reads, in order."""
    return tuple(c.name for c in self.used)

  @property
  def input_names(self) -> tuple[str, ...]:
    """The model's input columns, one per column of `encode`'s matrix."""
    return tuple(n for c in self.used for n in c.input_names)

  @property
  def input_categories(self) -> tuple[int, ...]:
    """Per input column: its number of codes if a category, else 0."""
    return tuple(c.num_codes if c.kind == 'category' else 0
                 for c in self.used for _ in c.input_names)

  @property
  def left_out(self) -> tuple[Column, ...]:
    return tuple(c for c in self.features if c.kind == 'left_out')

  def to_json(self) -> dict[str, Any]:
    """A JSON-able description (stored in every checkpoint's meta)."""
    return {'version': PLAN_VERSION,
            'features': [dataclasses.asdict(c) for c in self.features],
            'targets': list(self.targets), 'min_count': self.min_count}

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> ColumnPlan:
    if data.get('version') != PLAN_VERSION:
      raise DataError(f'the column plan is of version {data.get("version")!r}'
                      f', this meshfit reads version {PLAN_VERSION}; train '
                      'again with this meshfit')
    features = tuple(Column(**{**c, 'vocabulary': tuple(c['vocabulary']),
                                'parts': tuple(c['parts'])})
                     for c in data['features'])
    return cls(features, tuple(data['targets']),
               int(data.get('min_count', MIN_COUNT)))

  @classmethod
  def numeric(cls, feature_names: Sequence[str],
              target_names: Sequence[str]) -> ColumnPlan:
    """A plan of number columns only (the synthetic datasets)."""
    return cls(tuple(Column(n, 'number') for n in feature_names),
               tuple(target_names))

  def describe(self) -> str:
    """One line: how many columns of each kind, and which are left out."""
    counts = collections.Counter(c.kind for c in self.features)
    text = ', '.join(f'{counts[k]} {k.replace("_", " ")}' for k in KINDS
                     if counts[k])
    return f'{len(self.features)} feature columns: {text}'

  def encode(self, frame: pd.DataFrame, path: str, source: str = '',
             first_row: int = 0, training: bool = False
             ) -> tuple[np.ndarray, dict[str, int]]:
    """The model's input matrix for the rows of `frame`.

    Args:
      frame: a frame holding (at least) the plan's used columns, by name.
      path: the file the frame came from, named in messages.
      source: the setting or flag the path came from, named in messages.
      first_row: the file's data row index of the frame's first row (a
        chunk of a larger file), for messages.
      training: the file is read while training (its training or
        evaluation file): a cell of a date column that is not a date is an
        error, as text in a number column is. Otherwise (predict, eval of
        a trained model) such cells are missing, as the exported model
        reads them, and one warning counts them.

    Returns:
      x_NxI, float32, one column per input (see the module doc), rows in
      frame order; and {column: rows} of categories holding a value the
      training file did not have (encoded as unknown), for a warning.

    Raises:
      DataError: a used column is missing, a cell of a number column is
        text, one of a boolean column neither true nor false, or (while
        `training`) one of a date column no date (the message names the
        column and the first such row).
    """
    name = table_files.describe(path, source)
    x_NxI = np.empty((len(frame), len(self.input_names)), np.float32)
    unseen = {}
    i = 0
    for column in self.used:
      if column.name not in frame.columns:
        raise table_files.missing_column_error(
            frame, column.name, name, ' (a feature the model was trained on)')
      values = cells.without_tokens(frame[column.name])
      width = len(column.input_names)
      if column.kind in ('number', 'boolean'):
        x_NxI[:, i] = cells.checked_numbers(
            values, column.name, name, first_row=first_row,
            training=training, boolean=column.kind == 'boolean')
      elif column.kind == 'category':
        codes, new = _codes(values, column)
        x_NxI[:, i] = codes
        if new:
          unseen[column.name] = new
      else:
        seconds, bad = cells.date_seconds(values)
        if bad.any():
          cells.bad_dates(values, bad, column.name, name, first_row, training)
        parts = cells.date_parts(np, seconds)
        x_NxI[:, i:i + width] = np.stack([parts[p] for p in column.parts],
                                         axis=1)
      i += width
    return x_NxI, unseen

  def targets_of(self, frame: pd.DataFrame, path: str,
                 source: str = '', first_row: int = 0) -> np.ndarray:
    """y_NxT, float32, NaN where a target is missing (`first_row` as for
    `encode`)."""
    name = table_files.describe(path, source)
    y_NxT = np.empty((len(frame), len(self.targets)), np.float32)
    for t, target in enumerate(self.targets):
      if target not in frame.columns:
        raise table_files.missing_column_error(frame, target, name,
                                               ' (a target)')
      y_NxT[:, t] = cells.checked_numbers(
          cells.without_tokens(frame[target]), target, name, target=True,
          first_row=first_row)
    return y_NxT


def fit(frame: pd.DataFrame, target_columns: Sequence[str],
        feature_columns: Sequence[str] = (),
        categorical_columns: Sequence[str] = (), path: str = '',
        source: str = '', min_count: int = MIN_COUNT) -> ColumnPlan:
  """Decides every column's kind from a training file.

  Args:
    frame: the training file, parsed (`table_files.parse`).
    target_columns: the columns to predict; numbers.
    feature_columns: the features, by name; () takes every other column
      (ids and free text are then left out).
    categorical_columns: integer (or any) columns to treat as categories.
    path: the file, named in messages.
    source: the setting the path came from, named in messages.
    min_count: a category value seen fewer times is unknown to the model.

  Raises:
    DataError: a named column is missing, a target is not numeric, or a
      numeric column holds text in a few cells (named, with the row).
  """
  name = table_files.describe(path, source)
  for column, key in ([(c, 'dataset.target_columns') for c in target_columns]
                      + [(c, 'dataset.feature_columns')
                         for c in feature_columns]
                      + [(c, 'dataset.categorical_columns')
                         for c in categorical_columns]):
    if column not in frame.columns:
      raise table_files.missing_column_error(frame, column, name,
                                             f' named in {key}')
  for target in target_columns:
    values = cells.without_tokens(frame[target])
    if cells.holds_lists(values):
      raise DataError(f'{name}, column {target!r} (a target) holds lists or '
                      'structs; a target must be one number per row')
    if (error := _classes_error(values, target, name)) is not None:
      raise error
    cells.checked_numbers(values, target, name, target=True)  # raises
    if not values.notna().any():
      raise DataError(f'{name} has no value in target column {target!r}: '
                      'every row is empty; fill it in, or name another '
                      'column in dataset.target_columns')
  chosen = feature_columns or [c for c in frame.columns
                               if c not in target_columns]
  columns = tuple(_fit_column(frame[c], str(c), c in categorical_columns,
                              named=bool(feature_columns), file_name=name,
                              min_count=min_count)
                  for c in chosen)
  if not columns:
    raise DataError(
        f'{name} has no column besides the target(s) '
        f'{", ".join(target_columns)}: a model needs at least one feature '
        'column to predict from; add one to the file')
  if not any(c.kind != 'left_out' for c in columns):
    raise DataError(
        f'{name} has no usable feature besides the targets '
        f'{", ".join(target_columns)}: {_left_out_text(columns)}; add a '
        'column, or name the features in dataset.feature_columns')
  return ColumnPlan(columns, tuple(target_columns), min_count)


def _classes_error(values: pd.Series, target: str, name: str
                   ) -> DataError | None:
  """The error for a target of a few text values (a classification table's
  `churn`: yes, no), or None: it names the classes and how to predict the
  probability of one (a 0/1 column trains, its prediction estimating it).
  """
  present = values.dropna()
  text = present[cells.numbers(present)[1]].map(cells.as_text)
  if not len(present) or len(text) < NUMERIC_FRACTION * len(present):
    return None  # numbers with a typo or two: checked_numbers names them
  classes = sorted(text.unique())
  if len(classes) > MAX_CLASSES:
    return None
  first = 'yes' if 'yes' in classes else classes[-1]
  return DataError(
      f'{name}, column {target!r} (a target) holds the classes '
      f'{", ".join(map(repr, classes))}: meshfit predicts numbers '
      '(regression), not classes; to predict the probability of one class, '
      f'write the column as 1 for {first!r} and 0 for the others (a 0/1 '
      'target trains, and its prediction estimates that probability), or '
      'name another column in dataset.target_columns')


def _left_out_text(columns: Sequence[Column]) -> str:
  left = [c for c in columns if c.kind == 'left_out']
  return ', '.join(f'{c.name} ({c.reason})' for c in left) or 'none'


def left_out_warning(plan: ColumnPlan) -> str | None:
  """The one warning line naming the columns left out, if any."""
  if not plan.left_out:
    return None
  return (f'{len(plan.left_out)} column(s) left out of the features: '
          f'{_left_out_text(plan.left_out)}; name a column in '
          'dataset.categorical_columns to use it as a category')


def unseen_warning(unseen: dict[str, int], path: str,
                   min_count: int = MIN_COUNT) -> str:
  """The warning for `encode`'s count of cells outside the vocabularies
  (`min_count`: the plan's)."""
  return (f'{path} holds categories outside the model\'s vocabulary, read '
          f'as unknown: values seen fewer than {min_count} times in the '
          'training file (which share the unknown category) or never seen: '
          + ', '.join(f'{c} ({n} rows)' for c, n in unseen.items()))


def _fit_column(values: pd.Series, name: str, categorical: bool,
                named: bool, file_name: str, min_count: int) -> Column:
  import pandas as pd  # noqa: PLC0415  (see the module doc)
  values = cells.without_tokens(values)
  missing = values.isna()
  has_missing = bool(missing.any())
  present = values[~missing]
  if name.startswith('Unnamed: ') and not named:
    # pandas' name for an empty header: most often an index written by
    # DataFrame.to_csv, which must not become a feature.
    return Column(name, 'left_out', reason='no header: an index')
  if cells.holds_lists(present):
    return Column(name, 'left_out', reason='lists or structs, not one value '
                  'a cell: give each part a column of its own to use it')
  if not len(present) or (not has_missing and cells.is_constant(present)):
    # Nothing to learn from, and a value sent at prediction would meet a
    # scale fit on none: the model must not read it.
    shown = ('empty' if not len(present) else
             repr(cells.as_text(present.iloc[0])) if cells.is_text(present)
             else cells.as_text(present.iloc[0]))
    return Column(name, 'left_out',
                  reason=f'{shown} in every training row: no information')
  if categorical:
    return _category(present.map(cells.as_text), name, has_missing,
                     min_count)
  if pd.api.types.is_bool_dtype(values) or cells.is_boolean_text(present):
    return Column(name, 'boolean', has_missing)
  if pd.api.types.is_datetime64_any_dtype(values):
    # A timestamp column (Parquet's dates): the seconds its text would be.
    return Column(name, 'datetime', has_missing,
                  parts=_parts(cells.date_seconds(present)[0]))
  if pd.api.types.is_numeric_dtype(values):
    return Column(name, 'number', has_missing)
  numbers, text_mask = cells.numbers(present)
  if (~text_mask).mean() >= NUMERIC_FRACTION:
    words = present[text_mask].map(cells.as_text).value_counts()
    if (len(words) and (words >= MIN_COUNT).all()
        and pd.Series(numbers).nunique() <= MAX_LEVELS_WITH_TEXT):
      # Few numbers and text that recurs (grades 9-12 and 'other'): levels
      # of a category, not a number with typos.
      return _category(present.map(cells.as_text), name, has_missing,
                       min_count)
    # Raises, naming the first cell that is text.
    cells.checked_numbers(values, name, file_name)
    return Column(name, 'number', has_missing)
  seconds, bad = cells.date_seconds(present)
  if (~bad).mean() >= NUMERIC_FRACTION:
    if bad.any():
      bad_N = np.zeros(len(values), bool)
      bad_N[np.flatnonzero(~missing.to_numpy())[bad]] = True
      cells.bad_dates(values, bad_N, name, file_name, 0, training=True)
    return Column(name, 'datetime', has_missing, parts=_parts(seconds))
  text = present.map(cells.as_text)
  if (len(text) >= MIN_CELLS_FOR_ID and not named
      and text.nunique() > MAX_DISTINCT_FRACTION * len(text)):
    if (example := cells.looks_like_slash_dates(text)) is not None:
      return Column(name, 'left_out', reason=f'dates written like '
                    f'{example!r}, which is month or day first cannot be '
                    'told: write them as YYYY-MM-DD to use them')
    return Column(name, 'left_out', reason='nearly one value per row: an id '
                  'or free text')
  return _category(text, name, has_missing, min_count)


def _category(text: pd.Series, name: str, has_missing: bool,
              min_count: int) -> Column:
  counts = text.value_counts()
  kept = counts[counts >= min_count]
  # Most frequent first; ties by value, so that the plan is reproducible.
  vocabulary = tuple(sorted(kept.index, key=lambda v: (-kept[v], v)))
  return Column(name, 'category', has_missing, vocabulary=vocabulary)


def _parts(seconds: np.ndarray) -> tuple[str, ...]:
  """The numbers a datetime column becomes (the hour if times vary)."""
  hours = cells.date_parts(np, seconds)['hour']
  has_time = bool((np.nan_to_num(hours) != 0).any())
  return DATETIME_PARTS + (('hour',) if has_time else ())


def _codes(values: pd.Series, column: Column) -> tuple[np.ndarray, int]:
  """(codes of a category column's cells, how many cells were unseen)."""
  index = {v: FIRST_VALUE_CODE + i for i, v in enumerate(column.vocabulary)}
  missing = values.isna().to_numpy()
  text = values.map(lambda v: None if v is None or v != v
                    else cells.as_text(v))
  codes = text.map(index).to_numpy(np.float64, na_value=np.nan, copy=True)
  unseen = np.isnan(codes) & ~missing
  codes[unseen] = UNKNOWN_CODE
  codes[missing] = MISSING_CODE if column.has_missing else UNKNOWN_CODE
  return codes.astype(np.float32), int(unseen.sum())
