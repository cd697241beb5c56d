"""input_pipeline.column_plan: every column's kind, and encoding with it."""

import numpy as np
import pandas as pd
import pytest

from input_pipeline import column_plan
from input_pipeline.column_plan import ColumnPlan
from input_pipeline.errors import DataError

N = 40


def _table(n: int = N, seed: int = 0) -> pd.DataFrame:
  """One column of every kind, some missing cells, and a target."""
  rng = np.random.default_rng(seed)
  frame = pd.DataFrame({
      'id': [f'row{seed}_{i}' for i in range(n)],  # one value per row
      'size': rng.normal(size=n),
      'rooms': rng.integers(1, 5, n),  # integer codes: a category if named
      'city': rng.choice(['paris', 'rome', 'oslo'], n),
      'new': rng.choice([True, False], n),
      'sold': [f'2020-0{1 + i % 9}-1{i % 9}' for i in range(n)],
      'price': rng.normal(size=n) * 100,
  })
  frame.loc[3, 'size'] = np.nan
  frame.loc[5, 'city'] = None
  frame.loc[7, 'sold'] = None
  return frame


def _fit(frame, **kwargs) -> ColumnPlan:
  return column_plan.fit(frame, ('price',), path='train.csv', **kwargs)


def test_each_column_gets_its_kind():
  plan = _fit(_table())
  kinds = {c.name: c.kind for c in plan.features}
  assert kinds == {'id': 'left_out', 'size': 'number', 'rooms': 'number',
                   'city': 'category', 'new': 'boolean', 'sold': 'datetime'}
  assert plan.feature_names == ('size', 'rooms', 'city', 'new', 'sold')
  assert plan.input_names[:4] == ('size', 'rooms', 'city', 'new')
  assert plan.input_names[4:] == tuple(
      f'sold.{p}' for p in column_plan.DATETIME_PARTS)
  assert 'nearly one value per row' in plan.left_out[0].reason
  warning = column_plan.left_out_warning(plan)
  assert 'id (nearly one value per row' in warning
  assert 'dataset.categorical_columns' in warning


def test_integer_codes_named_categorical_are_categories():
  plan = _fit(_table(), categorical_columns=('rooms',))
  rooms = next(c for c in plan.features if c.name == 'rooms')
  assert rooms.kind == 'category'
  assert set(rooms.vocabulary) <= {'1', '2', '3', '4'}


def test_named_features_are_used_whatever_they_hold():
  plan = _fit(_table(), feature_columns=('id', 'size'))
  assert [(c.name, c.kind) for c in plan.features] == [('id', 'category'),
                                                       ('size', 'number')]


def test_the_plan_round_trips_through_json():
  plan = _fit(_table())
  assert ColumnPlan.from_json(plan.to_json()) == plan


def test_encoding_fills_nothing_and_codes_categories():
  frame = _table()
  plan = _fit(frame)
  x_NxI, unseen = plan.encode(frame, 'train.csv')
  assert x_NxI.shape == (N, len(plan.input_names)) and not unseen
  size = plan.input_names.index('size')
  assert np.isnan(x_NxI[3, size])  # missing stays NaN: filled on device
  city = next(c for c in plan.features if c.name == 'city')
  codes = x_NxI[:, plan.input_names.index('city')]
  expected = [column_plan.MISSING_CODE if pd.isna(v) else
              column_plan.FIRST_VALUE_CODE + city.vocabulary.index(v)
              for v in frame['city']]
  np.testing.assert_array_equal(codes, expected)
  new = x_NxI[:, plan.input_names.index('new')]
  np.testing.assert_array_equal(new, frame['new'].astype(float))
  sold = x_NxI[:, plan.input_names.index('sold.month')]
  assert sold[0] == 1 and sold[8] == 9 and np.isnan(sold[7])
  days = x_NxI[0, plan.input_names.index('sold.days')]
  assert days == (pd.Timestamp('2020-01-10') - pd.Timestamp('1970-01-01')
                  ).days


