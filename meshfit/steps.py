"""Pure train, eval and predict steps over the split train state.

`train_step` is one optimizer step; `train_call` runs many of them in one
jitted call, the way training runs. The model is rebuilt from (graphdef,
params) inside the traced function, so NNX's graph traversal happens once at
trace time, never per call (`nnx.jit` runs a small MLP's step several times
slower than `jax.jit` over the split state: docs/performance.md).
"""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from meshfit import features, sharding
from meshfit.features import FeatureStats, InputLayout
from meshfit.metrics import RegressionSums, TrainMetrics
from meshfit.state import TrainState

Batch = dict[str, jax.Array]


def predict(graphdef: nnx.GraphDef, layout: InputLayout, state: TrainState,
            x_BxF: jax.Array) -> jax.Array:
  """Predictions in the targets' original units for input columns x_BxF."""
  model = nnx.merge(graphdef, state.params)
  inputs = features.model_inputs(state.stats, layout, x_BxF)
  return state.stats.unstandardize_y(
      model(inputs['numbers'], inputs['missing'], inputs['codes']))


def encode(stats: FeatureStats, layout: InputLayout, batch: Batch) -> Batch:
  """A batch (or table) of input columns and targets as the model reads
  them: scaled numbers, missing flags, codes and standardised targets."""
  inputs = features.model_inputs(stats, layout, batch['x'])
  return {**inputs, 'y': stats.standardize_y(batch['y'])}


# Up to this many elements, `global_norm` of unpartitioned leaves is one
# reduction over their concatenation. XLA:CPU runs that fusion slowly per
# element, so beyond it a kernel per leaf wins (`benchmarks/speed.py
# --sections=norm` measures both; docs/performance.md has the crossover).
ONE_REDUCTION_MAX_ELEMENTS = 1 << 16


def global_norm(tree: Any, partitioned: bool) -> jax.Array:
  """The L2 norm of every leaf of `tree` together.

  XLA:CPU runs a kernel per leaf for the usual sum of per-leaf norms, a
  large part of a small MLP's step; so small trees are raveled and
  concatenated into one fused reduction instead (the result differs in
  rounding only). Not for `partitioned` leaves (some split over
  the 'model' axis): concatenating differently sharded leaves gathers them.
  """
  leaves = [a.astype(jnp.float32) for a in jax.tree.leaves(tree)]
  if takes_one_reduction(sum(a.size for a in leaves), partitioned):
    return concatenated_norm(leaves)
  return optax.tree.norm(leaves)


def takes_one_reduction(num_elements: int, partitioned: bool) -> bool:
  """Whether `global_norm` computes such a tree's norm `concatenated_norm`'s
  way (else a reduction per leaf)."""
  return not partitioned and num_elements <= ONE_REDUCTION_MAX_ELEMENTS


def concatenated_norm(leaves: list[jax.Array]) -> jax.Array:
  """The L2 norm of `leaves` as one reduction over their concatenation."""
  return jnp.sqrt(jnp.sum(jnp.square(jnp.concatenate(
      [a.ravel() for a in leaves]))))


def train_step(state: TrainState, batch_z: Batch, *,
               graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
               log_every_steps: int, params_partitioned: bool = True
               ) -> tuple[TrainState, jax.Array]:
  """One optimizer step on the mean squared error in standardised units.

  Train metrics accumulate in the state; they restart with the first step of
  each logging window (steps after a multiple of `log_every_steps`).

  Args:
    state: the train state.
    batch_z: a batch as `encode` returns it (targets standardised).
    graphdef: the model's structure.
    tx: the optimizer.
    log_every_steps: the train metrics' window.
    params_partitioned: some parameter may be split over the 'model' axis
      (see `global_norm`).

  Returns:
    The new state and this step's loss (a replicated scalar that the loop
    uses to bound the steps in flight and to catch a non-finite loss).
  """
  z_BxT = batch_z['y']
  dropout_key = None
  if nnx.merge(graphdef, state.params).dropout_rate > 0:  # static
    dropout_key = jax.random.fold_in(jax.random.wrap_key_data(state.rng),
                                     state.step)

  def loss_fn(params):
    model = nnx.merge(graphdef, params)
    pred_BxT = model(batch_z['numbers'], batch_z['missing'],
                     batch_z['codes'], dropout_key=dropout_key)
    return jnp.mean((pred_BxT - z_BxT)**2)

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)

  step_metrics = TrainMetrics.single_from_model_output(
      loss=loss, grad_norm=global_norm(grads, params_partitioned))
  empty = TrainMetrics.empty()
  new_window = state.step % log_every_steps == 0
  previous = jax.tree.map(lambda e, m: jnp.where(new_window, e, m),
                          empty, state.train_metrics)
  train_metrics = jax.tree.map(lambda m, e: m.astype(e.dtype),
                               previous.merge(step_metrics), empty)
  return state.replace(step=state.step + 1, params=params,
                       opt_state=opt_state, train_metrics=train_metrics), loss


