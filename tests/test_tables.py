"""Tests for meshfit.input_pipeline.tables: prepared TFDS split -> in-memory Table."""

import os

os.environ.setdefault('NO_GCE_CHECK', 'true')

import pathlib  # pylint: disable=g-import-not-at-top

import numpy as np
import pytest
import tensorflow_datasets as tfds

import meshfit.input_pipeline.synthetic_regression  # noqa: F401  Registers the builder.
from meshfit.input_pipeline import tables
from meshfit.input_pipeline.errors import DataError


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory) -> pathlib.Path:
  return tmp_path_factory.mktemp('tfds')


@pytest.fixture(scope='module')
def friedman1(data_dir) -> tfds.core.DatasetBuilder:
  return tables.prepare('synthetic_regression/friedman1', str(data_dir))


@pytest.fixture(scope='module')
def linear(data_dir) -> tfds.core.DatasetBuilder:
  return tables.prepare('synthetic_regression/linear', str(data_dir))


def test_friedman1_train_table_has_float32_arrays_and_names(friedman1):
  table = tables.load_table(friedman1, 'train')
  assert table.num_examples == 100_000
  assert table.x_NxF.shape == (100_000, 10)
  assert table.y_NxT.shape == (100_000, 1)
  assert table.x_NxF.dtype == np.float32
  assert table.y_NxT.dtype == np.float32
  assert table.feature_names == tuple(f'x{i}' for i in range(10))
  assert table.target_names == ('y',)


def test_two_loads_give_identical_tables(friedman1):
  first = tables.load_table(friedman1, 'train')
  second = tables.load_table(friedman1, 'train')
  assert first.x_NxF is not second.x_NxF
  np.testing.assert_array_equal(first.x_NxF, second.x_NxF)
  np.testing.assert_array_equal(first.y_NxT, second.y_NxT)


def test_rows_are_in_tfds_stored_order(linear):
  table = tables.load_table(linear, 'test')
  expected = tfds.as_numpy(
      linear.as_dataset('test', batch_size=-1, shuffle_files=False)
  )
  np.testing.assert_array_equal(table.x_NxF, expected['x'])
  np.testing.assert_array_equal(table.y_NxT, expected['y'])


def test_slices_select_the_stored_rows(linear):
  whole = tables.load_table(linear, 'test')
  head = tables.load_table(linear, 'test[:100]')
  np.testing.assert_array_equal(head.x_NxF, whole.x_NxF[:100])
  both = tables.load_table(linear, 'test[-3:]+train[:2]')
  train = tables.load_table(linear, 'train')
  np.testing.assert_array_equal(
      both.y_NxT, np.concatenate([whole.y_NxT[-3:], train.y_NxT[:2]])
  )
  empty = tables.load_table(linear, 'train[:0]')
  assert empty.x_NxF.shape == (0, 1)


def test_prepare_reuses_prepared_data(linear, data_dir):
  files = sorted((data_dir / 'synthetic_regression').rglob('*.tfrecord*'))
  assert files
  mtimes = [f.stat().st_mtime_ns for f in files]
  tables.prepare('synthetic_regression/linear', str(data_dir))
  assert [f.stat().st_mtime_ns for f in files] == mtimes


def test_unknown_dataset_lists_known_names(data_dir):
  with pytest.raises(DataError) as info:
    tables.prepare('synthetic_regression/cubic', str(data_dir))
  message = str(info.value)
  assert "'synthetic_regression/cubic'" in message
  assert 'synthetic_regression/linear' in message
  assert 'synthetic_regression/friedman1' in message


@pytest.mark.parametrize('split', ['validation', 'tran', 'train[:200%]'])
def test_unknown_split_lists_available_splits(linear, split):
  with pytest.raises(DataError, match=r'use one of: train, test') as info:
    tables.load_table(linear, split)
  assert repr(split) in str(info.value)


def test_data_dir_that_is_a_file_is_rejected(tmp_path):
  not_a_dir = tmp_path / 'data'
  not_a_dir.write_text('')
  with pytest.raises(DataError, match='is a file'):
    tables.prepare('synthetic_regression/linear', str(not_a_dir))