def test_unseen_and_rare_categories_are_unknown():
  frame = _table()
  frame.loc[:N - 2, 'city'] = 'paris'
  frame.loc[N - 1, 'city'] = 'lima'  # once: too rare to learn alone
  plan = _fit(frame)
  city = next(c for c in plan.features if c.name == 'city')
  assert city.vocabulary == ('paris',)
  new = pd.DataFrame({**{c: frame[c].iloc[:3] for c in frame},
                      'city': ['paris', 'lima', 'tokyo']})
  x_NxI, unseen = plan.encode(new, 'new.csv')
  codes = x_NxI[:, plan.input_names.index('city')]
  assert codes.tolist() == [column_plan.FIRST_VALUE_CODE,
                            column_plan.UNKNOWN_CODE,
                            column_plan.UNKNOWN_CODE]
  assert unseen == {'city': 2}


def test_a_missing_category_unseen_in_training_is_unknown():
  frame = _table()
  frame['city'] = frame['city'].fillna('rome')
  plan = _fit(frame)
  frame.loc[0, 'city'] = None
  x_NxI, _ = plan.encode(frame, 'new.csv')
  assert x_NxI[0, plan.input_names.index('city')] == column_plan.UNKNOWN_CODE


def test_targets_may_be_missing_but_not_text():
  frame = _table()
  frame.loc[2, 'price'] = np.nan
  plan = _fit(frame)
  y_NxT = plan.targets_of(frame, 'train.csv')
  assert np.isnan(y_NxT[2, 0]) and np.isfinite(np.delete(y_NxT, 2)).all()
  frame['price'] = frame['price'].astype(object)
  frame.loc[4, 'price'] = 'n/a?'
  with pytest.raises(DataError, match=r"column 'price', data row 5 .*'n/a\?' "
                     'is not a number; fix that cell'):
    _fit(frame)


def test_codes_with_a_recurring_word_are_a_category():
  """Grades 9-12 and 'other' (yrbss): a level, not a typo; a word that
  recurs among many distinct numbers is still an error."""
  rng = np.random.default_rng(0)
  grade = rng.choice(['9', '10', '11', '12'], 60).astype(object)
  grade[[3, 20, 41]] = 'other'
  frame = pd.DataFrame({'grade': grade, 'y': rng.normal(size=60)})
  column = column_plan.fit(frame, ('y',)).features[0]
  assert column.kind == 'category' and 'other' in column.vocabulary
  frame['grade'] = rng.normal(size=60).astype(object)
  frame.loc[[3, 20, 41], 'grade'] = 'other'
  with pytest.raises(DataError, match="'other' is not a number"):
    column_plan.fit(frame, ('y',))


def test_a_typo_in_a_number_column_is_named_with_the_fix():
  frame = _table()
  frame['size'] = frame['size'].astype(object)
  frame.loc[6, 'size'] = '4,5'
  with pytest.raises(DataError) as e:
    _fit(frame)
  message = str(e.value)
  assert "'train.csv', column 'size', data row 7" in message
  assert "'4,5' is not a number" in message
  assert 'dataset.categorical_columns' in message
  plan = _fit(_table())
  with pytest.raises(DataError, match="column 'size', data row 1 .*inf is "
                     'not a finite'):
    plan.encode(_table().assign(size=np.inf), 'new.csv')


def test_a_file_lacking_a_feature_is_refused_by_name():
  plan = _fit(_table())
  with pytest.raises(DataError) as e:
    plan.encode(_table().drop(columns=['city']), 'new.csv', '--input')
  assert "(--input) has no column 'city'" in str(e.value)
  assert 'a feature the model was trained on' in str(e.value)


def test_a_table_of_ids_alone_has_no_usable_feature():
  frame = _table()[['id', 'price']]
  with pytest.raises(DataError, match='no usable feature besides the '
                     'targets price: id'):
    _fit(frame)
