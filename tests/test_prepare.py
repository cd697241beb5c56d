"""Preparing a user's table a chunk at a time, from one file or several, by
one process or by several each preparing its share."""

import filecmp
import os
import threading

import numpy as np
import pandas as pd
import pytest

from meshfit.input_pipeline import csv_regression, file_keys
from meshfit.input_pipeline.errors import DataError


def _frame(n: int, seed: int) -> pd.DataFrame:
  """Numbers with gaps, text categories, dates, booleans, missing targets."""
  rng = np.random.default_rng(seed)
  a = rng.normal(size=n)
  a[rng.random(n) < 0.1] = np.nan
  y = rng.normal(size=n)
  y[rng.random(n) < 0.05] = np.nan
  return pd.DataFrame({
      'a': a, 'kind': rng.choice(['red', 'green', 'blue', None], n),
      'day': pd.date_range('2024-01-01', periods=n, freq='D').strftime(
          '%Y-%m-%d'),
      'flag': rng.choice(['true', 'false'], n), 'y': y})


def _prepare(train, eval_path, data_dir, **kwargs):
  return csv_regression.prepare(train, eval_path, ('y',), (), (), data_dir,
                                **kwargs)


def _rows(directory):
  return {split: csv_regression.read_split(directory, split)
          for split in csv_regression.SPLITS}


@pytest.fixture
def table(tmp_path):
  frame = _frame(100, 0)
  frame.to_csv(tmp_path / 'all.csv', index=False)
  for i, rows in enumerate(np.array_split(np.arange(100), 3)):
    frame.iloc[rows].to_csv(tmp_path / f'part-{i}.csv', index=False)
  _frame(30, 1).to_csv(tmp_path / 'eval.csv', index=False)
  return tmp_path


def test_chunks_prepare_what_a_whole_file_does(table, monkeypatch):
  whole = _rows(_prepare(str(table / 'all.csv'), str(table / 'eval.csv'),
                         str(table / 'whole')))
  monkeypatch.setattr(csv_regression, 'CHUNK_ROWS', 7)
  chunked = _rows(_prepare(str(table / 'all.csv'), str(table / 'eval.csv'),
                           str(table / 'chunked')))
  for split in csv_regression.SPLITS:
    np.testing.assert_array_equal(whole[split].x_NxF, chunked[split].x_NxF)
    np.testing.assert_array_equal(whole[split].y_NxT, chunked[split].y_NxT)
    assert whole[split].plan == chunked[split].plan
  assert whole['train'].num_examples == _frame(100, 0)['y'].notna().sum()


@pytest.mark.parametrize('train', ['part-*.csv',
                                   'part-0.csv,part-1.csv, part-2.csv'])
def test_several_files_are_one_table_in_order(table, train):
  whole = _rows(_prepare(str(table / 'all.csv'), str(table / 'eval.csv'),
                         str(table / 'whole')))
  paths = ','.join(str(table / p.strip()) for p in train.split(','))
  directory = _prepare(paths, str(table / 'eval.csv'), str(table / 'parts'))
  parts = _rows(directory)
  np.testing.assert_array_equal(whole['train'].x_NxF, parts['train'].x_NxF)
  manifest = csv_regression.manifest(directory)
  assert len(manifest['parts']['train']) == 3
  assert manifest['train_key'] != csv_regression.manifest(
      _prepare(str(table / 'all.csv'), str(table / 'eval.csv'),
               str(table / 'whole')))['train_key']


def test_a_glob_that_matches_nothing_or_a_file_twice_is_refused(table):
  with pytest.raises(DataError, match='matches no file'):
    _prepare(str(table / 'nothing-*.csv'), str(table / 'eval.csv'),
             str(table / 'd'))
  with pytest.raises(DataError, match='twice'):
    _prepare(f'{table}/part-*.csv,{table}/part-1.csv',
             str(table / 'eval.csv'), str(table / 'd'))


def test_a_bad_cell_in_a_later_chunk_names_its_row(table, monkeypatch):
  frame = _frame(100, 0)
  frame['a'] = frame['a'].astype(object)
  frame.loc[86, 'a'] = 'oops'
  frame.to_csv(table / 'bad.csv', index=False)
  monkeypatch.setattr(csv_regression, 'CHUNK_ROWS', 10)
  # The plan's sample is the first rows only: the cell is found encoding.
  monkeypatch.setattr(csv_regression, 'PLAN_SAMPLE_ROWS', 40)
  with pytest.raises(DataError, match=r"column 'a', data row 87 "):
    _prepare(str(table / 'bad.csv'), str(table / 'eval.csv'),
             str(table / 'd'))
  assert not os.path.exists(table / 'd' / 'csv_regression')


