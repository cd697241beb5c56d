"""meshfit.input_pipeline.column_kinds and column_plan: every column's kind, and
encoding with it."""

import re

import numpy as np
import pandas as pd
import pytest

from meshfit.input_pipeline import cells, column_kinds, column_plan
from meshfit.input_pipeline.column_plan import ColumnPlan
from meshfit.input_pipeline.errors import DataError

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
  return column_kinds.fit(frame, ('price',), path='train.csv', **kwargs)


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
  warning = column_kinds.left_out_warning(plan)
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


def test_the_min_count_decides_which_values_get_a_code_and_is_kept():
  frame = _table()
  frame['city'] = ['paris'] * (N - 7) + ['lima'] * 4 + ['rome'] * 3
  plan = _fit(frame, min_count=4)
  city = next(c for c in plan.features if c.name == 'city')
  assert city.vocabulary == ('paris', 'lima')  # rome, 3 rows: unknown
  x_NxI, unseen = plan.encode(frame.iloc[-4:], 'new.csv')
  assert x_NxI[:, plan.input_names.index('city')].tolist() == [
      column_plan.FIRST_VALUE_CODE + 1] + [column_plan.UNKNOWN_CODE] * 3
  assert unseen == {'city': 3}
  # Stored with the model, so that predict's warning tells the same count.
  assert ColumnPlan.from_json(plan.to_json()).min_count == 4
  assert 'fewer than 4 times' in column_plan.unseen_warning(
      unseen, 'new.csv', plan.min_count)
  # A plan saved before the count was stored read as the count it used.
  old = plan.to_json()
  del old['min_count']
  assert ColumnPlan.from_json(old).min_count == column_plan.MIN_COUNT == 2
  every = _fit(frame, min_count=1)
  assert next(c for c in every.features if c.name == 'city').vocabulary == (
      'paris', 'lima', 'rome')


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
  column = column_kinds.fit(frame, ('y',)).features[0]
  assert column.kind == 'category' and 'other' in column.vocabulary
  frame['grade'] = rng.normal(size=60).astype(object)
  frame.loc[[3, 20, 41], 'grade'] = 'other'
  with pytest.raises(DataError, match="'other' is not a number"):
    column_kinds.fit(frame, ('y',))


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


# Every form the date parser accepts, the same instant in other forms, an
# invalid date and garbage: (cell, its UTC instant or None for missing).
AWKWARD_DATES = [
    ('2020-07-24', '2020-07-24T00:00:00'),
    ('2020-07-24T00:00:00+12:00', '2020-07-23T12:00:00'),
    ('2020-07-24 18:30-05:30', '2020-07-25T00:00:00'),
    ('2020-07-24T06:15:30.5Z', '2020-07-24T06:15:30.5'),
    ('2020-07-24T06:15+0200', '2020-07-24T04:15:00'),
    ('20200724', '2020-07-24T00:00:00'),
    ('2020-7-4', '2020-07-04T00:00:00'),
    ('2020-07', '2020-07-01T00:00:00'),
    ('  2016-02-29  ', '2016-02-29T00:00:00'),
    ('2021-13-45', None), ('2021-02-29', None), ('2020-07-24T25:00', None),
    ('garbage', None), ('', None), ('03/15/2021', None),
]


def _dates_plan() -> ColumnPlan:
  days = pd.date_range('2019-01-01 06:00', periods=30, freq='37h')
  frame = pd.DataFrame({'when': days.strftime('%Y-%m-%dT%H:%M:%S'),
                        'y': np.arange(30.0)})
  return column_kinds.fit(frame, ('y',), path='train.csv')


def test_awkward_dates_read_as_one_parser_reads_them(caplog):
  plan = _dates_plan()
  assert plan.features[0].parts == column_plan.DATETIME_PARTS + ('hour',)
  cells = [c for c, _ in AWKWARD_DATES]
  x_NxI, _ = plan.encode(pd.DataFrame({'when': cells}), 'new.csv', '--input')
  for (cell, instant), row in zip(AWKWARD_DATES, x_NxI):
    if instant is None:
      assert np.isnan(row).all(), cell
      continue
    t = pd.Timestamp(instant)
    want = [(t - pd.Timestamp('1970-01-01')) / pd.Timedelta(days=1), t.year,
            t.month, t.day, t.day_of_week, t.day_of_year, t.hour]
    np.testing.assert_allclose(row, want, rtol=1e-7, err_msg=cell)
  # Predict serves every row, as the SavedModel does; a warning counts the
  # cells that are not dates and names the first.
  assert ("new.csv' (--input), column 'when': 5 cells are not dates "
          "(first: data row 10, '2021-13-45')") in caplog.text


