"""input_pipeline.columns: the features and targets of a training pair."""

import pathlib

import numpy as np
import pandas as pd
import pytest
from cli_helpers import small_frame as _frame, write_table as _write

from input_pipeline import columns
from input_pipeline.errors import DataError


def _tables(tmp_path, train: pd.DataFrame, eval_: pd.DataFrame | None = None,
            targets=('y',), features=(), suffix='.csv'):
  paths = []
  for name, frame in (('train', train), ('eval', train if eval_ is None
                                          else eval_)):
    path = _write(tmp_path / f'{name}{suffix}', frame)
    paths.append((path, pathlib.Path(path).read_bytes()))
  return columns.read_training_tables(*paths, targets, features)

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
  with pytest.raises(DataError) as e:
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
  with pytest.raises(DataError) as e:
    columns.read_training_tables(
        (str(bad), bad.read_bytes()), (str(good), good.read_bytes()),
        ('y',), ())
  message = str(e.value)
  assert f"'{bad}' (dataset.train_path)" in message
  for part in parts:
    assert part in message
  assert '\n' not in message


def test_train_and_eval_with_different_columns_are_refused(tmp_path):
  train = _frame()
  eval_ = train.rename(columns={'b': 'c'})
  with pytest.raises(DataError) as e:
    _tables(tmp_path, train, eval_)
  message = str(e.value)
  assert 'train.csv' in message and 'eval.csv' in message
  assert 'only in the training file: b' in message
  assert 'only in the evaluation file: c' in message

def test_bad_eval_file_is_named(tmp_path):
  eval_ = _frame()
  eval_.loc[3, 'a'] = np.inf
  with pytest.raises(DataError) as e:
    _tables(tmp_path, _frame(), eval_)
  assert "eval.csv' (dataset.eval_path), column 'a', data row 4" in str(
      e.value)

def test_no_feature_left_is_refused(tmp_path):
  with pytest.raises(DataError, match='no numeric column besides'):
    _tables(tmp_path, pd.DataFrame({'name': ['a', 'b'], 'y': [1.0, 2.0]}))
