"""Deciding every column's kind from the training file: `fit` makes the plan.

The rules read a training column's cells and choose number, boolean,
category, datetime or left out (with the reason, which `left_out_warning`
names); column_plan.py holds the plan they make and what each kind becomes
for the model. Named columns and targets are checked here too: a target must
be numbers, and a mostly numeric column's text cells are errors, named with
their row.

pandas is imported by the functions that need it, not with this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from meshfit.input_pipeline import cells, table_files
from meshfit.input_pipeline.column_plan import (DATETIME_PARTS, MIN_COUNT, Column,
                                        ColumnPlan)
from meshfit.input_pipeline.errors import DataError

if TYPE_CHECKING:
  import pandas as pd

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
# Text of at least this many distinct values with fewer than this many
# training cells a value on average, and phrases of at least this many
# words (the median cell), is free text (remarks, descriptions), not a
# category: each value's embedding would be fit to the few rows that hold
# it, which a member then memorises, and a new row's text is most often a
# value it never saw. Names of a word or two (car lines, job titles) recur
# in the rows that share them and carry what those rows have in common:
# left out, epa2021's car lines cost 4.5% (docs/tables.md, the dev suite).
FREE_TEXT_MIN_VALUES = 100
FREE_TEXT_ROWS_PER_VALUE = 5
FREE_TEXT_MIN_WORDS = 3


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
  if len(text) >= MIN_CELLS_FOR_ID and not named and (
      reason := _free_text_reason(text)) is not None:
    if (example := cells.looks_like_slash_dates(text)) is not None:
      return Column(name, 'left_out', reason=f'dates written like '
                    f'{example!r}, which is month or day first cannot be '
                    'told: write them as YYYY-MM-DD to use them')
    if reason:
      return Column(name, 'left_out', reason=reason)
  return _category(text, name, has_missing, min_count)


def _free_text_reason(text: pd.Series) -> str | None:
  """Why a text column's training cells (none missing) are an id or free
  text rather than a category; '' if its values are too thin for a
  category but short names (left out only as dates, which the caller
  tells); None if they are a category."""
  distinct = text.nunique()
  if distinct > MAX_DISTINCT_FRACTION * len(text):
    return 'nearly one value per row: an id or free text'
  if (distinct < FREE_TEXT_MIN_VALUES
      or len(text) >= FREE_TEXT_ROWS_PER_VALUE * distinct):
    return None
  words = text.str.split().str.len().median()
  if words < FREE_TEXT_MIN_WORDS:
    return ''
  return (f'free text: {distinct} values of {len(text) / distinct:.1f} rows '
          f'each on average, phrases of {words:.0f} words, too few for a '
          'category to learn from')


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
