"""From a table's input columns to the model's inputs, on device.

A table arrives as one float32 matrix in its column plan's order
(input_pipeline/column_plan.py): numbers with NaN where missing, category
codes. `model_inputs` splits it into what the network reads: the numbers,
filled with the training median and scaled (standardised, or through the
training quantiles to a normal), a 0/1 flag for each number that had missing
values in training, and the integer category codes. The statistics it uses
are the training split's, computed once (`FeatureStats.fit`) and kept in the
train state, so every checkpoint carries them and train, eval, predict and
export transform a value alike; the targets' mean and std turn predictions
back into original units.
"""

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from meshfit.models.mlp import InputShape

# Quantiles of each number kept for the quantile scaling (interpolated).
NUM_QUANTILES = 128
# A quantile-scaled number's rank is clipped away from 0 and 1 by this,
# bounding it to about +-5.2 standard deviations (as scikit-learn does).
RANK_EPSILON = 1e-7
# A raw number (`InputLayout.raw_numbers`) is standardised and clipped to
# this many standard deviations, so that one outlier cannot dominate a
# batch's first layer.
RAW_CLIP = 5.0


@dataclasses.dataclass(frozen=True)
class InputLayout:
  """Which input columns are numbers and which categories (static).

  Attributes:
    number_columns: the matrix columns that hold numbers.
    missing_numbers: positions, among the numbers, of those with missing
      values in training (each gets an indicator input).
    category_columns: the matrix columns that hold category codes.
    category_sizes: the number of codes of each category column.
    scaling: 'none', 'standardize' or 'quantile'.
    raw_numbers: also give the network each number standardised (mean and
      std) and clipped to +-RAW_CLIP, beside its scaled value or embedding.
  """
  number_columns: tuple[int, ...]
  missing_numbers: tuple[int, ...] = ()
  category_columns: tuple[int, ...] = ()
  category_sizes: tuple[int, ...] = ()
  scaling: str = 'standardize'
  raw_numbers: bool = False

  @classmethod
  def numbers(cls, num_features: int,
              scaling: str = 'standardize') -> 'InputLayout':
    """Every column a number, none ever missing (the synthetic datasets)."""
    return cls(tuple(range(num_features)), scaling=scaling)

  @classmethod
  def of(cls, input_categories: Sequence[int], missing_I: Sequence[bool],
         scaling: str, raw_numbers: bool = False) -> 'InputLayout':
    """The layout of a training table.

    Args:
      input_categories: per input column, its number of codes if a category
        (else 0): `ColumnPlan.input_categories`.
      missing_I: per input column, whether the training table lacks it in
        some row (`Table.missing_I`).
      scaling: 'none', 'standardize' or 'quantile'.
      raw_numbers: see the attribute.
    """
    numbers = tuple(i for i, n in enumerate(input_categories) if not n)
    categories = tuple(i for i, n in enumerate(input_categories) if n)
    missing = np.asarray(missing_I, bool)[list(numbers)]
    return cls(numbers, tuple(int(i) for i in np.flatnonzero(missing)),
               categories, tuple(input_categories[i] for i in categories),
               scaling, raw_numbers)

  @property
  def shape(self) -> InputShape:
    """What the network reads (models/mlp.py)."""
    return InputShape(len(self.number_columns), len(self.missing_numbers),
                      self.category_sizes,
                      len(self.number_columns) if self.raw_numbers else 0)


