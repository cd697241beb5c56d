"""The train state, created directly in its shardings.

An ensemble's K members are one state: every parameter and optimizer leaf
has a leading member dimension (logical name 'member', placed by
`meshfit/parallel/sharding.py`), and member m is initialised from (seed, m) alone, so
its values do not depend on how many members there are. A single model is
the ensemble of one.

Shapes come from `jax.eval_shape`, partition specs from the parameters'
logical names, and the state is materialised by a `jit` whose out_shardings
put every piece where it lives: nothing is built on one device first.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct
from jax.sharding import Mesh, PartitionSpec as P

from meshfit.data.features import FeatureStats, InputLayout
from meshfit.model.metrics import TrainMetrics
from meshfit.model.optim import Hyperparameters
from meshfit.parallel import programs, sharding
from meshfit.models.mlp import Mlp, MlpConfig


@struct.dataclass
class TrainState:
  """Everything that decides the future of a run; saved in every checkpoint.

  Attributes:
    step: optimizer steps taken (int32 scalar).
    params: the members' parameters as a nested dict, each leaf M x ...
    opt_state: optax state of every member (leaves M x ...), including the
      schedule's step counts.
    rng_Mx2: each member's raw uint32[2] key; member m's step s uses
      `fold_in(rng_Mx2[m], s)`.
    hparams: each member's learning rate, weight decay and dropout rate.
    weights_M: each member's weight in the ensemble's prediction (they sum
      to 1; 0 leaves a member out).
    stats: the training split's statistics (meshfit/data/features.py).
    train_metrics: accumulators since the last train-metrics log.
  """
  step: jax.Array
  params: Any
  opt_state: optax.OptState
  rng_Mx2: jax.Array
  hparams: Hyperparameters
  weights_M: jax.Array
  stats: FeatureStats
  train_metrics: TrainMetrics

  @property
  def num_members(self) -> int:
    return self.weights_M.shape[0]


@dataclasses.dataclass(frozen=True)
class Architecture:
  """What it takes to build the model: static, hashable, not saved as arrays."""
  mlp: MlpConfig
  layout: InputLayout
  num_targets: int

  @property
  def num_members(self) -> int:
    return self.mlp.ensemble_size

  def build(self, key: int | jax.Array) -> Mlp:
    """One member, initialised from `key` (a seed or a PRNG key)."""
    # Logical names stay metadata; meshfit/parallel/sharding.py places the arrays.
    with nnx.use_eager_sharding(False):
      return Mlp(self.mlp, self.layout.shape, self.num_targets,
                 rngs=nnx.Rngs(key))


def member_key(seed: int, member: jax.Array | int) -> jax.Array:
  """Member `member`'s root key: its parameters and dropout come from it."""
  return jax.random.fold_in(jax.random.key(seed), member)


@functools.lru_cache(maxsize=16)
def _abstract_model(arch: Architecture) -> Mlp:
  """One member's shapes and metadata, no arrays (built once per
  architecture: a start needs them several times, and each build traces
  the model)."""
  with nnx.use_eager_sharding(False):
    return nnx.eval_shape(lambda: arch.build(0))


def graphdef(arch: Architecture) -> nnx.GraphDef:
  """One member's static structure, for `nnx.merge(graphdef, params_m)`."""
  return nnx.split(_abstract_model(arch), nnx.Param)[0]


def _init(arch: Architecture, tx: optax.GradientTransformation,
          seed: int | jax.Array,
          stats: FeatureStats, hparams: Hyperparameters) -> TrainState:
  m = arch.num_members
  keys_M = jax.vmap(lambda i: member_key(seed, i))(jnp.arange(m))
  params = jax.vmap(lambda k: nnx.to_pure_dict(
      nnx.state(arch.build(k), nnx.Param)))(keys_M)
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=jax.vmap(tx.init)(params),
      rng_Mx2=jax.vmap(lambda k: jax.random.key_data(
          jax.random.fold_in(k, 1)))(keys_M).astype(jnp.uint32),
      hparams=jax.tree.map(jnp.asarray, hparams),
      weights_M=jnp.full((m,), 1.0 / m, jnp.float32),
      stats=stats,
      train_metrics=TrainMetrics.empty())


