"""The trained model run forward: every member's outputs, their weighted
mixture (`uncertainty.py`), predictions and intervals, and the eval step's
metric sums, each also jitted once with its shardings pinned.

As in steps.py, the model is rebuilt from (graphdef, params) inside the
traced function.
"""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from meshfit.data import features
from meshfit.data.features import InputLayout
from meshfit.model import uncertainty
from meshfit.model.metrics import RegressionSums
from meshfit.model.state import TrainState
from meshfit.model.steps import Batch
from meshfit.parallel import programs, sharding


def member_outputs(graphdef: nnx.GraphDef, layout: InputLayout,
                   state: TrainState, x_BxF: jax.Array
                   ) -> tuple[jax.Array, jax.Array]:
  """Every member's (mean_MxBxT, var_MxBxT) in standardised units (var 0
  for a squared-error model) for input columns x_BxF: its prediction,
  blended with its ridge part if it has one."""
  inputs = features.model_inputs(state.stats, layout, x_BxF)

  def member(params):
    model = nnx.merge(graphdef, params)
    return uncertainty.split_outputs(
        model(inputs['numbers'], inputs['missing'], inputs['codes'],
              inputs['raw'], blended=True),
        model.likelihood)
  return jax.vmap(member)(state.params)


def member_parts(graphdef: nnx.GraphDef, layout: InputLayout,
                 state: TrainState, x_BxF: jax.Array
                 ) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """(mean_MxBxT, var_MxBxT, ridge_MxBxT): every member's network alone,
  as `member_outputs`, and its ridge part's prediction (None without one),
  standardised units: what the validation rows weigh."""
  return _parts_of_inputs(graphdef, state,
                          features.model_inputs(state.stats, layout, x_BxF))


def _parts_of_inputs(graphdef: nnx.GraphDef, state: TrainState,
                     inputs: Batch
                     ) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """`member_parts` of rows already encoded (`steps.encode`)."""
  args = (inputs['numbers'], inputs['missing'], inputs['codes'],
          inputs['raw'])

  def member(params):
    model = nnx.merge(graphdef, params)
    mean, var = uncertainty.split_outputs(model.network(*args),
                                          model.likelihood)
    return mean, var, (None if model.ridge is None
                       else model.ridge_part(*args))
  return jax.vmap(member)(state.params)


def held_out_member_parts(graphdef: nnx.GraphDef, layout: InputLayout,
                          state: TrainState, x_BxF: jax.Array,
                          members_K: jax.Array
                          ) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """`member_parts` of the members `members_K` (indices) alone: those that
  held out the fold of the rows `x_BxF`, all that their out-of-fold
  choice reads of them."""
  return member_parts(graphdef, layout, _members(state, members_K), x_BxF)


def held_out_member_parts_of_rows(graphdef: nnx.GraphDef, state: TrainState,
                                  table_z: Batch, idx_Bx1: jax.Array,
                                  members_K: jax.Array
                                  ) -> tuple[jax.Array, jax.Array,
                                             jax.Array | None]:
  """`held_out_member_parts` of rows `idx_Bx1[:, 0]` of the encoded table
  the train call gathers its batches from: the validation rows of a
  cross-fitted run are its training rows, encoded once for the run rather
  than at every evaluation."""
  idx_B = idx_Bx1[:, 0]
  inputs = {name: a[idx_B] for name, a in table_z.items() if name != 'y'}
  return _parts_of_inputs(graphdef, _members(state, members_K), inputs)


def _members(state: TrainState, members_K: jax.Array) -> TrainState:
  """`state` with the members `members_K` (indices) alone."""
  return state.replace(params=jax.tree.map(lambda a: a[members_K],
                                           state.params))


