"""Every column of a user's table has a kind, decided from the training file.

The plan is fit once, on the training file (column_kinds.py decides the
kinds), and stored with the model (in every checkpoint's meta); train, eval,
predict and export all encode a file with it, so a value means the same to
the model wherever it comes from.
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

from meshfit.input_pipeline import cells, table_files
from meshfit.input_pipeline.errors import DataError

if TYPE_CHECKING:
  import pandas as pd

KINDS = ('number', 'boolean', 'category', 'datetime', 'left_out')
# A category value seen fewer times in training is unknown (the unknown
# bucket learns from the rare values): `column_kinds.fit`'s default, and
# older plans'.
# Text in a mostly numeric column recurs when seen this often.
MIN_COUNT = 2
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


def unseen_warning(unseen: dict[str, int], path: str,
                   min_count: int = MIN_COUNT) -> str:
  """The warning for `encode`'s count of cells outside the vocabularies
  (`min_count`: the plan's)."""
  return (f'{path} holds categories outside the model\'s vocabulary, read '
          f'as unknown: values seen fewer than {min_count} times in the '
          'training file (which share the unknown category) or never seen: '
          + ', '.join(f'{c} ({n} rows)' for c, n in unseen.items()))


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
