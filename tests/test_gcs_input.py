"""Tables, prepared copies and generated datasets on gs://, against local.

Every gs:// case runs on the emulator (tests/storage_fixtures.py) and is
compared with the same files prepared or read locally: the prepared parts
must be the same bytes, whichever side the files or the data_dir are on.
"""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pandas as pd
import pytest
from cli_helpers import ROOT
from meshfit.configs import csv as csv_config
from model_helpers import dataset_config

from meshfit import storage
from meshfit.input_pipeline import csv_regression, file_keys, table_files, tables
from meshfit.input_pipeline.errors import DataError
from meshfit.input_pipeline.store import Store
from meshfit.data import splits as splits_lib


def _frame(n: int, seed: int) -> pd.DataFrame:
  """Numbers with gaps, text categories, dates and a few missing targets."""
  rng = np.random.default_rng(seed)
  a = rng.normal(size=n)
  a[rng.random(n) < 0.1] = np.nan
  y = 3 * np.nan_to_num(a) + rng.normal(size=n)
  y[rng.random(n) < 0.05] = np.nan
  return pd.DataFrame({
      'a': a, 'b': rng.normal(size=n),
      'kind': rng.choice(['red', 'green', 'blue', None], n),
      'day': pd.date_range('2024-01-01', periods=n, freq='D').strftime(
          '%Y-%m-%d'), 'y': y})


def _write(frame: pd.DataFrame, path: str) -> None:
  """`frame` as CSV or Parquet (by the name) at a local path or URL."""
  with storage.open(path, 'wb') as f:
    if table_files.is_parquet(path):
      # Small row groups: a file of several, read a group at a time.
      frame.to_parquet(f, index=False, row_group_size=64)
    else:
      f.write(frame.to_csv(index=False).encode())


@pytest.fixture
def roots(tmp_path, gcs_dir) -> dict[str, str]:
  """The same tables (train-0..2 as Parquet and CSV, eval.csv, all.csv),
  in a local directory and under a gs:// prefix."""
  local = str(tmp_path / 'files')
  os.makedirs(local)
  train = _frame(300, 0)
  for root in (local, gcs_dir):
    for i, rows in enumerate(np.array_split(np.arange(300), 3)):
      _write(train.iloc[rows], storage.join(root, f'train-{i}.parquet'))
      _write(train.iloc[rows], storage.join(root, f'train-{i}.csv'))
    _write(train, storage.join(root, 'all.csv'))
    _write(_frame(50, 1), storage.join(root, 'eval.csv'))
  return {'local': local, 'gcs': gcs_dir, 'tmp': str(tmp_path)}


def _prepare(root: str, train: str, data_dir: str, **kwargs) -> str:
  paths = ','.join(storage.join(root, p) for p in train.split(','))
  return csv_regression.prepare(paths, storage.join(root, 'eval.csv'),
                                ('y',), (), (), data_dir, **kwargs)


def _contents(directory: str) -> dict[str, object]:
  """A prepared directory's files, but where its files came from: the
  parts' bytes, the plan and counts; the manifest's parts and rows."""
  out = {}
  for name in storage.listdir(directory):
    path = storage.join(directory, name)
    if name.endswith('.f32'):
      out[name] = storage.read_bytes(path)
    elif name == csv_regression.MANIFEST:
      manifest = json.loads(storage.read_text(path))
      out[name] = {k: manifest[k] for k in ('plan', 'parts', 'rows',
                                            'rows_without_target')}
    elif name.endswith('.json'):
      out[name] = {k: v for k, v in json.loads(storage.read_text(path)).items()
                   if k != 'path'}
  return out


@pytest.mark.parametrize('train', ['all.csv', 'train-1.parquet',
                                   'train-*.parquet', 'train-*.csv',
                                   'train-0.csv,train-1.parquet'])
def test_tables_on_gs_prepare_the_same_bytes_as_local(roots, train,
                                                     monkeypatch):
  monkeypatch.setattr(csv_regression, 'CHUNK_ROWS', 37)  # several chunks
  local = _prepare(roots['local'], train, f'{roots["tmp"]}/d_local')
  remote = _prepare(roots['gcs'], train, f'{roots["tmp"]}/d_gcs')
  expected = _contents(local)
  assert _contents(remote) == expected
  assert len([n for n in expected if n.endswith('.f32')]) == (
      4 if '*' in train else 1 + len(train.split(',')))
  manifest = csv_regression.manifest(remote)
  assert manifest['eval_path'] == f'{roots["gcs"]}/eval.csv'
  assert all(p.startswith(roots['gcs']) for p in manifest['train_path'])


