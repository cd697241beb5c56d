"""input_pipeline.table_files: reading users' files, checked."""

import numpy as np
import pandas as pd
import pytest
from cli_helpers import small_frame as _frame, write_table as _write

from input_pipeline import table_files
from input_pipeline.errors import DataError


@pytest.mark.parametrize('suffix', ['.csv', '.parquet'])
def test_a_file_is_read_with_its_columns_in_file_order(tmp_path, suffix):
  frame = _frame()
  path = _write(tmp_path / f't{suffix}', frame)
  read = table_files.read_frame(path)
  assert list(read.columns) == ['id', 'a', 'b', 'y']
  np.testing.assert_allclose(read['a'], frame['a'])
  assert read['id'].tolist() == frame['id'].tolist()


@pytest.mark.parametrize('delimiter', [';', '\t', '|'])
def test_the_delimiter_is_read_from_the_header(tmp_path, delimiter):
  path = tmp_path / 't.csv'
  path.write_text(f'a{delimiter}b{delimiter}y\n1{delimiter}2,5{delimiter}3\n'
                  f'4{delimiter}5{delimiter}6\n')
  read = table_files.read_frame(str(path))
  assert list(read.columns) == ['a', 'b', 'y']
  assert read['b'].tolist() == ['2,5', '5']  # commas are data here


def test_missing_cells_read_as_missing(tmp_path):
  path = tmp_path / 't.csv'
  path.write_text('a,b\n1,x\n?,NA\n,y\n')
  read = table_files.read_frame(str(path))
  assert read['a'].isna().tolist() == [False, True, True]
  assert read['b'].isna().tolist() == [False, True, False]


# Each case: file content, then the parts its message must hold.
_BAD_CSV = {
    'empty': (b'', ['is empty']),
    'header_only': (b'a,y\n', ['header row but no data rows']),
    'duplicated': (b'a,y,a\n1,2,3\n', ["column 'a' twice", 'columns 1 and 3']),
    'ragged': (b'a,y\n1,2\n3,4,5\n', ['not a readable CSV', 'line 3',
                                      'comma-separated']),
    'ragged_semicolons': (b'a;y\n1;2\n3;4;5\n', ['semicolon-separated']),
}


@pytest.mark.parametrize('case', sorted(_BAD_CSV))
def test_a_bad_file_is_named_with_what_is_wrong(tmp_path, case):
  content, parts = _BAD_CSV[case]
  bad = tmp_path / 'train.csv'
  bad.write_bytes(content)
  with pytest.raises(DataError) as e:
    table_files.read_frame(str(bad), 'dataset.train_path')
  message = str(e.value)
  assert f"'{bad}' (dataset.train_path)" in message
  for part in parts:
    assert part in message
  assert '\n' not in message


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


def test_pass_through_keeps_columns_and_refuses_a_missing_one(tmp_path):
  frame = _frame()
  path = _write(tmp_path / 'in.csv', frame)
  kept = table_files.pass_through(frame, ['y', 'id'], path)
  assert list(kept.columns) == ['y', 'id'] and len(kept) == len(frame)
  with pytest.raises(DataError, match=r"no column 'key' \(asked to keep"):
    table_files.pass_through(frame, ['key'], path)
  assert isinstance(kept, pd.DataFrame)


@pytest.mark.parametrize('whole', [True, False])
def test_a_file_that_is_not_utf8_is_named_with_the_line_and_the_fix(
    tmp_path, whole):
  bad = tmp_path / 'train.csv'
  bad.write_bytes('town,y\nParis,1\nOrléans,2\n'.encode('latin-1'))
  with pytest.raises(DataError) as e:
    if whole:  # predict's reading
      table_files.read_frame(str(bad), '--input')
    else:  # training's, a chunk at a time
      list(table_files.iter_frames(str(bad), '--input', 1))
  message = str(e.value)
  assert 'is not UTF-8: line 3 holds byte 0xe9 (byte 19 of the file)' in (
      message)
  assert 're-save the file as UTF-8' in message
  assert 'fields as the header' not in message
