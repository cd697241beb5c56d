"""Tests for input_pipeline.table_files: users' tables in, predictions out."""

import os

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('NO_GCE_CHECK', 'true')

import pathlib  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from input_pipeline import table_files  # noqa: E402
from meshfit.errors import UsageError  # noqa: E402


def _write(path: pathlib.Path, frame: pd.DataFrame) -> str:
  if table_files.is_parquet(str(path)):
    frame.to_parquet(path, index=False)
  else:
    frame.to_csv(path, index=False)
  return str(path)


def _frame(n: int = 5) -> pd.DataFrame:
  rng = np.random.default_rng(0)
  return pd.DataFrame({
      'id': [f'row{i}' for i in range(n)],
      'a': rng.normal(size=n),
      'b': np.arange(n),
      'y': rng.normal(size=n) * 100,
  })


def _tables(tmp_path, train: pd.DataFrame, eval_: pd.DataFrame | None = None,
            targets=('y',), features=(), suffix='.csv'):
  paths = []
  for name, frame in (('train', train), ('eval', train if eval_ is None
                                          else eval_)):
    path = _write(tmp_path / f'{name}{suffix}', frame)
    paths.append((path, pathlib.Path(path).read_bytes()))
  return table_files.read_training_tables(*paths, targets, features)


@pytest.mark.parametrize('suffix', ['.csv', '.parquet'])
def test_numeric_matrix_holds_named_columns_in_file_order(tmp_path, suffix):
  frame = _frame()
  path = _write(tmp_path / f't{suffix}', frame)
  x_Nx2 = table_files.numeric_matrix(table_files.read_frame(path), ['b', 'a'],
                                     path)
  assert x_Nx2.dtype == np.float32
  np.testing.assert_array_equal(
      x_Nx2, frame[['b', 'a']].to_numpy(np.float32))


def test_auto_selection_takes_other_numeric_named_columns(tmp_path):
  frame = _frame()
  frame.insert(0, 'Unnamed: 0', np.arange(5))  # an index from to_csv
  frame['text'] = 'x'
  tables = _tables(tmp_path, frame)
  assert tables.feature_names == ('a', 'b')
  assert tables.target_names == ('y',)
  assert set(tables.skipped_columns) == {'Unnamed: 0', 'id', 'text'}
  np.testing.assert_array_equal(tables.x_train_NxF,
                                frame[['a', 'b']].to_numpy(np.float32))


def test_explicit_selection_and_two_targets_keep_the_given_order(tmp_path):
  frame = _frame()
  tables = _tables(tmp_path, frame, targets=('y', 'a'), features=('b',))
  assert tables.feature_names == ('b',)
  assert tables.target_names == ('y', 'a')
  np.testing.assert_array_equal(tables.y_eval_NxT,
                                frame[['y', 'a']].to_numpy(np.float32))


def test_text_column_with_one_number_is_reported_not_skipped(tmp_path):
  frame = _frame()
  frame['b'] = ['1', '2', 'n/a?', '4', '5']
  with pytest.raises(UsageError) as e:
    _tables(tmp_path, frame)
  assert "column 'b', data row 3" in str(e.value)
  assert "'n/a?' is not a number" in str(e.value)


# Each case: file content, then the parts its message must hold.
_BAD_CSV = {
    'non_numeric': (b'a,y\n1,2\n3,4\nx7,5\n',
                    ["column 'a'", 'data row 3', "'x7' is not a number"]),
    'empty_cell': (b'a,y\n1,2\n3,\n', ["column 'y'", 'data row 2', 'missing']),
    'nan': (b'a,y\n1,2\n3,4\n5,6\nNaN,1\n',
            ["column 'a'", 'data row 4', 'missing (empty or NaN)']),
    'inf': (b'a,y\n1,2\n-inf,4\n', ["column 'a'", 'data row 2', '-inf']),
    'too_large': (b'a,y\n1,2\n1e300,4\n',
                  ["column 'a'", 'data row 2', 'too large for float32']),
    'empty': (b'', ['is empty']),
    'header_only': (b'a,y\n', ['header row but no data rows']),
    'duplicated': (b'a,y,a\n1,2,3\n', ["column 'a' twice", 'columns 1 and 3']),
    'ragged': (b'a,y\n1,2\n3,4,5\n', ['not a readable CSV', 'line 3']),
    'missing_target': (b'a,b\n1,2\n',
                       ["no column 'y'", 'its columns are: a, b']),
}


@pytest.mark.parametrize('case', sorted(_BAD_CSV))
def test_bad_training_file_names_file_column_and_row(tmp_path, case):
  content, parts = _BAD_CSV[case]
  bad = tmp_path / 'train.csv'
  bad.write_bytes(content)
  good = tmp_path / 'eval.csv'
  good.write_bytes(b'a,y\n1,2\n')
  with pytest.raises(UsageError) as e:
    table_files.read_training_tables(
        (str(bad), bad.read_bytes()), (str(good), good.read_bytes()),
        ('y',), ())
  message = str(e.value)
  assert f"'{bad}' (dataset.train_path)" in message
  for part in parts:
    assert part in message
  assert '\n' not in message


def test_earliest_bad_row_over_all_columns_is_reported(tmp_path):
  path = tmp_path / 't.csv'
  path.write_bytes(b'a,b\n1,2\n3,x\n,4\n')
  with pytest.raises(UsageError, match=r"column 'b', data row 2"):
    table_files.numeric_matrix(table_files.read_frame(str(path)), ['a', 'b'],
                               str(path))


@pytest.mark.parametrize('value,problem', [
    (np.nan, 'missing'), (np.inf, 'inf is not a finite'),
    ('seven', "'seven' is not a number")])
