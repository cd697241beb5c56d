"""The model over a whole table: predictions, every member's parts, metrics,
and the summaries of members and ridge parts that go beside them."""

from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from meshfit.input_pipeline.tables import Table
from meshfit.data import feeding
from meshfit.model import (metrics, optim, state as state_lib, forward,
                           uncertainty)
from meshfit.model.setup import Setup
from meshfit.parallel import in_flight, sharding
from meshfit.models import mlp


def predict_table(setup: Setup, state: state_lib.TrainState,
                  x_NxF: np.ndarray, batch_size: int,
                  interval: float | None = None) -> dict[str, np.ndarray]:
  """The ensemble's predictions for every row of `x_NxF`, in order.

  Batches are sharded over the mesh; the last one is padded and the padding
  dropped. Every process returns all N rows.

  Returns:
    {'pred': N x T, 'std': N x T} in the targets' original units, and with
    `interval` the central interval's 'lower' and 'upper'.
  """
  predict_step = forward.jit_predict_step(setup.graphdef, setup.arch.layout,
                                        setup.shardings, setup.mesh, interval)
  names = ('pred', 'std') + (('lower', 'upper') if interval else ())
  outputs = _over_batches(setup, x_NxF, batch_size,
                          lambda x: predict_step(state, x))
  return {name: np.concatenate([o[i] for o in outputs])[:x_NxF.shape[0]]
          if outputs else np.zeros((0, setup.arch.num_targets), np.float32)
          for i, name in enumerate(names)}


