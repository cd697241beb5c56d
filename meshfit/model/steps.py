"""Pure train steps over the split train state.

`train_step` is one optimizer step of every member of the ensemble (vmapped
over the state's member dimension); `train_call` runs many of them in one
jitted call, the way training runs (eval and predict: forward.py). The
model is rebuilt from (graphdef, params) inside the traced function, so
NNX's graph traversal happens once at trace time, never per call
(`nnx.jit` runs a small MLP's step several times slower than `jax.jit`
over the split state: docs/performance.md). The steps' inputs are encoded
by `encode` (jitted for a resident table and for streamed chunks).
"""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from meshfit.data import features, row_order
from meshfit.data.features import FeatureStats, InputLayout
from meshfit.model import uncertainty
from meshfit.model.metrics import TrainMetrics
from meshfit.model.optim import Hyperparameters
from meshfit.model.state import TrainState
from meshfit.parallel import programs, sharding

Batch = dict[str, jax.Array]


def encode(stats: FeatureStats, layout: InputLayout, batch: Batch) -> Batch:
  """A batch (or table) of input columns and targets as the model reads
  them: scaled numbers, missing flags, codes and standardised targets."""
  inputs = features.model_inputs(stats, layout, batch['x'])
  return {**inputs, 'y': stats.standardize_y(batch['y'])}


# Up to this many elements, `global_norm` of unpartitioned leaves is one
# reduction over their concatenation. XLA:CPU runs that fusion slowly per
# element, so beyond it a kernel per leaf wins (docs/performance.md has the
# crossover and how it was measured).
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
               graphdef: nnx.GraphDef,
               member_tx: Callable[[Hyperparameters],
                                   optax.GradientTransformation],
               params_partitioned: bool = True, dropout: bool = False
               ) -> tuple[TrainState, jax.Array, jax.Array]:
  """One optimizer step of every member on its own batch.

  The members are vmapped: each has its own parameters, optimizer state,
  hyperparameters (`member_tx` builds its optimizer from them) and dropout
  key, and trains on its own batch of standardised targets; nothing passes
  between them. The state's train metrics are left as they are: `train_call`
  adds its steps' losses to them once per call (`_merge_steps`).

  Args:
    state: the train state.
    batch_z: each member's batch as `encode` returns it (M x B x ...).
    graphdef: one member's structure.
    member_tx: a member's optimizer from its hyperparameters.
    params_partitioned: some parameter may be split over the 'model' axis
      (see `global_norm`).
    dropout: some member has a positive dropout rate (static).

  Returns:
    The new state, and this step's losses and gradient norms, one per
    member (M).
  """
  def member(params, opt_state, hparams, rng, batch):
    key = (jax.random.fold_in(jax.random.wrap_key_data(rng), state.step)
           if dropout else None)

    def loss_fn(params):
      model = nnx.merge(graphdef, params)
      out = model(batch['numbers'], batch['missing'], batch['codes'],
                  batch['raw'], dropout_key=key, dropout_rate=hparams.dropout_rate_M)
      with jax.named_scope('loss'):
        return uncertainty.member_loss(out, batch['y'], model.likelihood,
                                       model.nll_beta)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    with jax.named_scope('optimizer'):
      updates, opt_state = member_tx(hparams).update(grads, opt_state, params)
      params = optax.apply_updates(params, updates)
      grad_norm = global_norm(grads, params_partitioned)
    return params, opt_state, loss, grad_norm

  members = (state.params, state.opt_state, state.hparams, state.rng_Mx2,
             batch_z)
  if state.num_members == 1:
    # A single model runs as itself, not as a vmap of one: XLA:CPU lays the
    # vmapped weight-gradient dots out transposed, and slower.
    params, opt_state, loss_M, grad_norm_M = jax.tree.map(
        lambda a: a[None], member(*jax.tree.map(lambda a: a[0], members)))
  else:
    params, opt_state, loss_M, grad_norm_M = jax.vmap(member)(*members)

  return state.replace(step=state.step + 1, params=params,
                       opt_state=opt_state), loss_M, grad_norm_M


def _merge_means(train_metrics: TrainMetrics, step: jax.Array,
                 loss: jax.Array, grad_norm: jax.Array,
                 log_every_steps: int) -> TrainMetrics:
  """The train metrics with the step that starts at `step` added (the
  members' mean `loss` and `grad_norm`), in a window that restarts with
  each step after a multiple of `log_every_steps`."""
  step_metrics = TrainMetrics.single_from_model_output(loss=loss,
                                                       grad_norm=grad_norm)
  empty = TrainMetrics.empty()
  new_window = step % log_every_steps == 0
  previous = jax.tree.map(lambda e, m: jnp.where(new_window, e, m),
                          empty, train_metrics)
  return jax.tree.map(lambda m, e: m.astype(e.dtype),
                      previous.merge(step_metrics), empty)


