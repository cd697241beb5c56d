"""Tests for the csv_regression builder, its config keys and train.py on CSV."""

import os

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('NO_GCE_CHECK', 'true')

import hashlib  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from model_helpers import dataset_config
from cli_helpers import regression_frame  # noqa: E402

from meshfit.configs import csv as csv_config  # noqa: E402
from meshfit.input_pipeline import file_keys, table_files  # noqa: E402
from meshfit.input_pipeline.errors import DataError  # noqa: E402
from meshfit import config as config_lib
from meshfit.data import splits as splits_lib  # noqa: E402
from meshfit.errors import UsageError  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


_frame = regression_frame


def _dataset(tmp_path, train: str, eval_: str, targets=('y',), features=()
             ) -> ml_collections.ConfigDict:
  dataset = csv_config.get_config().dataset
  dataset.data_dir = str(tmp_path / 'tfds')
  dataset.train_path = train
  dataset.eval_path = eval_
  dataset.target_columns = targets
  dataset.feature_columns = features
  dataset.validation = 0  # every row of the file in `train`
  return dataset


@pytest.fixture()
def files(tmp_path):
  train, eval_ = _frame(40, 0), _frame(11, 1)
  train.to_csv(tmp_path / 'train.csv', index=False)
  eval_.to_csv(tmp_path / 'eval.csv', index=False)
  return train, eval_, str(tmp_path / 'train.csv'), str(tmp_path / 'eval.csv')


def _load(dataset: ml_collections.ConfigDict) -> splits_lib.Splits:
  return splits_lib.load_splits(dataset_config(dataset), seed=0)


def _prepared_keys(tmp_path) -> list[str]:
  root = tmp_path / 'tfds' / 'csv_regression'
  return sorted(p.name for p in root.iterdir())


def test_splits_hold_the_files_rows_in_order_with_their_names(tmp_path, files):
  train, eval_, train_path, eval_path = files
  splits = _load(_dataset(tmp_path, train_path, eval_path))
  assert splits.train.feature_names == ('a', 'b', 'c', 'z')
  assert splits.train.target_names == ('y',)
  assert splits.eval.feature_names == ('a', 'b', 'c', 'z')
  np.testing.assert_array_equal(
      splits.train.x_NxF, train[['a', 'b', 'c', 'z']].to_numpy(np.float32))
  np.testing.assert_array_equal(splits.eval.y_NxT,
                                eval_[['y']].to_numpy(np.float32))


def test_two_targets_and_explicit_features(tmp_path, files):
  train, _, train_path, eval_path = files
  splits = _load(
      _dataset(tmp_path, train_path, eval_path, targets=('z', 'y'),
               features=('b', 'a')))
  assert splits.train.feature_names == ('b', 'a')
  assert splits.train.target_names == ('z', 'y')
  np.testing.assert_array_equal(splits.train.x_NxF,
                                train[['b', 'a']].to_numpy(np.float32))
  np.testing.assert_array_equal(splits.train.y_NxT,
                                train[['z', 'y']].to_numpy(np.float32))


def test_parquet_and_csv_files_mix(tmp_path, files):
  train, eval_, _, eval_path = files
  train_path = str(tmp_path / 'train.parquet')
  train.to_parquet(train_path, index=False)
  splits = _load(_dataset(tmp_path, train_path, eval_path))
  np.testing.assert_array_equal(
      splits.train.x_NxF, train[['a', 'b', 'c', 'z']].to_numpy(np.float32))
  assert splits.eval.num_examples == len(eval_)