def train_call(state: TrainState, table_z: Batch, chunk: Batch,
               num_steps: jax.Array, *, graphdef: nnx.GraphDef,
               layout: InputLayout, tx: optax.GradientTransformation,
               log_every_steps: int, batch_sharding: NamedSharding
               ) -> tuple[TrainState, jax.Array, TrainMetrics]:
  """`num_steps` optimizer steps (`train_step`) in one call.

  The steps run in a `fori_loop` whose trip count is a runtime value, so one
  compiled program serves every chunk length and a run computes the same
  bits however its steps were grouped into calls (which exact resume relies
  on).

  Args:
    state: the train state.
    table_z: the training table on every device, as `encode` returns it,
      when the chunk holds row indices; else `{}`.
    chunk: from `feeding.TrainFeed`: either `idx` (K x B table rows) or
      `x`, `y` (K x B rows in original units).
    num_steps: how many of the chunk's K batches to train on (int32 scalar).
    graphdef: the model's structure.
    layout: which input columns are numbers and which categories.
    tx: the optimizer.
    log_every_steps: the train metrics' window.
    batch_sharding: where each step's batch lives.

  Returns:
    The new state, the losses of the steps (K of them; entries past
    `num_steps` are zero) and a copy of the new state's train metrics (read
    by the loop after the state itself has been donated to the next call).
  """
  k = (chunk['idx'] if 'idx' in chunk else chunk['x']).shape[0]
  partitioned = batch_sharding.mesh.shape[sharding.MODEL] > 1

  def body(i, carry):
    state, losses_K = carry
    if 'idx' in chunk:
      idx_B = chunk['idx'][i]
      batch_z = {name: a[idx_B] for name, a in table_z.items()}
    else:
      batch_z = encode(state.stats, layout, {'x': chunk['x'][i],
                                             'y': chunk['y'][i]})
    batch_z = jax.lax.with_sharding_constraint(batch_z, batch_sharding)
    state, loss = train_step(state, batch_z, graphdef=graphdef, tx=tx,
                             log_every_steps=log_every_steps,
                             params_partitioned=partitioned)
    return state, losses_K.at[i].set(loss)

  carry = (state, jnp.zeros((k,), jnp.float32))
  if k == 1:  # a call is never empty: no loop, and no copies it carries
    state, losses_K = body(0, carry)
  else:
    state, losses_K = jax.lax.fori_loop(0, num_steps, body, carry)
  return state, losses_K, state.train_metrics


def eval_step(state: TrainState, batch: Batch, *, graphdef: nnx.GraphDef,
              layout: InputLayout) -> RegressionSums:
  """Sums of errors over the batch's real examples (original units)."""
  pred_BxT = predict(graphdef, layout, state, batch['x'])
  return RegressionSums.from_model_output(
      pred_BxT=pred_BxT, y_BxT=batch['y'], mask_B=batch['mask'],
      stats=state.stats)


def jit_train_step(graphdef: nnx.GraphDef, layout: InputLayout,
                   tx: optax.GradientTransformation,
                   state_shardings: TrainState, mesh: Mesh,
                   log_every_steps: int
                   ) -> Callable[[TrainState, Batch],
                                 tuple[TrainState, jax.Array]]:
  """One `train_step` on a batch of input columns and targets, jitted: state
  donated, shardings pinned both ways (a reference for `train_call`)."""
  batch = sharding.batch_sharding(mesh)

  def step(state, batch):
    return train_step(state, encode(state.stats, layout, batch),
                      graphdef=graphdef, tx=tx,
                      log_every_steps=log_every_steps)
  return jax.jit(
      step,
      in_shardings=(state_shardings, {'x': batch, 'y': batch}),
      out_shardings=(state_shardings, sharding.replicated(mesh)),
      donate_argnums=0)


def jit_train_call(graphdef: nnx.GraphDef, layout: InputLayout,
                   tx: optax.GradientTransformation,
                   state_shardings: TrainState, mesh: Mesh,
                   log_every_steps: int
                   ) -> Callable[[TrainState, Batch, Batch, Any],
                                 tuple[TrainState, jax.Array, TrainMetrics]]:
  """`train_call` jitted once: state donated, shardings pinned both ways.

  The table keeps the sharding it arrives with (replicated); the chunk is
  split over 'data' along the batch dimension (numpy chunks are placed so)
  and `num_steps` (a numpy int32 will do) replicated.
  """
  return jax.jit(
      functools.partial(train_call, graphdef=graphdef, layout=layout, tx=tx,
                        log_every_steps=log_every_steps,
                        batch_sharding=sharding.batch_sharding(mesh)),
      in_shardings=(state_shardings, None,
                    sharding.chunk_sharding(mesh),
                    sharding.replicated(mesh)),
      out_shardings=(state_shardings, sharding.replicated(mesh),
                     state_shardings.train_metrics),
      donate_argnums=0)


def jit_encode(mesh: Mesh, layout: InputLayout
               ) -> Callable[[FeatureStats, Batch], Batch]:
  """`encode` jitted for a table that lives on every device."""
  return jax.jit(lambda stats, table: encode(stats, layout, table),
                 out_shardings=sharding.replicated(mesh))


def jit_eval_step(graphdef: nnx.GraphDef, layout: InputLayout,
                  state_shardings: TrainState,
                  mesh: Mesh) -> Callable[[TrainState, Batch], RegressionSums]:
  """`eval_step` jitted once; its sums come back replicated."""
  batch = sharding.batch_sharding(mesh)
  return jax.jit(
      functools.partial(eval_step, graphdef=graphdef, layout=layout),
      in_shardings=(state_shardings,
                    {'x': batch, 'y': batch, 'mask': batch}),
      out_shardings=sharding.replicated(mesh))


def jit_predict_step(graphdef: nnx.GraphDef, layout: InputLayout,
                     state_shardings: TrainState,
                     mesh: Mesh) -> Callable[[TrainState, jax.Array],
                                             jax.Array]:
  """`predict` jitted once; predictions come back replicated.

  Replicated, so that every process (process 0 writes the file) can read the
  whole batch's predictions on the host.
  """
  return jax.jit(functools.partial(predict, graphdef, layout),
                 in_shardings=(state_shardings,
                               sharding.batch_sharding(mesh)),
                 out_shardings=sharding.replicated(mesh))