def test_bad_value_in_parquet_names_column_and_row(tmp_path, value, problem):
  column = [1.0, 2.0, value, 4.0]
  if isinstance(value, str):  # a text column: every cell a string
    column = [str(v) for v in column]
  frame = pd.DataFrame({'a': column, 'y': [1.0] * 4})
  path = _write(tmp_path / 't.parquet', frame)
  with pytest.raises(UsageError) as e:
    table_files.numeric_matrix(table_files.read_frame(path), ['a'], path)
  assert f"'{path}', column 'a', data row 3" in str(e.value)
  assert problem in str(e.value)


def test_missing_and_unreadable_files(tmp_path):
  with pytest.raises(UsageError, match=r"'.*nope\.csv' \(--input\) does not "
                     'exist'):
    table_files.read_frame(str(tmp_path / 'nope.csv'), '--input')
  with pytest.raises(UsageError, match='is not a file'):
    table_files.read_frame(str(tmp_path))
  (tmp_path / 'bad.parquet').write_bytes(b'not parquet at all')
  with pytest.raises(UsageError, match='not a readable Parquet file'):
    table_files.read_frame(str(tmp_path / 'bad.parquet'))
  (tmp_path / 'empty.parquet').write_bytes(b'')
  with pytest.raises(UsageError, match='is empty'):
    table_files.read_frame(str(tmp_path / 'empty.parquet'))
  path = _write(tmp_path / 'none.parquet', _frame().iloc[:0])
  with pytest.raises(UsageError, match='header row but no data rows'):
    table_files.read_frame(path)


def test_target_listed_as_feature_is_refused():
  with pytest.raises(UsageError) as e:
    table_files.check_column_selection(('y', 'z'), ('a', 'z'))
  assert "column 'z' is both a target" in str(e.value)
  with pytest.raises(UsageError, match='target_columns is empty'):
    table_files.check_column_selection((), ('a',))
  with pytest.raises(UsageError, match="names column 'a' twice"):
    table_files.check_column_selection(('y',), ('a', 'a'))


def test_train_and_eval_with_different_columns_are_refused(tmp_path):
  train = _frame()
  eval_ = train.rename(columns={'b': 'c'})
  with pytest.raises(UsageError) as e:
    _tables(tmp_path, train, eval_)
  message = str(e.value)
  assert 'train.csv' in message and 'eval.csv' in message
  assert 'only in the training file: b' in message
  assert 'only in the evaluation file: c' in message


def test_bad_eval_file_is_named(tmp_path):
  eval_ = _frame()
  eval_.loc[3, 'a'] = np.inf
  with pytest.raises(UsageError) as e:
    _tables(tmp_path, _frame(), eval_)
  assert "eval.csv' (dataset.eval_path), column 'a', data row 4" in str(
      e.value)


def test_no_feature_left_is_refused(tmp_path):
  with pytest.raises(UsageError, match='no numeric column besides'):
    _tables(tmp_path, pd.DataFrame({'name': ['a', 'b'], 'y': [1.0, 2.0]}))


def test_read_features_ignores_extra_columns_and_names_a_missing_one(
    tmp_path):
  frame = _frame()
  path = _write(tmp_path / 'in.csv', frame)
  x_Nx2 = table_files.read_features(path, ('b', 'a'), '--input')
  np.testing.assert_array_equal(x_Nx2, frame[['b', 'a']].to_numpy(np.float32))
  with pytest.raises(UsageError) as e:
    table_files.read_features(path, ('a', 'zeta'), '--input')
  assert "'--input'" not in str(e.value)  # the flag is named, not quoted
  assert "(--input) has no column 'zeta'" in str(e.value)
  assert 'a feature the model was trained on' in str(e.value)


@pytest.mark.parametrize('suffix', ['.csv', '.parquet'])
def test_predictions_round_trip_with_kept_columns(tmp_path, suffix):
  frame = _frame(7)
  path = _write(tmp_path / f'in{suffix}', frame)
  keep = table_files.pass_through(table_files.read_frame(path), ['id', 'b'],
                                  path)
  rng = np.random.default_rng(1)
  pred_Nx2 = (rng.normal(size=(7, 2)) * 1e3).astype(np.float32)
  out = str(tmp_path / f'pred{suffix}')
  table_files.write_predictions(out, pred_Nx2, ('y', 'z'), keep)
  written = table_files.read_frame(out)
  assert list(written.columns) == ['id', 'b', 'y_pred', 'z_pred']
  assert written['id'].tolist() == frame['id'].tolist()
  np.testing.assert_array_equal(written['b'], frame['b'])
  np.testing.assert_array_equal(
      table_files.numeric_matrix(written, ['y_pred', 'z_pred'], out),
      pred_Nx2)
  assert not os.path.exists(out + '.tmp')


def test_predictions_without_kept_columns(tmp_path):
  out = str(tmp_path / 'pred.csv')
  table_files.write_predictions(out, np.array([[1.5], [-2.0]], np.float32),
                                ('price',))
  assert pathlib.Path(out).read_text() == 'price_pred\n1.5\n-2.0\n'


def test_pass_through_and_writer_refuse_bad_columns(tmp_path):
  frame = _frame()
  path = _write(tmp_path / 'in.csv', frame)
  with pytest.raises(UsageError, match=r"no column 'key' \(asked to keep"):
    table_files.pass_through(frame, ['key'], path)
  clash = pd.DataFrame({'y_pred': np.zeros(5)})
  with pytest.raises(UsageError, match='cannot keep column'):
    table_files.write_predictions(str(tmp_path / 'p.csv'),
                                  np.zeros((5, 1), np.float32), ('y',), clash)
  with pytest.raises(UsageError, match='does not exist; create it first'):
    table_files.write_predictions(str(tmp_path / 'no' / 'p.csv'),
                                  np.zeros((5, 1), np.float32), ('y',))
