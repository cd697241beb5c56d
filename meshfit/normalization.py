"""Standardisation statistics that travel with the model in every checkpoint.

The model trains in standardised units; metrics, eval JSON and predictions are
turned back into the targets' original units with these same statistics.
"""

import jax
import numpy as np
from flax import struct


@struct.dataclass
class Normalizer:
  """Per-column mean and std of the training split (float32)."""
  x_mean_F: jax.Array
  x_std_F: jax.Array
  y_mean_T: jax.Array
  y_std_T: jax.Array

  @classmethod
  def fit(cls, x_NxF: np.ndarray, y_NxT: np.ndarray,
          standardize: bool = True) -> 'Normalizer':
    """Statistics of a training table, computed in float64.

    Args:
      x_NxF: training features.
      y_NxT: training targets.
      standardize: False gives the identity (mean 0, std 1).

    Returns:
      The normalizer, as host numpy arrays.
    """
    if not standardize:
      return cls.identity(x_NxF.shape[1], y_NxT.shape[1])

    def stats(a):
      mean = a.astype(np.float64).mean(axis=0)
      std = a.astype(np.float64).std(axis=0)
      # A constant column has nothing to scale: leave it unscaled.
      std = np.where(std > 0, std, 1.0)
      return mean.astype(np.float32), std.astype(np.float32)

    x_mean, x_std = stats(x_NxF)
    y_mean, y_std = stats(y_NxT)
    return cls(x_mean, x_std, y_mean, y_std)

  @classmethod
  def identity(cls, num_features: int, num_targets: int) -> 'Normalizer':
    return cls(np.zeros(num_features, np.float32),
               np.ones(num_features, np.float32),
               np.zeros(num_targets, np.float32),
               np.ones(num_targets, np.float32))

  def standardize_x(self, x_BxF: jax.Array) -> jax.Array:
    return (x_BxF - self.x_mean_F[None]) / self.x_std_F[None]

  def standardize_y(self, y_BxT: jax.Array) -> jax.Array:
    return (y_BxT - self.y_mean_T[None]) / self.y_std_T[None]

  def unstandardize_y(self, z_BxT: jax.Array) -> jax.Array:
    return z_BxT * self.y_std_T[None] + self.y_mean_T[None]
