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
the part is linear in the numbers themselves (`design`).

The penalty is chosen per target out of PENALTIES by every row each fit
has: its squared error on the rows it left out (its fold, or the held-out
rows) and, on the rows it trains on, their generalised cross-validation
estimate of it (Golub, Heath and Wahba 1979, as RidgeCV's default), summed
over the fits. The left-out rows alone are few on a small table and choose
noisily (a few hundred collinear spectra: a penalty a third of the best,
2% more error, on one split). Everything comes from per-group sums of
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
# The network's inputs, where the fit reads the scaled numbers (no raw
# ones): compiled once per layout and shape.
_model_inputs = jax.jit(features.model_inputs, static_argnums=1)


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
  inputs (`mlp.ridge_inputs`), then each taken category one-hot.

  Where the layout gives the numbers as they are too (`model.raw_numbers`),
  the fit reads those and leaves the scaled numbers at zero: a scaled number
  (quantile ranks) bends each one, and beside many collinear numbers the
  bent copies under the same penalty cost a linear target most of what
  ridge is for. A zero column's weight solves to 0, so the part keeps its
  inputs (and checkpoints their shapes).
  """
  if layout.raw_numbers:
    inputs = _raw_inputs(stats, layout, x_NxF)
  else:
    inputs = jax.device_get(_model_inputs(stats, layout, jnp.asarray(x_NxF)))
  # `mlp.ridge_inputs`' order, on the host (jnp would compile it).
  dense = np.concatenate([np.asarray(inputs[k], np.float64)
                          for k in ('numbers', 'raw', 'missing')], axis=1)
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


def _raw_inputs(stats: FeatureStats, layout: InputLayout,
                x_NxF: np.ndarray) -> dict[str, np.ndarray]:
  """`features.model_inputs` as the ridge part reads it with raw numbers,
  on the host in the same float32 steps: the scaled numbers zero (unread),
  so that a fit compiles nothing (op by op in JAX, this encoding compiled
  dozens of small programs in every run)."""
  n = len(layout.number_columns)
  numbers = np.asarray(x_NxF[:, list(layout.number_columns)], np.float32)
  absent = np.isnan(numbers)
  numbers = np.where(absent, np.asarray(stats.fill_N[:n])[None], numbers)
  if layout.scaling != 'none':
    numbers = np.clip((numbers - np.asarray(stats.mean_N[:n])[None])
                      / np.asarray(stats.std_N[:n])[None],
                      -features.RAW_CLIP, features.RAW_CLIP)
  return {'numbers': np.zeros_like(numbers), 'raw': numbers,
          'missing': absent[:, list(layout.missing_numbers)].astype(
              np.float32),
          'codes': x_NxF[:, list(layout.category_columns)].astype(np.int32)}


def _solve(sums: tuple[np.ndarray, ...], penalties: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(w_PxDxT, b_PxT, df_P): the ridge solution for each penalty, intercept
  unpenalised, from the training rows' sums, and its degrees of freedom
  (the trace of its hat matrix, the intercept's 1 included)."""
  n, sx, sxx, sxz, sz, _ = sums
  mean_x, mean_z = sx / n, sz / n
  gram_DxD = sxx / n - np.outer(mean_x, mean_x)
  cross_DxT = sxz / n - np.outer(mean_x, mean_z)
  eig_D, v_DxD = np.linalg.eigh(gram_DxD)
  eig_D = np.maximum(eig_D, 0.0)  # rounding below 0 of a singular gram
  projected_DxT = v_DxD.T @ cross_DxT
  shrink_PxD = 1.0 / (eig_D[None] + penalties[:, None])
  w_PxDxT = np.einsum('de,pe,et->pdt', v_DxD, shrink_PxD, projected_DxT)
  b_PxT = mean_z[None] - np.einsum('d,pdt->pt', mean_x, w_PxDxT)
  return w_PxDxT, b_PxT, 1.0 + np.sum(eig_D[None] * shrink_PxD, axis=1)


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
  gcv_PxT = np.zeros_like(sse_PxT)
  for k in range(fits):
    training = sums.without(k)
    w_PxDxT, b_PxT, df_P = _solve(training, PENALTIES)
    solutions.append((w_PxDxT, b_PxT))
    sse_PxT += _sse(sums.of(k), w_PxDxT, b_PxT)
    # Generalised cross-validation: the training rows' squared error
    # inflated by 1 / (1 - df / n)^2 estimates their leave-one-out error.
    room_P = 1.0 - df_P / training[0]
    with np.errstate(all='ignore'):
      gcv_PxT += np.where(room_P[:, None] > 0, _sse(training, w_PxDxT, b_PxT)
                          / np.maximum(room_P, 1e-12)[:, None]**2, np.inf)
  scored = sums.n[:fits].sum()
  best_T = np.argmin(sse_PxT + gcv_PxT, axis=0)
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
  # The part's kernel keeps a row where there are no dense inputs.
  kernel = np.zeros((members, *state.params[mlp.FITTED]['kernel'].shape[1:]))
  kernel[:, :result.kernel_KxDxT.shape[1]] = result.kernel_KxDxT[pick]
  values = {'kernel': kernel, 'bias': result.bias_KxT[pick]}
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
