"""Each member's ridge part (models/ridge.py), fitted in closed form.

A fresh run with `model.ridge_blend` fits, before its first step, one ridge
regression per set of training rows its members have: with cross-fitting
(`dataset.validation` = F folds) one per fold, on every other fold, and
member m takes the one that left out its own fold m % F; with held-out rows
(a fraction in `dataset.validation`) one, on the rows the members train on. The
inputs are what the ridge part reads (the numbers as the network gets them,
flags, categories one-hot) and the targets are standardised, so the fit is
that of the model's own units.

Where the layout gives the numbers as they are too (`model.raw_numbers`),
the fit reads those and leaves the scaled numbers at weight zero, so that
the part is linear in the numbers themselves.

The penalty is chosen per target out of PENALTIES by the same validation
rows that will weigh the blend: each fit is scored on the rows it left out
(its fold, or the held-out rows). Everything comes from per-group sums of
x x^T, x, x y, y and y^2 (float64), one pass over at most RIDGE_ROWS rows;
a fit's scores for every penalty come from one eigendecomposition and the
sums of the rows it is scored on, so no row is read twice.

At every evaluation the loop then weighs the ridge part against the network
on the validation rows (`selection.blend`) and writes that weight into every
member (`with_weight`), which eval, predict and export apply.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from meshfit.data import features, splits as splits_lib
from meshfit.data.features import FeatureStats, InputLayout
from meshfit.model.setup import Setup
from meshfit.model.state import TrainState
from meshfit.models import mlp

# The fit reads at most this many rows (of the training table, and of the
# validation rows): every k-th row beyond it. A linear model of up to
# MAX_INPUTS inputs is well determined long before.
RIDGE_ROWS = 1 << 16
# Candidate penalties, per row: the fit minimises mean((x w + b - z)^2) +
# penalty |w|^2, its inputs of about unit scale (scaled numbers, 0/1 flags
# and one-hot codes). From almost least squares to almost the mean.
PENALTIES = np.logspace(-6, 2, 17)
# Rows encoded at a time (their one-hot inputs are dense here).
_CHUNK_ROWS = 8192


@dataclasses.dataclass(frozen=True)
class Fit:
  """The fitted ridge parts: one per set of training rows (K of them).

  Attributes:
    kernel_KxDxT: weights of the dense inputs (ridge_inputs' order).
    table_KxVxT: weights of each taken category's codes, in the ridge
      part's table order (V: their codes, not padded).
    bias_KxT: intercepts.
    penalty_T: each target's chosen penalty.
    validation_mse_T: each target's mean squared error over the validation
      rows at that penalty (standardised units), each row predicted by the
      fit that left it out.
    rows: the training rows the fits read (all groups).
  """
  kernel_KxDxT: np.ndarray
  table_KxVxT: np.ndarray
  bias_KxT: np.ndarray
  penalty_T: np.ndarray
  validation_mse_T: np.ndarray
  rows: int


class _Sums:
  """Per group: n, sum x, sum x x^T, sum x z, sum z, sum z^2 (float64)."""

  def __init__(self, groups: int, inputs: int, targets: int):
    self.n = np.zeros(groups)
    self.x = np.zeros((groups, inputs))
    self.xx = np.zeros((groups, inputs, inputs))
    self.xz = np.zeros((groups, inputs, targets))
    self.z = np.zeros((groups, targets))
    self.zz = np.zeros((groups, targets))

  def add(self, group: int, x_NxD: np.ndarray, z_NxT: np.ndarray) -> None:
    self.n[group] += len(x_NxD)
    self.x[group] += x_NxD.sum(axis=0)
    self.xx[group] += x_NxD.T @ x_NxD
    self.xz[group] += x_NxD.T @ z_NxT
    self.z[group] += z_NxT.sum(axis=0)
    self.zz[group] += (z_NxT**2).sum(axis=0)

  def without(self, group: int) -> tuple[np.ndarray, ...]:
    """The sums of every group but `group`."""
    keep = np.arange(len(self.n)) != group
    return tuple(a[keep].sum(axis=0) for a in
                 (self.n, self.x, self.xx, self.xz, self.z, self.zz))

  def of(self, group: int) -> tuple[np.ndarray, ...]:
    return tuple(a[group] for a in
                 (self.n, self.x, self.xx, self.xz, self.z, self.zz))


def design(stats: FeatureStats, layout: InputLayout, x_NxF: np.ndarray
           ) -> np.ndarray:
  """The ridge part's inputs for rows of input columns, float64: the dense
  inputs (`mlp.ridge_inputs`), then each taken category one-hot."""
  inputs = jax.device_get(features.model_inputs(
      stats, layout, jnp.asarray(x_NxF)))
  dense = np.asarray(mlp.ridge_inputs(inputs['numbers'], inputs['missing'],
                                      inputs['raw']), np.float64)
  if layout.raw_numbers:
    # Where the numbers also come as they are, the fit reads only those: a
    # scaled number (quantile ranks) bends each one, and beside many
    # collinear numbers the bent copies under the same penalty cost a
    # linear target most of what ridge is for. A zero column's weight
    # solves to 0, so the part keeps its inputs (and checkpoints their
    # shapes).
    dense[:, :inputs['numbers'].shape[1]] = 0.0
  shape = layout.shape
  taken = shape.ridge_categories()
  sizes = [shape.category_sizes[c] for c in taken]
  onehot = np.zeros((len(x_NxF), sum(sizes)))
  codes = np.asarray(inputs['codes'])
  offset = 0
  for c, size in zip(taken, sizes):
    onehot[np.arange(len(x_NxF)), offset + codes[:, c]] = 1.0
    offset += size
  return np.concatenate([dense, onehot], axis=1)


def _solve(sums: tuple[np.ndarray, ...], penalties: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
  """(w_PxDxT, b_PxT): the ridge solution for each penalty, intercept
  unpenalised, from the training rows' sums."""
  n, sx, sxx, sxz, sz, _ = sums
  mean_x, mean_z = sx / n, sz / n
  gram_DxD = sxx / n - np.outer(mean_x, mean_x)
  cross_DxT = sxz / n - np.outer(mean_x, mean_z)
  eig_D, v_DxD = np.linalg.eigh(gram_DxD)
  eig_D = np.maximum(eig_D, 0.0)  # rounding below 0 of a singular gram
  projected_DxT = v_DxD.T @ cross_DxT
  w_PxDxT = np.einsum('de,pe,et->pdt', v_DxD,
                      1.0 / (eig_D[None] + penalties[:, None]),
                      projected_DxT)
  b_PxT = mean_z[None] - np.einsum('d,pdt->pt', mean_x, w_PxDxT)
  return w_PxDxT, b_PxT


def _sse(sums: tuple[np.ndarray, ...], w_PxDxT: np.ndarray,
         b_PxT: np.ndarray) -> np.ndarray:
  """sum((x w + b - z)^2) over the rows of `sums`, per penalty and target
  (P x T), expanded in their sums."""
  n, sx, sxx, sxz, sz, szz = sums
  quadratic = np.einsum('pdt,de,pet->pt', w_PxDxT, sxx, w_PxDxT)
  return (quadratic + 2 * b_PxT * np.einsum('d,pdt->pt', sx, w_PxDxT)
          + n * b_PxT**2 - 2 * np.einsum('pdt,dt->pt', w_PxDxT, sxz)
          - 2 * b_PxT * sz[None] + szz[None])


def fit(stats: FeatureStats, layout: InputLayout, x_NxF: np.ndarray,
        z_NxT: np.ndarray, group_N: np.ndarray, fits: int) -> Fit:
  """The ridge parts of rows grouped for validation.

  Args:
    stats: the training statistics (the inputs' scaling).
    layout: the model's inputs.
    x_NxF: rows of input columns.
    z_NxT: their standardised targets.
    group_N: each row's group: fit k < `fits` trains on every row whose
      group is not k and is scored on those whose group is k; a row of
      group `fits` or above trains every fit.
    fits: K, the fits.
  """
  num_dense = layout.shape.ridge_dense
  width = num_dense + sum(layout.shape.category_sizes[c]
                          for c in layout.shape.ridge_categories())
  targets = z_NxT.shape[1]
  sums = _Sums(fits + 1, width, targets)
  for start in range(0, len(x_NxF), _CHUNK_ROWS):
    x = design(stats, layout, x_NxF[start:start + _CHUNK_ROWS])
    z = z_NxT[start:start + _CHUNK_ROWS].astype(np.float64)
    g = np.minimum(group_N[start:start + _CHUNK_ROWS], fits)
    for group in np.unique(g):
      x_g, z_g = x[g == group], z[g == group]
      sums.add(int(group), x_g, z_g)
  solutions, sse_PxT = [], np.zeros((len(PENALTIES), targets))
  for k in range(fits):
    w_PxDxT, b_PxT = _solve(sums.without(k), PENALTIES)
    solutions.append((w_PxDxT, b_PxT))
    sse_PxT += _sse(sums.of(k), w_PxDxT, b_PxT)
  scored = sums.n[:fits].sum()
  best_T = np.argmin(sse_PxT, axis=0)
  w_KxDxT = np.stack([w[best_T, :, np.arange(targets)].T
                      for w, _ in solutions])
  b_KxT = np.stack([b[best_T, np.arange(targets)] for _, b in solutions])
  return Fit(w_KxDxT[:, :num_dense], w_KxDxT[:, num_dense:], b_KxT,
             PENALTIES[best_T],
             sse_PxT[best_T, np.arange(targets)] / max(scored, 1),
             len(x_NxF))


def _every(n: int, most: int) -> np.ndarray:
  """Row numbers of every k-th row of n, at most `most` of them."""
  return np.arange(0, n, -(-n // most))


def fit_splits(stats: FeatureStats, layout: InputLayout, splits: splits_lib.Splits
               ) -> tuple[Fit, int]:
  """(the fits, K) for a run's splits: per fold with cross-fitting, else
  one on the training rows scored on the held-out rows."""
  validation = splits.validation
  if splits.folds:
    rows = _every(validation.num_examples, RIDGE_ROWS)
    x, y = validation.x_NxF[rows], validation.y_NxT[rows]
    groups, fits = splits.validation_fold_N[rows], len(splits.folds)
  else:
    train = splits_lib.training_sample(splits, RIDGE_ROWS)
    held = _every(validation.num_examples, RIDGE_ROWS)
    x = np.concatenate([validation.x_NxF[held], train.x_NxF])
    y = np.concatenate([validation.y_NxT[held], train.y_NxT])
    groups, fits = np.repeat([0, 1], [len(held), train.num_examples]), 1
  z = (y.astype(np.float64) - stats.y_mean_T) / stats.y_std_T
  return fit(stats, layout, x, z, groups, fits), fits


def fit_into(state: TrainState, setup: Setup, splits: splits_lib.Splits
             ) -> TrainState:
  """`state` (a fresh one) with every member's ridge part fitted.

  Every process fits from its own copy of the rows; process 0's result is
  broadcast, so that the parameters are one value everywhere even where
  hosts' linear algebra rounds differently.
  """
  stats = jax.device_get(state.stats)
  result, fits = fit_splits(stats, setup.arch.layout, splits)
  members = setup.arch.num_members
  pick = np.arange(members) % fits  # member m left out fold m % F
  rows = state.params[mlp.FITTED]['table'].shape[1] if (
      'table' in state.params[mlp.FITTED]) else 0
  values = {'kernel': result.kernel_KxDxT[pick],
            'bias': result.bias_KxT[pick]}
  if rows:
    table = np.zeros((members, rows, result.table_KxVxT.shape[2]))
    table[:, :result.table_KxVxT.shape[1]] = result.table_KxVxT[pick]
    values['table'] = table
  values = jax.tree.map(lambda a: np.asarray(a, np.float32), values)
  if jax.process_count() > 1:
    values = multihost_utils.broadcast_one_to_all(values)
  part = dict(state.params[mlp.FITTED])
  for name, value in values.items():
    part[name] = jax.device_put(value,
                                setup.shardings.params[mlp.FITTED][name])
  logging.info(
      'Ridge part: %d inputs (%d numbers and flags, %d category codes), '
      'fitted on %d rows %s; penalty %s, validation RMSE %s (standardised).',
      result.kernel_KxDxT.shape[1] + result.table_KxVxT.shape[1],
      result.kernel_KxDxT.shape[1], result.table_KxVxT.shape[1], result.rows,
      f'in {fits} folds' if fits > 1 else 'and held-out rows',
      ', '.join(f'{p:.2g}' for p in result.penalty_T),
      ', '.join(f'{np.sqrt(m):.4g}' for m in result.validation_mse_T))
  return state.replace(params={**state.params, mlp.FITTED: part})


def with_weight(state: TrainState, weight_T: np.ndarray,
                shardings: TrainState) -> TrainState:
  """`state` with the ridge parts' weight in the blend set to `weight_T`
  in every member (placed by `shardings`, the state's)."""
  members = state.weights_M.shape[0]
  weight = jax.device_put(
      np.broadcast_to(np.asarray(weight_T, np.float32),
                      (members, len(weight_T))).copy(),
      shardings.params[mlp.FITTED]['weight'])
  part = {**state.params[mlp.FITTED], 'weight': weight}
  return state.replace(params={**state.params, mlp.FITTED: part})