def test_without_an_eval_file_the_copy_has_no_test_part(table, monkeypatch):
  with_eval = _prepare(str(table / 'all.csv'), str(table / 'eval.csv'),
                       str(table / 'd'))
  alone = _prepare(str(table / 'all.csv'), '', str(table / 'd'))
  assert alone != with_eval  # keyed on the files: another copy
  manifest = csv_regression.manifest(alone)
  assert manifest['parts']['test'] == [] and manifest['rows']['test'] == 0
  assert manifest['eval_path'] is None
  assert not any(n.startswith('test') for n in os.listdir(alone))
  np.testing.assert_array_equal(
      csv_regression.read_split(alone, 'train').x_NxF,
      csv_regression.read_split(with_eval, 'train').x_NxF)
  with pytest.raises(DataError, match='has no eval file'):
    csv_regression.open_split(alone, 'test')
  monkeypatch.setattr(csv_regression, '_prepare', None)  # found, not made
  assert _prepare(str(table / 'all.csv'), None, str(table / 'd')) == alone


def test_a_changed_file_is_another_dataset(table):
  first = _prepare(str(table / 'all.csv'), str(table / 'eval.csv'),
                   str(table / 'd'))
  _frame(100, 5).to_csv(table / 'all.csv', index=False)
  second = _prepare(str(table / 'all.csv'), str(table / 'eval.csv'),
                    str(table / 'd'))
  assert first != second
  assert (csv_regression.manifest(first)['train_key']
          != csv_regression.manifest(second)['train_key'])


def test_two_processes_prepare_their_shares_into_the_same_files(
    table, monkeypatch):
  """Two threads stand for two processes: each hashes and encodes its
  files (1 and 3 of 3 for process 0, with the eval file to encode; 2 and
  the eval file to hash for process 1), and the result is byte for byte
  one process's."""
  one = _prepare(str(table / 'part-*.csv'), str(table / 'eval.csv'),
                 str(table / 'one'))
  encoded, hashed = {0: [], 1: []}, {0: [], 1: []}
  encode = csv_regression._encode_part  # noqa: SLF001
  digest = file_keys.file_digest
  barrier = threading.Barrier(2)
  shared = {}

  def recording(directory, plan, part, path, source):
    encoded[int(threading.current_thread().name)].append(part)
    return encode(directory, plan, part, path, source)

  def hashing(path, source=''):
    hashed[int(threading.current_thread().name)].append(
        os.path.basename(path))
    return digest(path, source)

  def gather(array):
    shared[threading.current_thread().name] = array
    barrier.wait(timeout=60)
    every = np.stack([shared['0'], shared['1']])
    barrier.wait(timeout=60)
    return every

  monkeypatch.setattr(csv_regression, '_encode_part', recording)
  monkeypatch.setattr(file_keys, 'file_digest', hashing)
  results, errors = {}, []

  def process(index):
    try:
      results[index] = _prepare(
          str(table / 'part-*.csv'), str(table / 'eval.csv'),
          str(table / 'two'), process_index=index, process_count=2,
          barrier=lambda name: barrier.wait(timeout=60), gather=gather)
    except Exception as e:  # noqa: BLE001  (reported below)
      errors.append(e)

  threads = [threading.Thread(target=process, args=(i,), name=str(i))
             for i in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors and results[0] == results[1]
  assert sorted(encoded[0]) == ['test-00000', 'train-00000', 'train-00002']
  assert encoded[1] == ['train-00001']
  assert hashed == {0: ['part-0.csv', 'part-2.csv'],
                    1: ['part-1.csv', 'eval.csv']}
  two = results[0]
  assert os.path.basename(one) == os.path.basename(two)
  names = sorted(n for n in os.listdir(one) if n.endswith(('.f32', '.json'))
                 and n != csv_regression.MANIFEST)
  assert names == sorted(n for n in os.listdir(two)
                         if n.endswith(('.f32', '.json'))
                         and n != csv_regression.MANIFEST)
  for name in names:
    if name.endswith('.f32'):
      assert filecmp.cmp(os.path.join(one, name), os.path.join(two, name),
                         shallow=False), name
  for split in csv_regression.SPLITS:
    np.testing.assert_array_equal(_rows(one)[split].x_NxF,
                                  _rows(two)[split].x_NxF)