def _finite_mean(values_M: jax.Array, loss_M: jax.Array) -> jax.Array:
  """The mean of `values_M` over members whose loss is finite (NaN if
  none is), over the last axis: a diverged member does not hide the others'
  progress."""
  ok = jnp.isfinite(loss_M)
  count = jnp.sum(ok, axis=-1)
  return jnp.where(count > 0, jnp.sum(jnp.where(ok, values_M, 0.0), axis=-1)
                   / jnp.maximum(count, 1), jnp.nan)


def train_call(state: TrainState, table_z: Batch, chunk: Batch,
               num_steps: jax.Array, *, graphdef: nnx.GraphDef,
               member_tx: Callable[[Hyperparameters],
                                   optax.GradientTransformation],
               log_every_steps: int, batch_sharding: NamedSharding,
               dropout: bool = False
               ) -> tuple[TrainState, jax.Array, TrainMetrics]:
  """`num_steps` optimizer steps (`train_step`) in one call.

  The steps run in a `fori_loop` whose trip count is a runtime value, so one
  compiled program serves every chunk length and a run computes the same
  bits however its steps were grouped into calls (which exact resume relies
  on).

  Args:
    state: the train state.
    table_z: the training table on every device, as `encode` returns it,
      when the chunk is resident; else `{}`.
    chunk: from `feeding.TrainFeed`: either where each member's stream
      stands (`row_order.device_rows` makes the K x M x B table rows of its
      batches from it, here on the devices) or K x M x B rows as `encode`
      returns them (`jit_encode_chunk`).
    num_steps: how many of the chunk's K steps to train (int32 scalar).
    graphdef: one member's structure.
    member_tx: a member's optimizer from its hyperparameters.
    log_every_steps: the train metrics' window.
    batch_sharding: where each step's batches (M x B) live.
    dropout: some member has a positive dropout rate (static).

  Returns:
    The new state, the members' losses of the steps (K x M; entries past
    `num_steps` are zero) and a copy of the new state's train metrics (read
    by the loop after the state itself has been donated to the next call).
  """
  if 'offset_M' in chunk:
    with jax.named_scope('order'):
      chunk = {'idx': row_order.device_rows(chunk, batch_sharding.mesh)}
  k, m = (chunk['idx'] if 'idx' in chunk else chunk['y']).shape[:2]
  partitioned = batch_sharding.mesh.shape[sharding.MODEL] > 1

  def body(i, carry):
    state, losses_KxM, norms_KxM = carry
    with jax.named_scope('batch'):
      if 'idx' in chunk:
        idx_MxB = chunk['idx'][i]
        batch_z = {name: a[idx_MxB] for name, a in table_z.items()}
      else:
        batch_z = {name: a[i] for name, a in chunk.items()}
    batch_z = jax.lax.with_sharding_constraint(batch_z, batch_sharding)
    state, loss_M, grad_norm_M = train_step(
        state, batch_z, graphdef=graphdef, member_tx=member_tx,
        params_partitioned=partitioned, dropout=dropout)
    return (state, losses_KxM.at[i].set(loss_M),
            norms_KxM.at[i].set(grad_norm_M))

  # Kept split over 'members' like the members themselves, so that a step
  # needs nothing from another member's devices.
  zeros_KxM = jax.lax.with_sharding_constraint(
      jnp.zeros((k, m), jnp.float32), NamedSharding(
          batch_sharding.mesh, jax.sharding.PartitionSpec(
              None, batch_sharding.spec[0])))
  first_step = state.step
  carry = (state, zeros_KxM, zeros_KxM)
  if k == 1:  # a call is never empty: no loop, and no copies it carries
    state, losses_KxM, norms_KxM = body(0, carry)
  else:
    state, losses_KxM, norms_KxM = jax.lax.fori_loop(0, num_steps, body,
                                                     carry)
  state = state.replace(train_metrics=_merge_steps(
      state.train_metrics, first_step, losses_KxM, norms_KxM, num_steps,
      log_every_steps))
  return state, losses_KxM, state.train_metrics


def _merge_steps(train_metrics: TrainMetrics, first_step: jax.Array,
                 losses_KxM: jax.Array, norms_KxM: jax.Array,
                 num_steps: jax.Array, log_every_steps: int) -> TrainMetrics:
  """The train metrics with a call's steps added, one step at a time in
  step order, after the call: the members' mean is the one value that
  crosses the member axis while training, once per call rather than once
  per step."""
  loss_K = _finite_mean(losses_KxM, losses_KxM)
  grad_norm_K = _finite_mean(norms_KxM, losses_KxM)

  def add(i, metrics):
    return _merge_means(metrics, first_step + i, loss_K[i], grad_norm_K[i],
                        log_every_steps)
  return jax.lax.fori_loop(0, num_steps, add, train_metrics)


