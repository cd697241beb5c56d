"""input_pipeline.table_files: users' files, with every cell checked."""

import numpy as np
import pandas as pd
import pytest
from cli_helpers import small_frame as _frame, write_table as _write

from input_pipeline import table_files
from input_pipeline.errors import DataError


@pytest.mark.parametrize('suffix', ['.csv', '.parquet'])
def test_numeric_matrix_holds_named_columns_in_file_order(tmp_path, suffix):
  frame = _frame()
  path = _write(tmp_path / f't{suffix}', frame)
  x_Nx2 = table_files.numeric_matrix(table_files.read_frame(path), ['b', 'a'],
                                     path)
  assert x_Nx2.dtype == np.float32
  np.testing.assert_array_equal(
      x_Nx2, frame[['b', 'a']].to_numpy(np.float32))

def test_earliest_bad_row_over_all_columns_is_reported(tmp_path):
  path = tmp_path / 't.csv'
  path.write_bytes(b'a,b\n1,2\n3,x\n,4\n')
  with pytest.raises(DataError, match=r"column 'b', data row 2"):
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
  with pytest.raises(DataError) as e:
    table_files.numeric_matrix(table_files.read_frame(path), ['a'], path)
  assert f"'{path}', column 'a', data row 3" in str(e.value)
  assert problem in str(e.value)

def test_missing_and_unreadable_files(tmp_path):
  with pytest.raises(DataError, match=r"'.*nope\.csv' \(--input\) does not "
                     'exist'):
    table_files.read_frame(str(tmp_path / 'nope.csv'), '--input')
  with pytest.raises(DataError, match='is not a file'):
    table_files.read_frame(str(tmp_path))
  (tmp_path / 'bad.parquet').write_bytes(b'not parquet at all')
  with pytest.raises(DataError, match='not a readable Parquet file'):
    table_files.read_frame(str(tmp_path / 'bad.parquet'))
  (tmp_path / 'empty.parquet').write_bytes(b'')
  with pytest.raises(DataError, match='is empty'):
    table_files.read_frame(str(tmp_path / 'empty.parquet'))
  path = _write(tmp_path / 'none.parquet', _frame().iloc[:0])
  with pytest.raises(DataError, match='header row but no data rows'):
    table_files.read_frame(path)


def test_numeric_matrix_ignores_extra_columns_and_names_a_missing_one(
    tmp_path):
  frame = _frame()
  path = _write(tmp_path / 'in.csv', frame)
  read = lambda names: table_files.numeric_matrix(  # noqa: E731
      table_files.read_frame(path, '--input'), names, path, '--input',
      role='a feature the model was trained on')
  np.testing.assert_array_equal(read(('b', 'a')),
                                frame[['b', 'a']].to_numpy(np.float32))
  with pytest.raises(DataError) as e:
    read(('a', 'zeta'))
  assert "'--input'" not in str(e.value)  # the flag is named, not quoted
  assert "(--input) has no column 'zeta'" in str(e.value)
  assert 'a feature the model was trained on' in str(e.value)


def test_pass_through_refuses_a_missing_column(tmp_path):
  frame = _frame()
  path = _write(tmp_path / 'in.csv', frame)
  with pytest.raises(DataError, match=r"no column 'key' \(asked to keep"):
    table_files.pass_through(frame, ['key'], path)
