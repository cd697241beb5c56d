"""Tests for input_pipeline.tables: prepared TFDS split -> in-memory Table."""

import os

os.environ.setdefault('NO_GCE_CHECK', 'true')

import pathlib  # pylint: disable=g-import-not-at-top

import numpy as np
import pytest
import tensorflow_datasets as tfds

import input_pipeline.synthetic_regression  # noqa: F401  Registers the builder.
from input_pipeline import tables
from meshfit.errors import UsageError


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
  with pytest.raises(UsageError) as info:
    tables.prepare('synthetic_regression/cubic', str(data_dir))
  message = str(info.value)
  assert "'synthetic_regression/cubic'" in message
  assert 'synthetic_regression/linear' in message
  assert 'synthetic_regression/friedman1' in message


@pytest.mark.parametrize('split', ['validation', 'tran', 'train[:200%]'])
def test_unknown_split_lists_available_splits(linear, split):
  with pytest.raises(UsageError, match=r'use one of: train, test') as info:
    tables.load_table(linear, split)
  assert repr(split) in str(info.value)


def test_data_dir_that_is_a_file_is_rejected(tmp_path):
  not_a_dir = tmp_path / 'data'
  not_a_dir.write_text('')
  with pytest.raises(UsageError, match='is a file'):
    tables.prepare('synthetic_regression/linear', str(not_a_dir))


def test_unprepared_builder_is_rejected(tmp_path):
  builder = tfds.builder('synthetic_regression/linear', data_dir=str(tmp_path))
  with pytest.raises(UsageError, match=r'not prepared.*prepare\(\)'):
    tables.load_table(builder, 'train')


def test_table_rejects_mismatched_rows():
  with pytest.raises(ValueError, match='3 rows but y_NxT has 2'):
    tables.Table(
        x_NxF=np.zeros((3, 1), np.float32),
        y_NxT=np.zeros((2, 1), np.float32),
        feature_names=('x0',),
        target_names=('y',),
    )