def _placeholder_hparams(members: int) -> Hyperparameters:
  ones = np.ones(members, np.float32)
  return Hyperparameters(ones, ones, ones)


@functools.lru_cache(maxsize=16)
def _state_shapes(arch: Architecture,
                  tx: optax.GradientTransformation) -> TrainState:
  """ShapeDtypeStructs of every leaf (traced once per arch and optimizer)."""
  return jax.eval_shape(
      lambda: _init(arch, tx, 0, FeatureStats.identity(
          len(arch.layout.number_columns), arch.num_targets),
                    _placeholder_hparams(arch.num_members)))


def member_specs(arch: Architecture) -> Any:
  """Logical PartitionSpecs of the stacked parameters: 'member' first."""
  one = nnx.to_pure_dict(nnx.get_partition_spec(
      nnx.state(_abstract_model(arch), nnx.Param)))
  return jax.tree.map(lambda s: P(sharding.MEMBER_AXIS, *s), one,
                      is_leaf=lambda x: isinstance(x, P))


@functools.lru_cache(maxsize=16)
def state_shardings(arch: Architecture, tx: optax.GradientTransformation,
                    mesh: Mesh) -> TrainState:
  """NamedShardings for every leaf of the train state on `mesh`.

  Parameters follow their logical names; optimizer moments that mirror a
  parameter get the parameter's sharding, the rest of each member's values
  its member's devices; the step and statistics are replicated.
  """
  abstract = _state_shapes(arch, tx)
  param_shardings = sharding.param_sharding(member_specs(arch), mesh,
                                            abstract.params)
  replicated = sharding.replicated(mesh)
  per_member = sharding.member_sharding(mesh)
  opt_shardings = optax.tree_map_params(
      tx, lambda _, s: s, abstract.opt_state, param_shardings,
      transform_non_params=lambda _: per_member)
  return TrainState(
      step=replicated,
      params=param_shardings,
      opt_state=opt_shardings,
      rng_Mx2=per_member,
      hparams=jax.tree.map(lambda _: per_member, abstract.hparams),
      weights_M=per_member,
      stats=jax.tree.map(lambda _: replicated, abstract.stats),
      train_metrics=jax.tree.map(lambda _: replicated,
                                 abstract.train_metrics))


def abstract_state(arch: Architecture, tx: optax.GradientTransformation,
                   mesh: Mesh) -> TrainState:
  """ShapeDtypeStructs carrying the current mesh's shardings (restore target)."""
  return jax.tree.map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
      _state_shapes(arch, tx), state_shardings(arch, tx, mesh))


@programs.memoize
def _jit_init(arch: Architecture, tx: optax.GradientTransformation,
              mesh: Mesh) -> Callable[..., TrainState]:
  """`_init` jitted once per architecture, optimizer and mesh. The seed is
  an argument, not a constant of the program, so that runs with other seeds
  share it."""
  return jax.jit(functools.partial(_init, arch, tx),
                 out_shardings=state_shardings(arch, tx, mesh))


def create_train_state(arch: Architecture, tx: optax.GradientTransformation,
                       mesh: Mesh, seed: int, stats: FeatureStats,
                       hparams: Hyperparameters) -> TrainState:
  """A fresh train state, each leaf created directly in its sharding.

  Args:
    arch: the model.
    tx: the optimizer (its state's structure; members' values may differ).
    mesh: where the state lives.
    seed: member m is initialised from (seed, m).
    stats: the training split's statistics.
    hparams: each member's hyperparameters (`Hyperparameters.of(config)`).
  """
  init = _jit_init(arch, tx, mesh)
  # JAX's default, sharding-friendly threefry took 4x longer to compile on
  # CPU (seconds of a small table's first run); an init runs once and its
  # draws are small, so the classic form, whose values are the same on
  # every mesh too, is the better trade here.
  with jax.threefry_partitionable(False):
    return init(np.int32(seed), jax.tree.map(jnp.asarray, stats), hparams)
