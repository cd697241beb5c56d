"""Train and eval metrics (CLU).

Train metrics accumulate inside the jitted step, as part of the train state,
so the host never waits on a step just to log and a resumed run reproduces
every logged value. Eval metrics are exact sums that the host adds up in
float64, turned into original units at the end.
"""

from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np
from clu import metrics as clu_metrics
from flax import struct

from meshfit.data.features import FeatureStats
from meshfit.model import uncertainty
from meshfit.parallel.in_flight import fetched


@struct.dataclass
class TrainMetrics(clu_metrics.Collection):
  """Means over the steps since the last log."""
  loss: clu_metrics.Average.from_output('loss')
  grad_norm: clu_metrics.Average.from_output('grad_norm')


@struct.dataclass
class RegressionSums(clu_metrics.Metric):
  """Sums over the real (unmasked) examples of an eval split.

  Errors are in original units; targets are summed in standardised units
  (z) so that the total sum of squares has no catastrophic cancellation for
  targets with a large mean and a small spread. A model that predicts a
  distribution (gaussian likelihood) also sums each target's negative log
  density (standardised units: `compute_per_target` adds log(std)) and how
  many values fall in each of the COVERAGE_LEVELS central intervals.
  """
  count: jax.Array
  sse_T: jax.Array
  sae_T: jax.Array
  sum_z_T: jax.Array
  sum_z2_T: jax.Array
  nll_z_T: jax.Array
  covered_LxT: jax.Array

  @classmethod
  def from_model_output(cls, *, pred_BxT: jax.Array, y_BxT: jax.Array,
                        mask_B: jax.Array, stats: FeatureStats,
                        log_density_z_BxT: jax.Array | None = None,
                        covered_LxBxT: jax.Array | None = None,
                        **_) -> 'RegressionSums':
    w_Bx1 = mask_B[:, None].astype(jnp.float32)
    err_BxT = (pred_BxT - y_BxT) * w_Bx1
    z_BxT = stats.standardize_y(y_BxT) * w_Bx1
    num_targets = y_BxT.shape[1]
    nll_T = (jnp.zeros(num_targets) if log_density_z_BxT is None else
             -jnp.where(w_Bx1 > 0, log_density_z_BxT, 0.0).sum(axis=0))
    covered = (jnp.zeros((len(uncertainty.COVERAGE_LEVELS), num_targets))
               if covered_LxBxT is None else
               (covered_LxBxT * w_Bx1[None]).sum(axis=1))
    return cls(count=w_Bx1.sum(),
               sse_T=(err_BxT**2).sum(axis=0),
               sae_T=jnp.abs(err_BxT).sum(axis=0),
               sum_z_T=z_BxT.sum(axis=0),
               sum_z2_T=(z_BxT**2).sum(axis=0),
               nll_z_T=nll_T, covered_LxT=covered)

  def merge(self, other: 'RegressionSums') -> 'RegressionSums':
    return jax.tree.map(lambda a, b: a + b, self, other)

  @classmethod
  def of_host(cls, pred_NxT: np.ndarray, y_NxT: np.ndarray,
              y_mean_T: np.ndarray, y_std_T: np.ndarray) -> 'RegressionSums':
    """The sums of predictions made on the host (float64), e.g. a cross-
    fitted ensemble's out-of-fold ones; no densities or coverage."""
    err_NxT = pred_NxT.astype(np.float64) - y_NxT
    z_NxT = (y_NxT.astype(np.float64) - y_mean_T) / y_std_T
    empty = cls.empty_host(y_NxT.shape[1])
    return empty.replace(count=np.float64(len(y_NxT)),
                         sse_T=(err_NxT**2).sum(axis=0),
                         sae_T=np.abs(err_NxT).sum(axis=0),
                         sum_z_T=z_NxT.sum(axis=0),
                         sum_z2_T=(z_NxT**2).sum(axis=0))

  @classmethod
  def empty_host(cls, num_targets: int) -> 'RegressionSums':
    zeros = np.zeros(num_targets, np.float64)
    return cls(np.float64(0), zeros, zeros, zeros, zeros, zeros,
               np.zeros((len(uncertainty.COVERAGE_LEVELS), num_targets)))

  def compute_per_target(self, y_std_T: np.ndarray,
                         distribution: bool = False
                         ) -> dict[str, np.ndarray]:
    """mse, rmse, mae and r2 for each target (original units); with
    `distribution`, nll (per example, original units) and coverage_<P> of
    the REPORTED_COVERAGE central intervals too."""
    n = float(self.count)
    mse_T = self.sse_T / n
    sst_T = (self.sum_z2_T - self.sum_z_T**2 / n) * np.float64(y_std_T)**2
    r2_T = 1.0 - self.sse_T / np.where(sst_T > 0, sst_T, np.nan)
    out = {'mse': mse_T, 'rmse': np.sqrt(mse_T), 'mae': self.sae_T / n,
           'r2': r2_T}
    if distribution:
      out['nll'] = self.nll_z_T / n + np.log(np.float64(y_std_T))
      for level in uncertainty.REPORTED_COVERAGE:
        out[coverage_key(level)] = self.coverage_LxT()[
            uncertainty.COVERAGE_LEVELS.index(level)]
    return out

  def coverage_LxT(self) -> np.ndarray:
    """The fraction of values inside each COVERAGE_LEVELS interval."""
    return self.covered_LxT / float(self.count)

  def compute(self, y_std_T: np.ndarray | None = None,
              distribution: bool = False) -> dict[str, float]:
    """The eval summary: per-target metrics averaged over targets."""
    if y_std_T is None:
      y_std_T = np.ones_like(self.sse_T)
    per_target = self.compute_per_target(y_std_T, distribution)
    return {name: float(np.mean(v)) for name, v in per_target.items()}


def coverage_key(level: float) -> str:
  """'coverage_90' for the central 90% interval."""
  return f'coverage_{round(level * 100)}'


def host_sum(batch_sums: Iterable[RegressionSums],
             num_targets: int) -> RegressionSums:
  """Adds per-batch device sums on the host in float64.

  Args:
    batch_sums: the eval steps' outputs, dispatched lazily as they are drawn.
    num_targets: T, the length of the per-target sums.

  Returns:
    The sums over every batch, as float64 numpy values.
  """
  total = RegressionSums.empty_host(num_targets)
  for sums in fetched(batch_sums):
    total = jax.tree.map(lambda a, b: a + np.asarray(b, np.float64),
                         total, sums)
  return total
