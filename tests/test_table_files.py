"""meshfit.input_pipeline.table_files: reading users' files, checked."""

import bz2
import gzip
import os

import numpy as np
import pandas as pd
import pytest
from cli_helpers import small_frame as _frame, write_table as _write

from meshfit.input_pipeline import column_kinds, table_files
from meshfit.input_pipeline.errors import DataError


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
  # Commas are data here: a decimal comma in a semicolon-separated file (a
  # spreadsheet in a decimal-comma locale writes it so), else text.
  assert read['b'].tolist() == ([2.5, 5.0] if delimiter == ';' else
                                ['2,5', '5'])


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


def _decimal_comma_table(tmp_path) -> str:
  """A semicolon-separated file as a decimal-comma spreadsheet writes it."""
  rows = ['a;b;cat;y'] + [f'0,{i:03d};12,250;{c};{i}'
                          for i, c in zip(range(500, 530), 'rgb' * 10)]
  rows[3] = '1.5;12,250;r;3'  # a point reads as a decimal point too
  (tmp_path / 't.csv').write_text('\n'.join(rows) + '\n')
  return str(tmp_path / 't.csv')


def test_a_semicolon_file_reads_decimal_commas_alike_everywhere(tmp_path):
  path = _decimal_comma_table(tmp_path)
  whole = table_files.read_frame(path)  # eval and predict read it so
  chunks = [f for f, _ in table_files.iter_frames(path, '', 7)]  # training
  plan = column_kinds.fit(whole, ('y',), path=path)
  assert [c.kind for c in plan.features] == ['number', 'left_out',
                                              'category']
  want = [0.5, 0.501, 1.5, 0.503]
  np.testing.assert_allclose(plan.encode(whole, path)[0][:4, 0], want)
  np.testing.assert_allclose(plan.encode(chunks[0], path)[0][:4, 0], want)
  assert plan.features[1].reason.startswith('12.25 in every')


@pytest.mark.parametrize('cell', ['0,500', '-0,125', '4,5'])
def test_a_decimal_comma_elsewhere_is_refused_not_read_as_thousands(
    tmp_path, cell):
  frame = pd.DataFrame({'a': ['1,250', '2,500,000'] * 15,
                        'y': np.arange(30.0)})
  frame.loc[7, 'a'] = cell
  frame.to_csv(tmp_path / 't.csv', index=False)
  read = table_files.read_frame(str(tmp_path / 't.csv'))
  with pytest.raises(DataError) as e:
    column_kinds.fit(read, ('y',), path='t.csv')
  assert f"data row 8 (1-based, header not counted): '{cell}' is not a " in (
      str(e.value))
  assert 'a decimal comma is read in a semicolon-separated file' in str(
      e.value)
  plan = column_kinds.fit(read.drop(7), ('y',), path='t.csv')
  np.testing.assert_array_equal(plan.encode(read.iloc[:2], 't.csv')[0][:, 0],
                                [1250, 2500000])


def test_a_symlink_loop_is_named_as_one(tmp_path):
  os.symlink(tmp_path / 'b.csv', tmp_path / 'a.csv')
  os.symlink(tmp_path / 'a.csv', tmp_path / 'b.csv')
  with pytest.raises(DataError, match=r"'.*a\.csv' \(dataset.train_path\) is "
                     'a loop of symbolic links'):
    table_files.read_frame(str(tmp_path / 'a.csv'), 'dataset.train_path')


def test_a_gzip_csv_file_is_read_as_its_text(tmp_path):
  frame = _frame(30)
  frame.to_csv(tmp_path / 't.csv', index=False)
  with gzip.open(tmp_path / 't.csv.gz', 'wb') as f:
    f.write((tmp_path / 't.csv').read_bytes())
  plain = table_files.read_frame(str(tmp_path / 't.csv'))
  packed = str(tmp_path / 't.csv.gz')
  pd.testing.assert_frame_equal(table_files.read_frame(packed), plain)
  chunks = [f for f, _ in table_files.iter_frames(packed, '', 7)]
  pd.testing.assert_frame_equal(pd.concat(chunks, ignore_index=True), plain)
  kept = table_files.pass_through(plain, ['id'], packed)
  assert kept['id'].tolist() == frame['id'].tolist()


def test_another_compression_is_named(tmp_path):
  (tmp_path / 't.csv.bz2').write_bytes(bz2.compress(b'a,y\n1,2\n'))
  with pytest.raises(DataError, match='is compressed with bzip2; .*gzip'):
    table_files.read_frame(str(tmp_path / 't.csv.bz2'), '--input')
  with pytest.raises(DataError, match='is compressed with bzip2'):
    list(table_files.iter_frames(str(tmp_path / 't.csv.bz2'), '--input', 5))