def test_a_gs_data_dir_is_prepared_once_and_read_back(roots, gcs_dir,
                                                      monkeypatch):
  data_dir = f'{gcs_dir}/data'
  local = _prepare(roots['local'], 'train-*.parquet', f'{roots["tmp"]}/d')
  remote = _prepare(roots['gcs'], 'train-*.parquet', data_dir)
  assert remote.startswith(f'{data_dir}/csv_regression/sha256_')
  assert _contents(remote) == _contents(local)

  def fail(*args):
    raise AssertionError('prepared again')

  monkeypatch.setattr(csv_regression, '_prepare', fail)
  assert _prepare(roots['gcs'], 'train-*.parquet', data_dir) == remote
  for split in csv_regression.SPLITS:
    a = csv_regression.read_split(local, split)
    b = csv_regression.read_split(remote, split)
    np.testing.assert_array_equal(a.x_NxF, b.x_NxF)
    np.testing.assert_array_equal(a.y_NxT, b.y_NxT)
    assert a.plan == b.plan


def test_the_store_reads_blocks_from_gs_as_locally(roots, gcs_dir):
  local = _prepare(roots['local'], 'train-*.csv', f'{roots["tmp"]}/d')
  remote = _prepare(roots['local'], 'train-*.csv', f'{gcs_dir}/data')
  a = csv_regression.open_split(local, 'train')
  b = csv_regression.open_split(remote, 'train')
  try:
    assert len(b.parts) == 3 and b.num_examples == a.num_examples
    n = a.num_examples
    # Within a part, across parts, all of it.
    for start, stop in [(0, 5), (90, 110), (3, n - 3), (0, n)]:
      np.testing.assert_array_equal(b.read_rows(start, stop),
                                    a.read_rows(start, stop))
  finally:
    a.close()
    b.close()


def test_a_part_missing_from_a_gs_data_dir_is_named(roots, gcs_dir):
  remote = _prepare(roots['local'], 'train-*.csv', f'{gcs_dir}/data')
  storage.remove(storage.join(remote, 'train-00001.f32'))
  with pytest.raises(DataError, match=r'train-00001\.f32.*is missing'):
    csv_regression.open_split(remote, 'train')