def table_member_parts(setup: Setup, state: state_lib.TrainState,
                 x_NxF: np.ndarray, batch_size: int, step=None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
  """Every member's network (mean_MxNxT, var_MxNxT) and ridge part
  (ridge_MxNxT, None without one), standardised units (to choose members
  and weigh the blend on validation rows).

  `step` is `forward.jit_member_parts` of this set-up when the caller calls
  this often (a new one traces and lowers again).
  """
  if step is None:
    step = forward.jit_member_parts(setup.graphdef, setup.arch.layout,
                                  setup.shardings, setup.mesh)
  outputs = _over_batches(setup, x_NxF, batch_size, lambda x: step(state, x))
  n = x_NxF.shape[0]
  return tuple(None if outputs[0][i] is None else
               np.concatenate([o[i] for o in outputs], axis=1)[:, :n]
               for i in range(3))


def held_out_member_parts(setup: Setup, state: state_lib.TrainState,
                          x_NxF: np.ndarray, fold_N: np.ndarray, folds: int,
                          batch_size: int, step, table_z=None
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
  """`table_member_parts` as a cross-fitted choice reads them: row i from
  the members that held out its fold (m % folds == fold_N[i]) alone, a
  folds-th of the work; the other entries are NaN, which the out-of-fold
  readers never touch (`selection.out_of_fold`).

  `step` is `forward.jit_held_out_member_parts` of this set-up; or, with
  `table_z` (the rows of `x_NxF` as the train call reads them, on every
  device), `forward.jit_held_out_member_parts_of_rows`, which reads the
  rows there instead of encoding them again.
  """
  members, n = state.num_members, x_NxF.shape[0]
  # Batches no larger than a fold (padded as a resident table is): a small
  # table's fold of 60 rows is not padded to 1,024, and tables a few rows
  # apart (cross-validation's training sets) share one compiled program.
  fold_rows = [np.flatnonzero(fold_N == fold) for fold in range(folds)]
  data = setup.mesh.shape[sharding.DATA]
  padded = feeding.padded_rows(max(len(rows) for rows in fold_rows))
  batch_size = min(batch_size, -(-padded // data) * data)
  parts = [None, None, None]
  for fold, rows in enumerate(fold_rows):
    held = np.arange(fold, members, folds, dtype=np.int32)
    if not len(rows) or not len(held):
      continue
    if table_z is None:
      fold_parts = table_member_parts(
          setup, state, x_NxF[rows], batch_size,
          lambda s, x, held=held: step(s, x, held))
    else:  # the rows' indices stand in for their columns
      fold_parts = table_member_parts(
          setup, state, rows[:, None].astype(np.int32), batch_size,
          lambda s, idx, held=held: step(s, table_z, idx, held))
    for i, part_KxRxT in enumerate(fold_parts):
      if part_KxRxT is None:
        continue
      if parts[i] is None:
        parts[i] = np.full((members, n, *part_KxRxT.shape[2:]), np.nan,
                           part_KxRxT.dtype)
      parts[i][held[:, None], rows[None]] = part_KxRxT
  return tuple(parts)


def _over_batches(setup: Setup, x_NxF: np.ndarray, batch_size: int,
                  fn: Callable[[jax.Array], tuple]) -> list[tuple]:
  """`fn` of every batch of rows (sharded, the last padded), fetched."""
  return list(in_flight.fetched(
      fn(batch['x']) for batch in feeding.eval_batches(
          x_NxF, None, batch_size=batch_size,
          batch_sharding=sharding.batch_sharding(setup.mesh))))


def evaluate_table(setup: Setup, state: state_lib.TrainState, table: Table,
                   batch_size: int, eval_step=None) -> dict:
  """mse, rmse, mae, r2 (original units) over every example of `table`;
  for a model that predicts a distribution, nll and coverage_50/90/95 too,
  and `coverage`: {level: the fraction of values inside the central
  interval of that probability} for each of COVERAGE_LEVELS.

  The overall values average the targets'; `targets` holds each target's
  own, in its units.

  Args:
    setup: the run's set-up.
    state: the train state.
    table: the examples, each counted once.
    batch_size: the global eval batch size.
    eval_step: `forward.jit_eval_step` of this set-up, when the caller has
      one already (default: made here).
  """
  if eval_step is None:
    eval_step = forward.jit_eval_step(setup.graphdef, setup.arch.layout,
                                    setup.shardings, setup.mesh,
                                    setup.distribution)
  batch_sums = (eval_step(state, batch) for batch in feeding.eval_batches(
      table.x_NxF, table.y_NxT, batch_size=batch_size,
      batch_sharding=sharding.batch_sharding(setup.mesh)))
  total = metrics.host_sum(batch_sums, table.y_NxT.shape[1])
  y_std_T = np.asarray(jax.device_get(state.stats.y_std_T))
  return summarize(total, y_std_T, table.target_names, setup.distribution)


def summarize(total: metrics.RegressionSums, y_std_T: np.ndarray,
              target_names: Sequence[str], distribution: bool) -> dict:
  """`evaluate_table`'s result from the sums over a split's examples."""
  result = total.compute(y_std_T, distribution)
  result['num_examples'] = int(total.count)
  per_target = total.compute_per_target(y_std_T, distribution)
  result['targets'] = {name: {k: float(v[t]) for k, v in per_target.items()}
                       for t, name in enumerate(target_names)}
  if distribution:
    coverage_LxT = total.coverage_LxT()
    result['coverage'] = _by_level(coverage_LxT.mean(axis=1))
    for t, name in enumerate(target_names):
      result['targets'][name]['coverage'] = _by_level(coverage_LxT[:, t])
  return result


def _by_level(coverage_L: np.ndarray) -> dict[str, float]:
  """{'0.9': observed coverage, ...} for each of COVERAGE_LEVELS."""
  return {str(level): float(c)
          for level, c in zip(uncertainty.COVERAGE_LEVELS, coverage_L)}


def _on_host(x: jax.Array) -> np.ndarray:
  """`x` whole on this host; one spread over several hosts' devices (the
  members of a multi-host ensemble) is gathered: every process calls it."""
  if x.is_fully_addressable:
    return np.asarray(jax.device_get(x))
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def members_summary(state: state_lib.TrainState,
                    hparams: optim.Hyperparameters) -> dict[str, dict]:
  """{member: {'weight', hyperparameters...}} of the members with a weight."""
  weights = _on_host(state.weights_M)
  return {str(m): {'weight': float(weights[m]), **hparams.member(int(m))}
          for m in np.flatnonzero(weights > 0)}


def ridge_weights(state: state_lib.TrainState, target_names: Sequence[str]
                  ) -> dict[str, float] | None:
  """{target: the ridge part's weight in the prediction}, or None for a
  model without ridge parts (members share one weight)."""
  part = state.params.get(mlp.FITTED)
  if part is None:
    return None
  weight_T = _on_host(part['weight'])[0]
  return {name: float(w) for name, w in zip(target_names, weight_T)}