def test_a_date_column_with_a_bad_cell_is_refused_in_training():
  frame = pd.DataFrame({'when': [f'2020-01-{d:02d}' for d in range(1, 29)],
                        'y': np.arange(28.0)})
  frame.loc[5, 'when'] = '2020-02-30'
  with pytest.raises(DataError) as e:
    column_kinds.fit(frame, ('y',), path='train.csv')
  assert ("'train.csv', column 'when', data row 6 (1-based, header not "
          "counted): '2020-02-30' is not a date") in str(e.value)
  assert 'YYYY-MM-DD' in str(e.value)
  plan = column_kinds.fit(frame.drop(5), ('y',), path='train.csv')
  with pytest.raises(DataError, match="data row 6 .*'2020-02-30' is not a "
                     'date'):
    plan.encode(frame, 'eval.csv', 'dataset.eval_path', training=True)


def test_a_column_without_information_in_training_is_left_out():
  frame = _table()
  frame['seven'] = 7.0
  frame['empty'] = np.nan
  frame['always'] = 'yes'
  plan = _fit(frame)
  reasons = {c.name: c.reason for c in plan.left_out}
  assert reasons['seven'] == '7 in every training row: no information'
  assert reasons['empty'] == 'empty in every training row: no information'
  assert reasons['always'] == "'yes' in every training row: no information"
  x_NxI, _ = plan.encode(frame, 'train.csv')
  moved, _ = plan.encode(frame.assign(seven=-100.0, empty=3.0,
                                      always='no'), 'new.csv')
  np.testing.assert_array_equal(moved, x_NxI)


def test_a_bad_boolean_is_named_where_it_is():
  plan = _fit(_table())
  new = _table().iloc[:4].astype({'new': object})
  new['new'] = ['True', 'false', 'maybe', 'TRUE']
  with pytest.raises(DataError) as e:
    plan.encode(new, 'new.csv', '--input')
  message = str(e.value)
  assert "column 'new', data row 3" in message
  assert "'maybe' is not true or false" in message
  # At predict time the plan is fixed: no advice about training keys.
  assert 'dataset.' not in message
  new['new'] = ['True', 'false', None, 'TRUE']
  x_NxI, _ = plan.encode(new, 'new.csv', '--input')
  got = x_NxI[:, plan.input_names.index('new')]
  np.testing.assert_array_equal(got, [1, 0, np.nan, 1])


def test_predict_advice_names_no_training_key():
  plan = _fit(_table())
  new = _table().astype({'size': object})
  new.loc[2, 'size'] = 'big'
  with pytest.raises(DataError) as e:
    plan.encode(new, 'new.csv', '--input')
  assert "column 'size', data row 3" in str(e.value)
  assert 'categorical_columns' not in str(e.value)


def test_grouped_thousands_and_percents_are_numbers():
  n = 30
  frame = pd.DataFrame({
      'income': [f'{1000 * i + 234:,}' for i in range(n)],
      'share': [f'{i + 0.5}%' for i in range(n)],
      'when': [f'{1 + i % 12:02d}/{1 + i:02d}/2021' for i in range(n)],
      'y': np.arange(n, dtype=float)})
  plan = column_kinds.fit(frame, ('y',), path='train.csv')
  kinds = {c.name: c.kind for c in plan.features}
  assert kinds == {'income': 'number', 'share': 'number',
                   'when': 'left_out'}
  when = plan.left_out[0].reason
  assert "dates written like '01/01/2021'" in when and 'YYYY-MM-DD' in when
  x_NxI, _ = plan.encode(frame, 'train.csv')
  np.testing.assert_array_equal(x_NxI[:3, 0], [234, 1234, 2234])
  np.testing.assert_array_equal(x_NxI[:3, 1], [0.5, 1.5, 2.5])
  # Commas that are not thousands groups are no number (a decimal comma).
  frame.loc[4, 'income'] = '4,5'
  with pytest.raises(DataError, match="data row 5 .*'4,5' is not a number"):
    column_kinds.fit(frame, ('y',), path='train.csv')