class TrainCall:
  """The jitted `train_call`, taking a chunk as the feed hands it out: a
  streamed chunk's rows (`x`, `y`) are first encoded by `jit_encode_chunk`,
  a program of its own, as the resident table is by `jit_encode`. Encoding
  inside the steps' program would let XLA fuse it there and round some
  inputs differently, and the two paths would train on different bits."""

  def __init__(self, jitted, jitted_resident, encode_chunk):
    self.jitted, self._encode_chunk = jitted, encode_chunk
    self.jitted_resident = jitted_resident

  def __call__(self, state: TrainState, table_z: Batch, chunk: Batch,
               num_steps: Any
               ) -> tuple[TrainState, jax.Array, TrainMetrics]:
    if 'offset_M' in chunk:
      return self.jitted_resident(state, table_z, chunk, num_steps)
    if 'x' in chunk:
      chunk = self._encode_chunk(state.stats, chunk)
    return self.jitted(state, table_z, chunk, num_steps)


@programs.memoize
def jit_train_call(graphdef: nnx.GraphDef, layout: InputLayout,
                   member_tx: Callable[[Hyperparameters],
                                       optax.GradientTransformation],
                   state_shardings: TrainState, mesh: Mesh,
                   log_every_steps: int, dropout: bool = False
                   ) -> TrainCall:
  """`train_call` jitted once: state donated, shardings pinned both ways.

  The table keeps the sharding it arrives with (replicated), as does a
  resident chunk's order; a streamed chunk is split over 'members' and
  'data', and a resident chunk's `epoch_M` and `offset_M` (numpy int32s
  will do) and `num_steps` are replicated. A jitted function compiles only
  the forms it is called with.
  """
  def jitted(chunk_shardings):
    return jax.jit(
        functools.partial(
            train_call, graphdef=graphdef, member_tx=member_tx,
            log_every_steps=log_every_steps,
            batch_sharding=sharding.member_batch_sharding(mesh),
            dropout=dropout),
        in_shardings=(state_shardings, None, chunk_shardings,
                      sharding.replicated(mesh)),
        out_shardings=(state_shardings, sharding.replicated(mesh),
                       state_shardings.train_metrics),
        donate_argnums=0)
  replicated = sharding.replicated(mesh)
  return TrainCall(
      jitted(sharding.chunk_sharding(mesh)),
      jitted({'order': None, 'epoch_M': replicated, 'offset_M': replicated}),
      jit_encode_chunk(mesh, layout))


@programs.memoize
def jit_encode_chunk(mesh: Mesh, layout: InputLayout
                     ) -> Callable[[FeatureStats, Batch], Batch]:
  """`encode` jitted for a streamed chunk (K x M x B rows of `x`, `y`),
  its output sharded as the chunk."""
  def encode_chunk(stats: FeatureStats, chunk: Batch) -> Batch:
    x, y = chunk['x'], chunk['y']
    flat = encode(stats, layout, {'x': x.reshape(-1, x.shape[-1]),
                                  'y': y.reshape(-1, y.shape[-1])})
    return {name: a.reshape(x.shape[:3] + a.shape[1:])
            for name, a in flat.items()}
  return jax.jit(encode_chunk, out_shardings=sharding.chunk_sharding(mesh))


# The resident table is encoded this many rows at a time: the quantile
# scaling's temporaries are ~10x its output, 1.6 GB for a 2M-row table
# encoded whole (a 10M-row table on 2 processes did not fit in 24 GB).
ENCODE_CHUNK_ROWS = 1 << 16


@programs.memoize
def jit_encode(mesh: Mesh, layout: InputLayout
               ) -> Callable[[FeatureStats, Batch], Batch]:
  """`encode` jitted for a table that lives on every device, a chunk of
  ENCODE_CHUNK_ROWS rows after another (rows are encoded alone: the same
  values as encoding it whole)."""
  def encode_table(stats: FeatureStats, table: Batch) -> Batch:
    rows, size = table['x'].shape[0], ENCODE_CHUNK_ROWS
    if rows <= size:
      return encode(stats, layout, table)

    def chunk_at(start: jax.Array) -> Batch:
      return encode(stats, layout, {
          name: jax.lax.dynamic_slice_in_dim(a, start, size)
          for name, a in table.items()})

    def body(i: jax.Array, out: Batch) -> Batch:
      # The last chunk ends at the last row (overlapping the one before):
      # every chunk has one size, and no padded copy of the table is made.
      start = jnp.minimum(i * size, rows - size)
      return {name: jax.lax.dynamic_update_slice_in_dim(out[name], a, start,
                                                        axis=0)
              for name, a in chunk_at(start).items()}

    shapes = jax.eval_shape(chunk_at, jnp.int32(0))
    out = {name: jnp.zeros((rows, *s.shape[1:]), s.dtype)
           for name, s in shapes.items()}
    return jax.lax.fori_loop(0, -(-rows // size), body, out)
  return jax.jit(encode_table, out_shardings=sharding.replicated(mesh))