def test_unchanged_files_are_reused_and_changed_ones_prepared_again(
    tmp_path, files, monkeypatch):
  train, _, train_path, eval_path = files
  dataset = _dataset(tmp_path, train_path, eval_path)
  first = _load(dataset)
  [first_key] = _prepared_keys(tmp_path)

  def fail(*args, **kwargs):
    raise AssertionError('the files were parsed again')

  # Unchanged content, even when moved, comes from the prepared copy.
  moved = str(tmp_path / 'moved.csv')
  os.rename(train_path, moved)
  with monkeypatch.context() as patch:
    patch.setattr(table_files, 'parse', fail)
    splits = _load(_dataset(tmp_path, moved, eval_path))
  assert _prepared_keys(tmp_path) == [first_key]
  np.testing.assert_array_equal(splits.train.x_NxF, first.train.x_NxF)
  assert splits.train.plan == first.train.plan

  changed = train.copy()
  changed.loc[5, 'a'] = 123.0
  changed.to_csv(moved, index=False)
  splits = _load(_dataset(tmp_path, moved, eval_path))
  assert len(_prepared_keys(tmp_path)) == 2
  assert splits.train.x_NxF[5, 0] == 123.0
  assert splits.train_key != first.train_key  # checkpoints tell them apart

  # A different column selection of the same files is another dataset.
  _load(_dataset(tmp_path, moved, eval_path, features=('a',)))
  assert len(_prepared_keys(tmp_path)) == 3


def test_missing_values_categories_and_missing_targets(tmp_path,
                                                       absl_caplog):
  rng = np.random.default_rng(0)
  frame = pd.DataFrame({'a': rng.normal(size=30),
                        'kind': rng.choice(['x', 'y'], 30),
                        'y': rng.normal(size=30)})
  frame.loc[2, 'a'] = np.nan
  frame.loc[[4, 9], 'y'] = np.nan
  frame.to_csv(tmp_path / 'train.csv', index=False)
  frame.iloc[:10].to_csv(tmp_path / 'eval.csv', index=False)
  splits = _load(_dataset(tmp_path, str(tmp_path / 'train.csv'),
                          str(tmp_path / 'eval.csv')))
  assert splits.train.num_examples == 28 and splits.eval.num_examples == 8
  assert [(c.name, c.kind) for c in splits.train.plan.features] == [
      ('a', 'number'), ('kind', 'category')]
  assert np.isnan(splits.train.x_NxF[2, 0])  # kept, filled on device
  assert 'left out of training' in absl_caplog.text
  assert '2 of the 30 rows' in absl_caplog.text


def test_bad_file_fails_before_anything_is_prepared(tmp_path, files):
  _, eval_, train_path, _ = files
  eval_['c'] = eval_['c'].astype(object)
  eval_.loc[6, 'c'] = 'oops'
  eval_path = str(tmp_path / 'bad_eval.csv')
  eval_.to_csv(eval_path, index=False)
  with pytest.raises(DataError) as e:
    _load(_dataset(tmp_path, train_path, eval_path))
  assert f"'{eval_path}' (dataset.eval_path), column 'c', data row 7" in str(
      e.value)
  assert not (tmp_path / 'tfds' / 'csv_regression').exists()


def test_missing_file_is_named(tmp_path, files):
  _, _, train_path, _ = files
  missing = str(tmp_path / 'missing.csv')
  with pytest.raises(DataError, match=r"missing\.csv' \(dataset.eval_path\) "
                     'does not exist'):
    _load(_dataset(tmp_path, train_path, missing))


@pytest.mark.parametrize('key,value,message', [
    ('train_path', '', 'dataset.train_path is empty'),
    ('target_columns', (), 'dataset.target_columns is empty'),
    ('feature_columns', ('a', 'y'), "column 'y' is both a target"),
    ('target_columns', ('y', 'y'), "names column 'y' twice"),
])
def test_validate_checks_the_csv_keys(key, value, message):
  config = csv_config.get_config()
  config.dataset.train_path = 'train.csv'
  config.dataset.eval_path = 'eval.csv'
  config.dataset.target_columns = ('y',)
  config.dataset[key] = value
  with pytest.raises(UsageError, match=message):
    config_lib.parse(config)


def test_without_an_eval_file_validation_rows_are_needed():
  config = csv_config.get_config()
  config.dataset.train_path = 'train.csv'
  config.dataset.target_columns = ('y',)
  assert config.dataset.eval_path == ''
  config_lib.parse(config)  # its folds estimate the error
  config.dataset.validation = 0.2
  config_lib.parse(config)  # so do its held-out rows
  config.dataset.validation = 0
  with pytest.raises(UsageError, match=(
      'dataset.eval_path is empty and the run validates on no rows.*'
      'set dataset.validation to a number of folds')):
    config_lib.parse(config)


