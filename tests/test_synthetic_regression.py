"""Tests for the synthetic_regression TFDS builder."""

import os

os.environ.setdefault('NO_GCE_CHECK', 'true')

import hashlib  # pylint: disable=g-import-not-at-top
import pathlib

import numpy as np
import pytest
import tensorflow_datasets as tfds

import meshfit.input_pipeline.synthetic_regression  # noqa: F401  Registers the builder.

_NO_NETWORK = tfds.download.DownloadConfig(try_download_gcs=False)


def _prepare(name: str, data_dir: pathlib.Path) -> tfds.core.DatasetBuilder:
  builder = tfds.builder(name, data_dir=str(data_dir))
  builder.download_and_prepare(download_config=_NO_NETWORK)
  return builder


def _read(builder: tfds.core.DatasetBuilder, split: str):
  data = tfds.as_numpy(
      builder.as_dataset(split, batch_size=-1, shuffle_files=False)
  )
  return data['x'], data['y']


def _record_file_hashes(data_dir: pathlib.Path) -> dict[str, str]:
  return {
      str(path.relative_to(data_dir)): hashlib.sha256(
          path.read_bytes()
      ).hexdigest()
      for path in sorted(data_dir.rglob('*.tfrecord*'))
  }


@pytest.fixture(scope='module')
def data_dirs(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
  """Two data dirs: linear prepared in both, friedman1 (100k rows) in one."""
  first = tmp_path_factory.mktemp('tfds_first')
  second = tmp_path_factory.mktemp('tfds_second')
  _prepare('synthetic_regression/linear', first)
  _prepare('synthetic_regression/linear', second)
  _prepare('synthetic_regression/friedman1', first)
  return first, second


@pytest.fixture(scope='module')
def linear(data_dirs) -> tfds.core.DatasetBuilder:
  return tfds.builder('synthetic_regression/linear', data_dir=str(data_dirs[0]))


@pytest.fixture(scope='module')
def friedman1(data_dirs) -> tfds.core.DatasetBuilder:
  return tfds.builder(
      'synthetic_regression/friedman1', data_dir=str(data_dirs[0])
  )


def test_preparing_twice_writes_identical_record_files(data_dirs):
  first, second = data_dirs
  hashes = _record_file_hashes(first / 'synthetic_regression' / 'linear')
  assert len(hashes) >= 2, f'expected train and test files, found {hashes}'
  assert hashes == _record_file_hashes(
      second / 'synthetic_regression' / 'linear'
  )


@pytest.mark.parametrize(
    'name, num_features, num_train, num_test',
    [('linear', 1, 128, 10_000), ('friedman1', 10, 100_000, 10_000)],
)
def test_split_sizes_and_feature_shapes(
    data_dirs, name, num_features, num_train, num_test
):
  builder = tfds.builder(
      f'synthetic_regression/{name}', data_dir=str(data_dirs[0])
  )
  assert builder.info.version == '1.0.0'
  assert builder.info.supervised_keys == ('x', 'y')
  assert builder.info.splits['train'].num_examples == num_train
  assert builder.info.splits['test'].num_examples == num_test
  x_NxF, y_Nx1 = _read(builder, 'test')
  assert x_NxF.shape == (num_test, num_features)
  assert y_Nx1.shape == (num_test, 1)
  assert x_NxF.dtype == np.float32 and y_Nx1.dtype == np.float32


def test_linear_follows_the_tutorial_line(linear):
  x_Nx1, y_Nx1 = _read(linear, 'test')
  # x ~ N(0, 1): 10k draws put the sample mean and std within ~0.01 of 0, 1.
  assert abs(x_Nx1.mean()) < 0.05
  assert abs(x_Nx1.std() - 1.0) < 0.05
  design_Nx2 = np.concatenate([x_Nx1, np.ones_like(x_Nx1)], axis=1)
  (slope, intercept), *_ = np.linalg.lstsq(
      design_Nx2.astype(np.float64), y_Nx1[:, 0].astype(np.float64), rcond=None
  )
  assert abs(slope - 2.0) < 0.05, slope
  assert abs(intercept - (-1.0)) < 0.05, intercept
  residual_N = y_Nx1[:, 0] - (slope * x_Nx1[:, 0] + intercept)
  assert abs(residual_N.std() - 0.5) < 0.03, residual_N.std()


def test_friedman1_is_formula_plus_unit_noise(friedman1):
  x_NxF, y_Nx1 = _read(friedman1, 'test')
  assert x_NxF.min() >= 0.0 and x_NxF.max() < 1.0
  # U(0, 1) columns: mean 1/2, std 1/sqrt(12) ~ 0.289, for all ten features.
  np.testing.assert_allclose(x_NxF.mean(axis=0), 0.5, atol=0.02)
  np.testing.assert_allclose(x_NxF.std(axis=0), 12**-0.5, atol=0.02)
  x = x_NxF.astype(np.float64)
  noise_free_N = (
      10 * np.sin(np.pi * x[:, 0] * x[:, 1])
      + 20 * (x[:, 2] - 0.5) ** 2
      + 10 * x[:, 3]
      + 5 * x[:, 4]
  )
  noise_N = y_Nx1[:, 0] - noise_free_N
  assert abs(noise_N.mean()) < 0.05, noise_N.mean()
  assert abs(noise_N.std() - 1.0) < 0.05, noise_N.std()
  # Noise must be independent of the inputs, the unused ones included.
  for f in range(x.shape[1]):
    assert abs(np.corrcoef(x[:, f], noise_N)[0, 1]) < 0.05, f


def _x_rows(builder: tfds.core.DatasetBuilder, split: str) -> set[bytes]:
  x_NxF, _ = _read(builder, split)
  return {row.tobytes() for row in x_NxF}


def test_train_and_test_are_different_draws(linear, friedman1):
  # Drawing both splits from one seed would repeat the first x rows of one in
  # the other; 10% of friedman1's train rows would hold ~1,000 such repeats.
  assert not _x_rows(linear, 'train') & _x_rows(linear, 'test')
  assert not _x_rows(friedman1, 'train[:10%]') & _x_rows(friedman1, 'test')