def mixture(graphdef: nnx.GraphDef, layout: InputLayout, state: TrainState,
            x_BxF: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(w_MxBxT, mean_MxBxT, var_MxBxT): the members' outputs and weights
  (`uncertainty.member_weights`), standardised units."""
  mean, var = member_outputs(graphdef, layout, state, x_BxF)
  return uncertainty.member_weights(state.weights_M, mean, var), mean, var


def predict(graphdef: nnx.GraphDef, layout: InputLayout, state: TrainState,
            x_BxF: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(pred_BxT, std_BxT) of the ensemble in the targets' original units.

  The std is the mixture's: members' variances and their disagreement (for
  a squared-error model, the disagreement alone).
  """
  mean_z, var_z = uncertainty.mixture_moments(
      *mixture(graphdef, layout, state, x_BxF))
  return (state.stats.unstandardize_y(mean_z),
          jnp.sqrt(var_z) * state.stats.y_std_T[None])


def predict_interval(graphdef: nnx.GraphDef, layout: InputLayout,
                     state: TrainState, x_BxF: jax.Array,
                     probability: jax.Array | float
                     ) -> tuple[jax.Array, jax.Array]:
  """(lower_BxT, upper_BxT): the mixture's central `probability` interval,
  original units."""
  w, mean, var = mixture(graphdef, layout, state, x_BxF)
  tail = 0.5 * (1.0 - probability)
  return tuple(state.stats.unstandardize_y(
      uncertainty.mixture_quantile(w, mean, var, q))
               for q in (tail, 1.0 - tail))


def eval_step(state: TrainState, batch: Batch, *, graphdef: nnx.GraphDef,
              layout: InputLayout, distribution: bool = False
              ) -> RegressionSums:
  """Sums of errors over the batch's real examples (original units); with
  `distribution` (a gaussian model), of the mixture's negative log density
  and interval coverage too."""
  w, mean, var = mixture(graphdef, layout, state, batch['x'])
  mean_z, _ = uncertainty.mixture_moments(w, mean, var)
  extra = {}
  if distribution:
    z_BxT = state.stats.standardize_y(batch['y'])
    extra = {'log_density_z_BxT': uncertainty.mixture_log_density(
        w, mean, var, z_BxT), 'covered_LxBxT': uncertainty.covered_LxBxT(
            uncertainty.mixture_cdf(w, mean, var, z_BxT))}
  return RegressionSums.from_model_output(
      pred_BxT=state.stats.unstandardize_y(mean_z), y_BxT=batch['y'],
      mask_B=batch['mask'], stats=state.stats, **extra)


@programs.memoize
def jit_eval_step(graphdef: nnx.GraphDef, layout: InputLayout,
                  state_shardings: TrainState, mesh: Mesh,
                  distribution: bool = False
                  ) -> Callable[[TrainState, Batch], RegressionSums]:
  """`eval_step` jitted once; its sums come back replicated."""
  batch = sharding.batch_sharding(mesh)
  return jax.jit(
      functools.partial(eval_step, graphdef=graphdef, layout=layout,
                        distribution=distribution),
      in_shardings=(state_shardings,
                    {'x': batch, 'y': batch, 'mask': batch}),
      out_shardings=sharding.replicated(mesh))


@programs.memoize
def jit_predict_step(graphdef: nnx.GraphDef, layout: InputLayout,
                     state_shardings: TrainState, mesh: Mesh,
                     interval: float | None = None
                     ) -> Callable[[TrainState, jax.Array],
                                   tuple[jax.Array, ...]]:
  """`predict` jitted once: (pred_BxT, std_BxT), and with `interval` the
  central interval's (lower_BxT, upper_BxT) too.

  Replicated, so that every process (process 0 writes the file) can read the
  whole batch's predictions on the host.
  """
  def step(state, x_BxF):
    out = predict(graphdef, layout, state, x_BxF)
    if interval is not None:
      out += predict_interval(graphdef, layout, state, x_BxF, interval)
    return out
  return jax.jit(step, in_shardings=(state_shardings,
                                     sharding.batch_sharding(mesh)),
                 out_shardings=sharding.replicated(mesh))


@programs.memoize
def jit_member_parts(graphdef: nnx.GraphDef, layout: InputLayout,
                     state_shardings: TrainState, mesh: Mesh
                     ) -> Callable[[TrainState, jax.Array],
                                   tuple[jax.Array, jax.Array,
                                         jax.Array | None]]:
  """`member_parts` jitted once (every member's, for choosing them and the
  blend); replicated."""
  return jax.jit(functools.partial(member_parts, graphdef, layout),
                 in_shardings=(state_shardings,
                               sharding.batch_sharding(mesh)),
                 out_shardings=sharding.replicated(mesh))


@programs.memoize
def jit_held_out_member_parts(graphdef: nnx.GraphDef, layout: InputLayout,
                              state_shardings: TrainState, mesh: Mesh
                              ) -> Callable[[TrainState, jax.Array, jax.Array],
                                            tuple[jax.Array, jax.Array,
                                                  jax.Array | None]]:
  """`held_out_member_parts` jitted once for every fold (the members are an
  argument); replicated."""
  return jax.jit(functools.partial(held_out_member_parts, graphdef, layout),
                 in_shardings=(state_shardings, sharding.batch_sharding(mesh),
                               sharding.replicated(mesh)),
                 out_shardings=sharding.replicated(mesh))


@programs.memoize
def jit_held_out_member_parts_of_rows(
    graphdef: nnx.GraphDef, state_shardings: TrainState, mesh: Mesh
) -> Callable[[TrainState, Batch, jax.Array, jax.Array],
              tuple[jax.Array, jax.Array, jax.Array | None]]:
  """`held_out_member_parts_of_rows` jitted once (the table, rows and
  members are arguments); replicated."""
  return jax.jit(functools.partial(held_out_member_parts_of_rows, graphdef),
                 in_shardings=(state_shardings, sharding.replicated(mesh),
                               sharding.batch_sharding(mesh),
                               sharding.replicated(mesh)),
                 out_shardings=sharding.replicated(mesh))