def test_validate_accepts_a_complete_csv_config():
  config = csv_config.get_config()
  config.dataset.train_path = 'train.csv'
  config.dataset.eval_path = 'eval.csv'
  config.dataset.target_columns = ('y',)
  config_lib.parse(config)  # raises on any problem


def test_content_key_depends_on_contents_and_selection_only():
  a, b, c = (hashlib.sha256(text).digest()
             for text in (b'a,y\n1,2\n', b'a,y\n3,4\n', b'a,y\n3,5\n'))
  key = file_keys.content_key([a], b, ('y',), ())
  assert key == file_keys.content_key([a], b, ('y',), ())
  others = {
      file_keys.content_key([a], c, ('y',), ()),
      file_keys.content_key([b], a, ('y',), ()),
      file_keys.content_key([a], b, ('y',), ('a',)),
      # The same files, split differently into training files.
      file_keys.content_key([a, b], b, ('y',), ()),
      # Another category_min_count: another plan.
      file_keys.content_key([a], b, ('y',), (), (), 5),
  }
  assert key not in others and len(others) == 5


def _train_py(*args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8',
             NO_GCE_CHECK='true', TF_CPP_MIN_LOG_LEVEL='2', JAX_PLATFORMS='cpu')
  return subprocess.run([sys.executable, 'train.py', '--config=configs/csv.py',
                         *args], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=300, check=False)


@pytest.mark.slow
def test_train_py_fits_a_csv_and_writes_metrics(tmp_path):
  train, eval_ = _frame(400, 0), _frame(100, 1)
  train.to_csv(tmp_path / 'train.csv', index=False)
  eval_.to_parquet(tmp_path / 'eval.parquet', index=False)
  workdir = tmp_path / 'run'
  result = _train_py(
      f'--workdir={workdir}', f'--config.dataset.data_dir={tmp_path}/tfds',
      f'--config.dataset.train_path={tmp_path}/train.csv',
      f'--config.dataset.eval_path={tmp_path}/eval.parquet',
      '--config.dataset.target_columns=y', '--config.num_train_steps=200',
      '--config.log_every_steps=100', '--config.eval_every_steps=200',
      '--config.checkpoint_every_steps=200')
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [json.loads(line) for line in
           (workdir / 'metrics.jsonl').read_text().splitlines()]
  final = [m for m in lines if 'eval/rmse' in m][-1]
  assert final['step'] == 200
  # y is linear in a and b with noise std 0.1 * 1: predicting the mean
  # would score std(y) ~ 3.6; a fitted model must come far below it (in
  # 200 steps, the quantile-scaled piecewise-linear inputs of
  # configs/csv.py reach ~0.1 of it).
  assert final['eval/rmse'] < 0.2 * eval_['y'].std()
  saved = json.loads((workdir / 'config.json').read_text())
  assert saved['dataset']['target_columns'] == ['y']


def _bad_files(tmp_path, case: str) -> tuple[str, str, list[str], str]:
  """Files that fail as `case` says: (train path, eval path, extra flags,
  the message expected)."""
  frame = _frame(16, 0)
  train_path, eval_path = tmp_path / 'train.csv', tmp_path / 'eval.csv'
  frame.to_csv(train_path, index=False)
  frame.to_csv(eval_path, index=False)
  args = []
  expected = {
      'missing_file': "'nope.csv' (dataset.eval_path) does not exist",
      'non_numeric': "column 'b', data row 4 (1-based, header not counted): "
                     "'4,5' is not a number",
      'target_as_feature': "column 'y' is both a target",
      'bad_date': "column 'when', data row 7 (1-based, header not counted): "
                  "'2021-13-45' is not a date",
      'empty_target': "has no value in target column 'y'",
      'latin1': 'is not UTF-8: line 4 holds byte 0xe9',
  }[case]
  if case == 'missing_file':
    eval_path = 'nope.csv'
  elif case == 'non_numeric':
    frame = frame.astype({'b': object})
    frame.loc[3, 'b'] = '4,5'
    frame.to_csv(train_path, index=False)
  elif case == 'bad_date':
    frame['when'] = [f'2021-01-{d + 1:02d}' for d in range(len(frame))]
    frame.to_csv(eval_path, index=False)
    frame.loc[6, 'when'] = '2021-13-45'
    frame.to_csv(train_path, index=False)
  elif case == 'empty_target':
    frame.assign(y=np.nan).to_csv(train_path, index=False)
  elif case == 'latin1':
    frame['town'] = 'Paris'
    frame.loc[2, 'town'] = 'Orléans'
    frame.to_csv(train_path, index=False, encoding='latin-1')
  elif case == 'target_as_feature':
    args.append("--config.dataset.feature_columns=('a', 'y')")
  return str(train_path), str(eval_path), args, expected