@struct.dataclass
class FeatureStats:
  """The training split's statistics (float32), kept in the train state.

  A table without number columns keeps one unused entry in each number
  statistic: Orbax cannot save an empty array (`model_inputs` reads the
  first `len(layout.number_columns)` entries).

  Attributes:
    fill_N: each number's value for a missing cell (its training median).
    mean_N: each number's training mean (standardize).
    std_N: each number's training standard deviation (standardize).
    quantiles_NxQ: NUM_QUANTILES training quantiles of each number
      (quantile scaling).
    y_mean_T: each target's training mean.
    y_std_T: each target's training standard deviation.
  """
  fill_N: jax.Array
  mean_N: jax.Array
  std_N: jax.Array
  quantiles_NxQ: jax.Array
  y_mean_T: jax.Array
  y_std_T: jax.Array

  @classmethod
  def fit(cls, layout: InputLayout, x_NxF: np.ndarray,
          y_NxT: np.ndarray) -> 'FeatureStats':
    """Statistics of a training table, computed in float64 on the host.

    With layout.scaling 'none' numbers and targets keep their units (only
    missing numbers are filled).
    """
    numbers = x_NxF[:, list(layout.number_columns)].astype(np.float64)
    num_numbers = numbers.shape[1]
    with np.errstate(all='ignore'):  # all-NaN columns: filled with 0
      fill = np.nan_to_num(np.nanmedian(numbers, axis=0)) if len(
          numbers) else np.zeros(num_numbers)
    filled = np.where(np.isnan(numbers), fill, numbers)
    identity = cls.identity(num_numbers, y_NxT.shape[1])
    if not num_numbers:  # nothing to fill or scale; see the class doc
      fill, filled = np.zeros(1), np.zeros((len(numbers), 1))
    if layout.scaling == 'none':
      return identity.replace(fill_N=fill.astype(np.float32))
    mean, std = _mean_std(filled)
    y_mean, y_std = _mean_std(y_NxT.astype(np.float64))
    quantiles = (np.quantile(filled, np.linspace(0, 1, NUM_QUANTILES),
                             axis=0).T if len(filled) else
                 identity.quantiles_NxQ)
    return cls(fill.astype(np.float32), mean, std,
               np.asarray(quantiles, np.float32), y_mean, y_std)

  @classmethod
  def identity(cls, num_numbers: int, num_targets: int) -> 'FeatureStats':
    """Statistics that change nothing (and fill a missing number with 0)."""
    stored = max(num_numbers, 1)  # see the class doc
    return cls(np.zeros(stored, np.float32),
               np.zeros(stored, np.float32),
               np.ones(stored, np.float32),
               np.tile(np.linspace(-3, 3, NUM_QUANTILES, dtype=np.float32),
                       (stored, 1)),
               np.zeros(num_targets, np.float32),
               np.ones(num_targets, np.float32))

  def standardize_y(self, y_BxT: jax.Array) -> jax.Array:
    return (y_BxT - self.y_mean_T[None]) / self.y_std_T[None]

  def unstandardize_y(self, z_BxT: jax.Array) -> jax.Array:
    return z_BxT * self.y_std_T[None] + self.y_mean_T[None]


def _mean_std(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  mean = a.mean(axis=0) if len(a) else np.zeros(a.shape[1])
  std = a.std(axis=0) if len(a) else np.ones(a.shape[1])
  # A constant column has nothing to scale: leave it unscaled.
  std = np.where(std > 0, std, 1.0)
  return mean.astype(np.float32), std.astype(np.float32)


def _quantile_normal(x_BxN: jax.Array, quantiles_NxQ: jax.Array) -> jax.Array:
  """Each number's rank among the training quantiles, as a standard normal.

  Ties (a value repeated across several quantiles) take the middle of their
  ranks: interpolated from both ends, as scikit-learn's QuantileTransformer.
  """
  levels = jnp.linspace(0.0, 1.0, quantiles_NxQ.shape[1])
  up = jax.vmap(jnp.interp, in_axes=(1, 0, None), out_axes=1)(
      x_BxN, quantiles_NxQ, levels)
  down = jax.vmap(jnp.interp, in_axes=(1, 0, None), out_axes=1)(
      -x_BxN, -quantiles_NxQ[:, ::-1], -levels[::-1])
  rank = jnp.clip(0.5 * (up - down), RANK_EPSILON, 1.0 - RANK_EPSILON)
  return jax.scipy.special.ndtri(rank)


def model_inputs(stats: FeatureStats, layout: InputLayout,
                 x_BxF: jax.Array) -> dict[str, jax.Array]:
  """The network's inputs for a batch (or table) of input columns.

  Returns:
    {'numbers': scaled numbers B x N, 'missing': 0/1 flags B x M, 'codes':
    int32 category codes B x C, 'raw': the numbers standardised and clipped
    B x N (B x 0 unless layout.raw_numbers)}.
  """
  n = len(layout.number_columns)  # the stats may hold one more entry
  fill_N, mean_N, std_N = stats.fill_N[:n], stats.mean_N[:n], stats.std_N[:n]
  numbers = x_BxF[:, list(layout.number_columns)]
  absent = jnp.isnan(numbers)
  numbers = jnp.where(absent, fill_N[None], numbers)
  raw = numbers[:, :0]
  if layout.raw_numbers:
    raw = (numbers if layout.scaling == 'none' else jnp.clip(
        (numbers - mean_N[None]) / std_N[None], -RAW_CLIP, RAW_CLIP))
  if layout.scaling == 'quantile':
    numbers = _quantile_normal(numbers, stats.quantiles_NxQ[:n])
  elif layout.scaling == 'standardize':
    numbers = (numbers - mean_N[None]) / std_N[None]
  return {'numbers': numbers, 'raw': raw,
          'missing': absent[:, list(layout.missing_numbers)].astype(
              jnp.float32),
          'codes': x_BxF[:, list(layout.category_columns)].astype(jnp.int32)}
