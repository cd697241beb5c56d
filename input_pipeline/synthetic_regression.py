"""TFDS builder for small synthetic regression tasks with known answers.

Two configs, each a known function plus Gaussian noise, so a model's test loss
can be compared with the noise floor:

* `linear`: the task of the JAX 101 parallelism tutorial.
  x ~ N(0, 1) (one feature), y = 2 x - 1 + 0.5 N(0, 1).
  128 train and 10,000 test examples. The best possible mean squared error
  is 0.25.
* `friedman1`: Friedman (1991), "Multivariate adaptive regression splines".
  x_0..x_9 ~ U(0, 1) independently,
  y = 10 sin(pi x_0 x_1) + 20 (x_2 - 0.5)^2 + 10 x_3 + 5 x_4 + N(0, 1).
  x_5..x_9 do not enter y. 100,000 train and 10,000 test examples. The best
  possible mean squared error is 1.

Nothing is downloaded: every split is drawn with numpy from a seed fixed per
(config, split), so preparing the dataset twice writes byte-identical record
files.
"""

import dataclasses

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

# Indices mixed into each config's seed, so train and test draws differ.
_SPLIT_SEED_INDEX = {'train': 0, 'test': 1}


@dataclasses.dataclass
class SyntheticRegressionConfig(tfds.core.BuilderConfig):
  """One synthetic task.

  Attributes:
    num_features: length F of each example's `x`.
    num_train: number of rows in the `train` split.
    num_test: number of rows in the `test` split.
    seed: base seed of the numpy generator; the split is mixed in.
  """

  num_features: int = 1
  num_train: int = 0
  num_test: int = 0
  seed: int = 0


def _linear(
    rng: np.random.Generator, n: int, num_features: int
) -> tuple[np.ndarray, np.ndarray]:
  """Draws `n` rows of y = 2 x - 1 + 0.5 N(0, 1), x ~ N(0, 1)."""
  x_NxF = rng.standard_normal((n, num_features)).astype(np.float32)
  noise_Nx1 = rng.standard_normal((n, 1))
  y_Nx1 = 2.0 * x_NxF.astype(np.float64) - 1.0 + 0.5 * noise_Nx1
  return x_NxF, y_Nx1.astype(np.float32)


def _friedman1(
    rng: np.random.Generator, n: int, num_features: int
) -> tuple[np.ndarray, np.ndarray]:
  """Draws `n` rows of Friedman #1 with `num_features` U(0, 1) inputs."""
  x_NxF = rng.random((n, num_features)).astype(np.float32)
  # y is computed from the stored float32 x, so it matches the file exactly.
  x = x_NxF.astype(np.float64)
  noise_N = rng.standard_normal(n)
  y_N = (
      10.0 * np.sin(np.pi * x[:, 0] * x[:, 1])
      + 20.0 * (x[:, 2] - 0.5) ** 2
      + 10.0 * x[:, 3]
      + 5.0 * x[:, 4]
      + noise_N
  )
  return x_NxF, y_N[:, None].astype(np.float32)


_GENERATORS = {'linear': _linear, 'friedman1': _friedman1}


def generate(
    config: SyntheticRegressionConfig, split: str
) -> tuple[np.ndarray, np.ndarray]:
  """Draws one whole split of `config`, deterministically.

  Args:
    config: one of `SyntheticRegression.BUILDER_CONFIGS`.
    split: 'train' or 'test'.

  Returns:
    (x_NxF, y_Nx1), both float32, in row-index order.
  """
  n = config.num_train if split == 'train' else config.num_test
  rng = np.random.default_rng([config.seed, _SPLIT_SEED_INDEX[split]])
  return _GENERATORS[config.name](rng, n, config.num_features)


class SyntheticRegression(tfds.core.GeneratorBasedBuilder):
  """Synthetic regression tasks drawn with numpy from fixed seeds.

  `linear`: x ~ N(0, 1), y = 2 x - 1 + 0.5 N(0, 1); 128 train, 10,000 test.
  `friedman1`: x_0..x_9 ~ U(0, 1),
  y = 10 sin(pi x_0 x_1) + 20 (x_2 - 0.5)^2 + 10 x_3 + 5 x_4 + N(0, 1);
  100,000 train, 10,000 test.
  """

  # TFDS would look for the builder's files in the folder its module name
  # spells (meshfit/input_pipeline/), which a checkout keeps elsewhere.
  pkg_dir_path = epath.Path(__file__).parent
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}
  BUILDER_CONFIGS = [
      SyntheticRegressionConfig(
          name='linear',
          description=(
              'JAX 101 parallelism tutorial task: x ~ N(0, 1) (1 feature), '
              'y = 2 x - 1 + 0.5 N(0, 1). 128 train, 10,000 test.'
          ),
          num_features=1,
          num_train=128,
          num_test=10_000,
          seed=101,
      ),
      SyntheticRegressionConfig(
          name='friedman1',
          description=(
              'Friedman #1: x_0..x_9 ~ U(0, 1), y = 10 sin(pi x_0 x_1) + '
              '20 (x_2 - 0.5)^2 + 10 x_3 + 5 x_4 + N(0, 1). '
              '100,000 train, 10,000 test.'
          ),
          num_features=10,
          num_train=100_000,
          num_test=10_000,
          seed=1991,
      ),
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    num_features = self.builder_config.num_features
    return self.dataset_info_from_configs(
        description=__doc__,
        features=tfds.features.FeaturesDict({
            'x': tfds.features.Tensor(shape=(num_features,), dtype=np.float32),
            'y': tfds.features.Tensor(shape=(1,), dtype=np.float32),
        }),
        supervised_keys=('x', 'y'),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Everything is generated; nothing to download.
    return {
        split: self._generate_examples(split) for split in _SPLIT_SEED_INDEX
    }

  def _generate_examples(self, split: str):
    x_NxF, y_Nx1 = generate(self.builder_config, split)
    for i in range(x_NxF.shape[0]):
      yield i, {'x': x_NxF[i], 'y': y_Nx1[i]}