# Each case fails at another stage: config check, file read, value check.
# (Every other bad-data case is covered in-process, below and in
# test_table_files and test_column_plan.)
@pytest.mark.slow
@pytest.mark.parametrize('case', ['target_as_feature', 'missing_file',
                                  'non_numeric'])
def test_train_py_bad_data_exits_2_with_one_error_line(tmp_path, case):
  train_path, eval_path, args, expected = _bad_files(tmp_path, case)
  workdir = tmp_path / 'run'
  result = _train_py(f'--workdir={workdir}',
                     f'--config.dataset.data_dir={tmp_path}/tfds',
                     f'--config.dataset.train_path={train_path}',
                     f'--config.dataset.eval_path={eval_path}',
                     '--config.dataset.target_columns=y', *args)
  assert result.returncode == 2, result.stderr[-3000:]
  assert 'Traceback' not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and expected in last, last
  assert result.stderr.count('error: ') == 1
  assert not workdir.exists()


# The same stage as non_numeric above (a DataError while the files are
# read), whose exit status and one line train.py shows.
@pytest.mark.parametrize('case', ['bad_date', 'empty_target', 'latin1'])
def test_bad_data_is_a_data_error_that_names_the_cell(tmp_path, case):
  train_path, eval_path, _, expected = _bad_files(tmp_path, case)
  with pytest.raises(DataError) as e:
    _load(_dataset(tmp_path, train_path, eval_path))
  assert expected in str(e.value)
  assert not (tmp_path / 'tfds' / 'csv_regression').exists()


def test_rare_training_categories_are_not_called_new(tmp_path, caplog):
  """Evaluated on its own training file, a category of many levels has
  rows of levels seen once: unknown to the model, but not new."""
  frame = _frame(600, 0)
  frame['shop'] = [f's{i % 450}' for i in range(600)]
  frame.to_csv(tmp_path / 'train.csv', index=False)
  dataset = _dataset(tmp_path, str(tmp_path / 'train.csv'),
                     str(tmp_path / 'train.csv'))
  with caplog.at_level('WARNING'):
    _load(dataset)
  warning = next(r.getMessage() for r in caplog.records
                 if 'shop' in r.getMessage())
  assert 'shop (300 rows)' in warning  # s150 ... s449: once each
  assert 'seen fewer than 2 times in the training file' in warning
  assert 'does not have' not in warning


@pytest.mark.parametrize('suffix', ['.csv', '.parquet'])
def test_a_category_value_that_is_a_missing_token_is_warned_of(
    tmp_path, absl_caplog, suffix):
  rng = np.random.default_rng(0)
  frame = pd.DataFrame({'country': rng.choice(['US', 'DE', 'NA'], 40),
                        'a': rng.normal(size=40), 'y': rng.normal(size=40)})
  frame.loc[3, 'country'] = 'n/a'  # once: a missing cell, as meant
  path = str(tmp_path / f'train{suffix}')
  (frame.to_parquet if suffix == '.parquet' else frame.to_csv)(
      path, index=False)
  splits = _load(_dataset(tmp_path, path, ''))
  city = splits.train.plan.features[0]
  assert city.vocabulary == ('DE', 'US') and city.has_missing
  count = (frame['country'] == 'NA').sum()
  assert (f"column 'country' holds 'NA' in {count} cells, which meshfit "
          'reads as missing') in absl_caplog.text
  assert "'n/a'" not in absl_caplog.text