def test_unprepared_builder_is_rejected(tmp_path):
  builder = tfds.builder('synthetic_regression/linear', data_dir=str(tmp_path))
  with pytest.raises(DataError, match=r'not prepared.*prepare\(\)'):
    tables.load_table(builder, 'train')


def test_table_rejects_mismatched_rows():
  with pytest.raises(ValueError, match='3 rows but y_NxT has 2'):
    tables.Table(
        x_NxF=np.zeros((3, 1), np.float32),
        y_NxT=np.zeros((2, 1), np.float32),
        plan=tables.generated_plan(1, 1),
    )


def test_generated_datasets_match_the_builder(data_dir):
  builder_cls = meshfit.input_pipeline.synthetic_regression.SyntheticRegression
  assert tables.GENERATED_DATASETS == tuple(
      f'{builder_cls.name}/{c.name}' for c in builder_cls.BUILDER_CONFIGS)
  for name in tables.GENERATED_DATASETS:
    builder = tfds.builder(name, data_dir=str(data_dir))
    # Where a prepared dataset is looked for without TFDS: TFDS's own place.
    assert tables.prepare_generated(name, str(data_dir)) == os.fspath(
        builder.data_dir)


def _parsed_files(directory: str) -> list[str]:
  return sorted(p.name for p in pathlib.Path(directory).rglob('*')
                if p.is_file() and 'meshfit_tables' in str(p))


def test_read_split_parses_once_then_loads_the_kept_copy(
    tmp_path, monkeypatch):
  directory = tables.prepare_generated('synthetic_regression/linear',
                                       str(tmp_path))
  builder = tables.open_prepared(directory)
  first = tables.read_split(directory, 'test[:100]+train[-3:]')
  expected = tables.load_table(builder, 'test[:100]+train[-3:]')
  assert _parsed_files(directory) == ['test%5B%3A100%5D%2Btrain%5B-3%3A%5D.npz']

  def fail(*args):
    raise AssertionError('the split was parsed again')

  monkeypatch.setattr(tables, 'load_table', fail)
  monkeypatch.setattr(tables, 'open_prepared', fail)
  again = tables.read_split(directory, 'test[:100]+train[-3:]')
  for table in (first, again):
    np.testing.assert_array_equal(table.x_NxF, expected.x_NxF)
    np.testing.assert_array_equal(table.y_NxT, expected.y_NxT)
    assert table.feature_names == ('x0',) and table.target_names == ('y',)
  assert again.x_NxF.dtype == np.float32 and again.x_NxF.shape == (103, 1)
  # Another split is parsed, not taken from the kept one.
  with pytest.raises(AssertionError, match='parsed again'):
    tables.read_split(directory, 'train')


def test_damaged_kept_copy_is_parsed_again(tmp_path):
  directory = tables.prepare_generated('synthetic_regression/linear',
                                       str(tmp_path))
  whole = tables.read_split(directory, 'train')
  [name] = _parsed_files(directory)
  path = pathlib.Path(directory, 'meshfit_tables.v2', name)
  path.write_bytes(path.read_bytes()[:100])
  again = tables.read_split(directory, 'train')
  np.testing.assert_array_equal(again.y_NxT, whole.y_NxT)
  # ... and kept again, whole.
  assert tables.read_split(directory, 'train').y_NxT.shape == (128, 1)
  assert path.stat().st_size > 1000


def test_split_that_cannot_be_kept_is_still_read(tmp_path, absl_caplog):
  directory = tables.prepare_generated('synthetic_regression/linear',
                                       str(tmp_path))
  # A file where the kept copies' directory goes: writing them fails, as in
  # a read-only data_dir (which root, running the tests in CI, could write).
  pathlib.Path(directory, 'meshfit_tables.v2').write_text('')
  table = tables.read_split(directory, 'train')
  assert table.num_examples == 128
  assert 'Could not keep the parsed split' in absl_caplog.text
  assert _parsed_files(directory) == ['meshfit_tables.v2']


def test_unknown_split_is_not_kept(linear):
  directory = os.fspath(linear.data_dir)
  with pytest.raises(DataError, match='has no split'):
    tables.read_split(directory, 'validation')
  assert 'validation.npz' not in _parsed_files(directory)