def test_two_processes_prepare_gs_files_into_a_gs_data_dir(roots, gcs_dir):
  """Two threads stand for two processes, as in test_prepare: each takes
  its share; the parts are one local process's, byte for byte."""
  one = _prepare(roots['local'], 'train-*.parquet', f'{roots["tmp"]}/d')
  barrier = threading.Barrier(2)
  shared, results, errors = {}, {}, []

  def gather(array):
    shared[threading.current_thread().name] = array
    barrier.wait(timeout=60)
    every = np.stack([shared['0'], shared['1']])
    barrier.wait(timeout=60)
    return every

  def process(index):
    try:
      results[index] = _prepare(
          roots['gcs'], 'train-*.parquet', f'{gcs_dir}/data',
          process_index=index, process_count=2, gather=gather,
          barrier=lambda name: barrier.wait(timeout=60))
    except Exception as e:  # noqa: BLE001  (reported below)
      errors.append(e)

  threads = [threading.Thread(target=process, args=(i,), name=str(i))
             for i in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors and results[0] == results[1]
  assert _contents(results[0]) == _contents(one)


def test_an_objects_key_follows_its_content_not_its_bytes_read(
    gcs_dir, monkeypatch):
  url = f'{gcs_dir}/t.csv'
  _write(pd.DataFrame({'a': [1, 2], 'y': [3, 4]}), url)
  first = file_keys.file_digest(url)
  # The same bytes written again: the same content, the same key.
  _write(pd.DataFrame({'a': [1, 2], 'y': [3, 4]}), url)
  assert file_keys.file_digest(url) == first
  # Other bytes of the same size: another key.
  _write(pd.DataFrame({'a': [1, 2], 'y': [3, 5]}), url)
  second = file_keys.file_digest(url)
  assert second != first and len(second) == 32

  def no_read(*args, **kwargs):
    raise AssertionError('the object was read to key it')

  monkeypatch.setattr(storage, 'open', no_read)
  monkeypatch.setattr(storage, 'RangeReader', no_read)
  assert file_keys.file_digest(url) == second


def test_a_composite_object_is_keyed_by_its_generation(gcs_dir, monkeypatch):
  """GCS gives a composed object no MD5 (the emulator does): its key then
  changes with every write, even of the same bytes."""
  url = f'{gcs_dir}/t.csv'
  info = file_keys.gcs.info

  def composite(u):
    found = info(u)
    return found and {k: v for k, v in found.items() if k != 'md5Hash'}

  monkeypatch.setattr(file_keys.gcs, 'info', composite)
  _write(pd.DataFrame({'a': [1], 'y': [2]}), url)
  first = file_keys.file_digest(url)
  assert file_keys.file_digest(url) == first
  _write(pd.DataFrame({'a': [1], 'y': [2]}), url)
  assert file_keys.file_digest(url) != first


@pytest.mark.parametrize('name', ['all.csv', 'train-2.parquet'])
def test_read_frame_reads_gs_as_local(roots, name):
  # What predict reads its --input with.
  pd.testing.assert_frame_equal(
      table_files.read_frame(storage.join(roots['gcs'], name)),
      table_files.read_frame(storage.join(roots['local'], name)))


def _dataset(root: str, data_dir: str, train: str = 'train-*.parquet'):
  dataset = csv_config.get_config().dataset
  dataset.data_dir = data_dir
  dataset.train_path = ','.join(storage.join(root, p)
                                for p in train.split(','))
  dataset.eval_path = storage.join(root, 'eval.csv')
  dataset.target_columns = ('y',)
  dataset.validation = 0
  return dataset


def test_splits_and_the_eval_file_from_gs_encode_as_local(roots):
  local = splits_lib.load_splits(dataset_config(
      _dataset(roots['local'], f'{roots["tmp"]}/d')), seed=0)
  remote_config = dataset_config(
      _dataset(roots['gcs'], f'{roots["tmp"]}/d'))
  remote = splits_lib.load_splits(remote_config, seed=0)
  for a, b in [(local.train, remote.train), (local.eval, remote.eval)]:
    np.testing.assert_array_equal(a.x_NxF, b.x_NxF)
    np.testing.assert_array_equal(a.y_NxT, b.y_NxT)
  # What eval reads with a checkpoint's plan.
  table = splits_lib.load_eval_split(remote_config, local.train.plan)
  np.testing.assert_array_equal(table.x_NxF, local.eval.x_NxF)
  np.testing.assert_array_equal(table.y_NxT, local.eval.y_NxT)


def test_a_streamed_table_is_read_from_a_gs_data_dir(roots, gcs_dir):
  local = _dataset(roots['local'], f'{roots["tmp"]}/d')
  remote = _dataset(roots['gcs'], f'{gcs_dir}/data')
  for dataset in (local, remote):
    dataset.resident_table_mb = 0
    dataset.validation = 0.1
  a = splits_lib.load_splits(dataset_config(local), seed=0)
  b = splits_lib.load_splits(dataset_config(remote), seed=0)
  assert isinstance(b.train, Store) and b.train.directory.startswith(gcs_dir)
  np.testing.assert_array_equal(b.train.read_rows(0, b.train.num_examples),
                                a.train.read_rows(0, a.train.num_examples))
  np.testing.assert_array_equal(b.validation.x_NxF, a.validation.x_NxF)
  np.testing.assert_array_equal(b.blocks.rows(), a.blocks.rows())


@pytest.mark.slow  # builds both synthetic datasets with TFDS
def test_a_generated_dataset_in_a_gs_data_dir(gcs_dir, data_dir,
                                              monkeypatch):
  name = 'synthetic_regression/linear'
  directory = tables.prepare_generated(name, gcs_dir)
  assert directory == f'{gcs_dir}/synthetic_regression/linear/1.0.0'
  assert storage.isfile(f'{directory}/dataset_info.json')
  local = tables.read_split(tables.prepare_generated(name, data_dir), 'train')
  first = tables.read_split(directory, 'train')
  assert storage.isfile(f'{directory}/meshfit_tables.v2/train.npz')

  def fail(*args):
    raise AssertionError('generated or parsed again')

  monkeypatch.setattr(tables, 'prepare', fail)
  monkeypatch.setattr(tables, 'load_table', fail)
  assert tables.prepare_generated(name, gcs_dir) == directory
  again = tables.read_split(directory, 'train')
  for table in (first, again):
    np.testing.assert_array_equal(table.x_NxF, local.x_NxF)
    np.testing.assert_array_equal(table.y_NxT, local.y_NxT)


def test_a_damaged_generated_dataset_on_gs_is_named_by_its_url(gcs_dir):
  directory = tables.prepare_generated('synthetic_regression/linear',
                                       gcs_dir)
  storage.remove(f'{directory}/features.json')
  with pytest.raises(DataError) as e:
    tables.read_split(directory, 'test')
  assert directory in str(e.value) and 'meshfit-tfds-' not in str(e.value)


# The bad inputs of a gs:// table: each is one line naming the setting and what
# is wrong (DataError; train.py prints it as `error: ...`, exit 2).
_BAD = {
    'glob_matches_nothing': (
        {'train_path': '{gcs}/nothing-*.parquet'},
        "dataset.train_path '{gcs}/nothing-*.parquet' matches no file"),
    'missing_bucket': (
        {'train_path': 'gs://no-such-bucket-29/train.csv'},
        'dataset.train_path: gs://no-such-bucket-29/train.csv: bucket '
        'gs://no-such-bucket-29 does not exist'),
    'missing_object': (
        {'eval_path': '{gcs}/nope.csv'},
        "'{gcs}/nope.csv' (dataset.eval_path) does not exist"),
    'unknown_scheme_train_path': (
        {'train_path': 's4://bucket/x.csv'},
        'dataset.train_path: s4://bucket/x.csv: unknown URL scheme s4://'),
    'unknown_scheme_eval_path': (
        {'eval_path': 's4://bucket/x.csv'},
        'dataset.eval_path: s4://bucket/x.csv: unknown URL scheme s4://'),
    'unknown_scheme_data_dir': (
        {'data_dir': 's4://bucket/data'},
        'dataset.data_dir: s4://bucket/data: unknown URL scheme s4://'),
    'missing_bucket_data_dir': (
        {'data_dir': 'gs://no-such-bucket-29/data'},
        'dataset.data_dir: gs://no-such-bucket-29/data: bucket '
        'gs://no-such-bucket-29 does not exist'),
}


def _bad(case: str, roots: dict) -> tuple[dict, str]:
  changes, message = _BAD[case]
  return ({k: v.format(gcs=roots['gcs']) for k, v in changes.items()},
          message.format(gcs=roots['gcs']))


@pytest.mark.parametrize('case', sorted(_BAD))
def test_bad_gs_inputs_are_one_line_naming_the_setting(roots, case):
  changes, message = _bad(case, roots)
  dataset = _dataset(roots['gcs'], f'{roots["tmp"]}/d')
  for key, value in changes.items():
    dataset[key] = value
  with pytest.raises(DataError) as e:
    splits_lib.load_splits(dataset_config(dataset), seed=0)
  assert message in str(e.value) and '\n' not in str(e.value), str(e.value)


def _train_py(*args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=8')
  return subprocess.run(
      [sys.executable, 'train.py', '--config=configs/csv.py',
       '--config.dataset.target_columns=y', '--config.num_train_steps=40',
       '--config.log_every_steps=20', '--config.eval_every_steps=40',
       '--config.checkpoint_every_steps=40',
       # Held-out rows rather than folds: a streamed table can be validated.
       '--config.dataset.validation=0.1', *args],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
      check=False)


@pytest.mark.slow
def test_train_py_on_gs_tables_reports_what_local_tables_do(roots):
  """The gs:// run also keeps its prepared copy on gs:// and streams the
  training table from it, as the local run streams its own from disk: the
  same batches, bit for bit."""
  metrics = {}
  for side in ('local', 'gcs'):
    workdir = f'{roots["tmp"]}/run_{side}'
    data_dir = (f'{workdir}_data' if side == 'local'
                else f'{roots["gcs"]}/data')
    result = _train_py(
        f'--workdir={workdir}', f'--config.dataset.data_dir={data_dir}',
        f'--config.dataset.train_path={roots[side]}/train-*.parquet',
        f'--config.dataset.eval_path={roots[side]}/eval.csv',
        '--config.dataset.resident_table_mb=0')
    assert result.returncode == 0, result.stderr[-3000:]
    with open(f'{workdir}/metrics.jsonl', encoding='utf-8') as f:
      metrics[side] = [json.loads(line) for line in f]
  assert len(storage.glob(f'{roots["gcs"]}/data/csv_regression/*/*.f32')) == 4
  evals = [m for m in metrics['local'] if 'eval/rmse' in m]
  assert evals and evals[-1]['step'] == 40
  drop = ('time', 'seconds', 'per_sec', 'steps_per', 'wall')
  for record in (*metrics['local'], *metrics['gcs']):
    for key in [k for k in record if any(d in k for d in drop)]:
      del record[key]
  assert metrics['gcs'] == metrics['local']


# Every case of _BAD is asserted in-process above; these two end to end.
# (An unknown scheme in data_dir, through train.py: test_gcs_runs.)
@pytest.mark.slow
@pytest.mark.parametrize('case', ['glob_matches_nothing', 'missing_bucket'])
def test_train_py_bad_gs_input_exits_2_with_one_error_line(roots, case):
  changes, message = _bad(case, roots)
  paths = {'train_path': f'{roots["gcs"]}/train-*.parquet',
           'eval_path': f'{roots["gcs"]}/eval.csv',
           'data_dir': f'{roots["tmp"]}/d', **changes}
  workdir = f'{roots["tmp"]}/run'
  result = _train_py(f'--workdir={workdir}',
                     *(f'--config.dataset.{k}={v}' for k, v in paths.items()))
  assert result.returncode == 2, result.stderr[-3000:]
  assert 'Traceback' not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last == f'error: {message}' or (
      last.startswith('error: ') and message in last), last
  assert result.stderr.count('error: ') == 1