def test_money_with_a_currency_sign_is_a_number():
  n = 30
  money = ['$1,234.50', '-$5', '$-7', '12 €', '£3', '¥1,000', '+$2.5']
  frame = pd.DataFrame({
      'price': (money * 5)[:n],
      'rating': ['$$', '$$$'] * (n // 2),  # levels, not money
      'y': np.arange(n, dtype=float)})
  plan = column_kinds.fit(frame, ('y',), path='train.csv')
  kinds = {c.name: c.kind for c in plan.features}
  assert kinds == {'price': 'number', 'rating': 'category'}
  x_NxI, _ = plan.encode(frame, 'train.csv')
  np.testing.assert_array_equal(
      x_NxI[:7, plan.input_names.index('price')],
      [1234.5, -5, -7, 12, 3, 1000, 2.5])
  # A sign with no number, or two signs, is text.
  for text in ('$', '$$5', '5$$'):
    frame.loc[4, 'price'] = text
    with pytest.raises(DataError,
                       match=rf"data row 5 .*'{re.escape(text)}' is not a number"):
      column_kinds.fit(frame, ('y',), path='train.csv')


def test_list_and_struct_cells_are_left_out_and_refused_as_a_target():
  frame = pd.DataFrame({'a': np.arange(30.0),
                        'tags': [[i, i + 1] for i in range(30)],
                        'point': [{'x': i} for i in range(30)],
                        'y': np.arange(30.0)})
  plan = column_kinds.fit(frame, ('y',), path='train.parquet')
  reasons = {c.name: c.reason for c in plan.left_out}
  assert set(reasons) == {'tags', 'point'}
  assert 'lists or structs' in reasons['tags']
  with pytest.raises(DataError, match="column 'tags' .* lists or structs"):
    column_kinds.fit(frame, ('tags',), path='train.parquet')


def test_a_target_without_any_value_is_refused():
  frame = _table().assign(price=np.nan)
  with pytest.raises(DataError, match="'train.csv' has no value in target "
                     "column 'price'"):
    _fit(frame)


@pytest.mark.parametrize('values', [
    [7.0, 7.0], [0.0, -0.0], [7, 7.0], [7.0, 7.000001], [1e20, 1e20 + 1e5],
    [True, True], [True, False], np.float32([0.1, 0.1]), [3, 4]])
def test_a_constant_column_of_numbers_is_told_as_its_text_tells_it(values):
  # Numbers are compared without the text (a Python call a cell).
  series = pd.Series(values)
  assert cells.is_constant(series) == (
      series.astype(object).map(cells.as_text).nunique() == 1)


@pytest.mark.parametrize('tz', [None, 'Europe/Paris'])
def test_a_parquet_timestamp_column_is_a_date_read_as_its_text_is(tz):
  """A timestamp column (how Parquet stores dates; naive or with a zone)
  gets the parts its text would, and encodes to the same numbers."""
  stamps = pd.date_range('2020-01-01 06:00', periods=30, freq='37h', tz=tz)
  frame = pd.DataFrame({'when': stamps, 'y': np.arange(30.0)})
  plan = column_kinds.fit(frame, ('y',), path='train.parquet')
  as_text = pd.DataFrame({'when': stamps.tz_convert('UTC').strftime(
      '%Y-%m-%dT%H:%M:%SZ') if tz else stamps.strftime('%Y-%m-%dT%H:%M:%S')})
  assert plan.features[0].kind == 'datetime'
  assert plan.features[0].parts == column_plan.DATETIME_PARTS + ('hour',)
  assert plan == column_kinds.fit(as_text.assign(y=frame['y']), ('y',),
                                  path='train.csv')
  frame.loc[4, 'when'] = pd.NaT
  as_text.loc[4, 'when'] = ''
  np.testing.assert_array_equal(plan.encode(frame, 'x.parquet')[0],
                                plan.encode(as_text, 'x.csv')[0])


def test_a_table_of_targets_alone_is_refused_saying_so():
  frame = pd.DataFrame({'y': np.arange(30.0)})
  with pytest.raises(DataError, match="'train.csv' has no column besides "
                     'the target.s. y: a model needs at least one feature'):
    column_kinds.fit(frame, ('y',), path='train.csv')


# Cells that mean missing however a file holds them: a CSV's exact token,
# Parquet's text (pandas does not read it), one padded with spaces.
_TOKENS = ['NA', 'null', 'None', 'n/a', ' NA ', 'nan\u00a0', '?', '']


@pytest.mark.parametrize('column', ['city', 'size', 'new', 'sold'])
def test_the_missing_tokens_are_missing_in_every_kind_of_column(column):
  frame = _table()
  plan = _fit(frame)
  tokens = frame.iloc[:len(_TOKENS)].copy()
  tokens[column] = pd.Series(_TOKENS, dtype=object)
  tokens['id'] = [f'token{i}' for i in range(len(_TOKENS))]
  refit = _fit(pd.concat([tokens, frame], ignore_index=True))
  # Read as missing: the kinds and vocabularies stay the file's own.
  assert [(c.name, c.kind, c.vocabulary) for c in refit.features] == [
      (c.name, c.kind, c.vocabulary) for c in plan.features]
  blank = tokens.copy()
  blank[column] = None
  np.testing.assert_array_equal(plan.encode(tokens, 'x.parquet')[0],
                                plan.encode(blank, 'x.parquet')[0])
  assert set(cells.MISSING_TOKENS) >= {'NA', 'null', 'None', 'n/a', '?'}


def test_a_category_value_with_unicode_spaces_is_that_value():
  plan = _fit(_table())
  frame = _table().iloc[:4].copy()
  frame['city'] = ['rome\u00a0', '\u2003oslo', 'paris\u3000', 'rome']
  codes = plan.encode(frame, 'x.csv')[0][:, plan.input_names.index('city')]
  vocabulary = plan.features[3].vocabulary
  assert [vocabulary[int(c) - column_plan.FIRST_VALUE_CODE]
          for c in codes] == ['rome', 'oslo', 'paris', 'rome']


def test_a_target_of_classes_is_refused_saying_how_to_predict_one():
  frame = pd.DataFrame({'a': np.arange(40.0),
                        'churn': ['no', 'yes', 'no', 'no'] * 10})
  with pytest.raises(DataError) as e:
    column_kinds.fit(frame, ('churn',), path='train.csv')
  message = str(e.value)
  assert ("column 'churn' (a target) holds the classes 'no', 'yes': "
          'meshfit predicts numbers') in message
  assert "write the column as 1 for 'yes' and 0 for the others" in message
  assert 'fix that cell' not in message
  frame.loc[3, 'churn'] = 'maybe'  # a third class, and a typo in numbers:
  with pytest.raises(DataError, match="the classes 'maybe', 'no', 'yes'"):
    column_kinds.fit(frame, ('churn',), path='train.csv')
  frame['churn'] = [str(i) if i != 5 else 'x' for i in range(40)]
  with pytest.raises(DataError, match="data row 6 .*'x' is not a number"):
    column_kinds.fit(frame, ('churn',), path='train.csv')


def _free_text_table(values: int, rows_each: int, seed: int = 0
                     ) -> pd.DataFrame:
  """A table whose 'note' column holds `values` texts, each in about
  `rows_each` rows (shuffled), and whose 'shop' holds 20 values."""
  rng = np.random.default_rng(seed)
  n = values * rows_each
  notes = [f'left at the door, note {v % values}, call first'
           for v in range(n)]
  return pd.DataFrame({'note': rng.permutation(notes),
                       'shop': rng.choice([f's{i}' for i in range(20)], n),
                       'price': rng.normal(size=n)})


@pytest.mark.parametrize('values,rows_each,kind', [
    (300, 2, 'left_out'),    # most values in two rows: free text
    (300, 4, 'left_out'),    # still under FREE_TEXT_ROWS_PER_VALUE rows
    (300, 5, 'category'),    # enough rows a value to learn it from
    (60, 2, 'category'),     # too few values to call it free text
])
def test_text_of_many_thin_values_is_free_text_not_a_category(
    values, rows_each, kind):
  plan = _fit(_free_text_table(values, rows_each))
  kinds = {c.name: c.kind for c in plan.features}
  assert kinds == {'note': kind, 'shop': 'category'}
  if kind == 'left_out':
    reason = plan.left_out[0].reason
    assert reason.startswith(f'free text: {values} values of '
                             f'{float(rows_each):.1f} rows each on average, '
                             'phrases of 8 words')
    assert 'note (free text' in column_kinds.left_out_warning(plan)


def test_thin_names_of_a_word_or_two_stay_a_category():
  # Car lines or job titles: as thin as free text, but a name recurs in
  # the rows that share it.
  frame = _free_text_table(300, 2)
  frame['note'] = frame['note'].str.split(',').str[1].str.strip()
  assert frame['note'].str.split().str.len().median() == 2
  assert {c.name: c.kind for c in _fit(frame).features}['note'] == 'category'


def test_free_text_named_as_a_feature_or_category_is_kept():
  frame = _free_text_table(300, 2)
  named = column_kinds.fit(frame, ('price',), feature_columns=('note',),
                           path='train.csv')
  assert named.features[0].kind == 'category'
  categorical = _fit(frame, categorical_columns=('note',))
  assert {c.name: c.kind for c in categorical.features}['note'] == 'category'


def test_slash_timestamps_of_thin_values_are_named_as_dates():
  rng = np.random.default_rng(0)
  stamps = [f'{1 + d % 12:02d}/{1 + d % 28:02d}/2021 {d % 24:02d}:00'
            for d in range(200)] * 3
  frame = pd.DataFrame({'when': rng.permutation(stamps),
                        'size': rng.normal(size=600),
                        'price': rng.normal(size=600)})
  plan = _fit(frame)
  assert plan.features[0].kind == 'left_out'
  assert plan.features[0].reason.startswith('dates written like ')
