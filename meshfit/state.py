"""The train state, created directly in its shardings.

Shapes come from `jax.eval_shape`, partition specs from the parameters'
logical names (`meshfit/sharding.py`), and the state is materialised by a
`jit` whose out_shardings put every piece where it lives: nothing is built on
one device first.
"""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import Mesh

from meshfit import sharding
from meshfit.features import FeatureStats, InputLayout
from meshfit.metrics import TrainMetrics
from models.mlp import Mlp, MlpConfig


@struct.dataclass
class TrainState:
  """Everything that decides the future of a run; saved in every checkpoint.

  Attributes:
    step: optimizer steps taken (int32 scalar).
    params: the model's parameters as a nested dict.
    opt_state: optax state, including the schedule's step count.
    rng: raw uint32[2] key; step s uses `fold_in(rng, s)`.
    stats: the training split's statistics (meshfit/features.py).
    train_metrics: accumulators since the last train-metrics log.
  """
  step: jax.Array
  params: Any
  opt_state: optax.OptState
  rng: jax.Array
  stats: FeatureStats
  train_metrics: TrainMetrics


@dataclasses.dataclass(frozen=True)
class Architecture:
  """What it takes to build the model: static, hashable, not saved as arrays."""
  mlp: MlpConfig
  layout: InputLayout
  num_targets: int

  def build(self, seed: int) -> Mlp:
    # Logical names stay metadata; meshfit/sharding.py places the arrays.
    with nnx.use_eager_sharding(False):
      return Mlp(self.mlp, self.layout.shape, self.num_targets,
                 rngs=nnx.Rngs(seed))


@functools.lru_cache(maxsize=16)
def _abstract_model(arch: Architecture) -> Mlp:
  """The model's shapes and metadata, no arrays (built once per
  architecture: a start needs them several times, and each build traces
  the model)."""
  with nnx.use_eager_sharding(False):
    return nnx.eval_shape(lambda: arch.build(0))


def graphdef(arch: Architecture) -> nnx.GraphDef:
  """The model's static structure, for `nnx.merge(graphdef, params)`."""
  return nnx.split(_abstract_model(arch), nnx.Param)[0]


def _init(arch: Architecture, tx: optax.GradientTransformation, seed: int,
          stats: FeatureStats) -> TrainState:
  params = nnx.to_pure_dict(nnx.state(arch.build(seed), nnx.Param))
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=tx.init(params),
      rng=jax.random.key_data(
          jax.random.fold_in(jax.random.key(seed), 1)).astype(jnp.uint32),
      stats=stats,
      train_metrics=TrainMetrics.empty())


@functools.lru_cache(maxsize=16)
def _state_shapes(arch: Architecture,
                  tx: optax.GradientTransformation) -> TrainState:
  """ShapeDtypeStructs of every leaf (traced once per arch and optimizer)."""
  return jax.eval_shape(
      lambda: _init(arch, tx, 0, FeatureStats.identity(
          len(arch.layout.number_columns), arch.num_targets)))


@functools.lru_cache(maxsize=16)
def state_shardings(arch: Architecture, tx: optax.GradientTransformation,
                    mesh: Mesh) -> TrainState:
  """NamedShardings for every leaf of the train state on `mesh`.

  Parameters follow their logical names; optimizer moments that mirror a
  parameter get the parameter's sharding; everything else is replicated.
  """
  logical = nnx.to_pure_dict(nnx.get_partition_spec(
      nnx.state(_abstract_model(arch), nnx.Param)))
  abstract_state = _state_shapes(arch, tx)
  param_shardings = sharding.param_sharding(logical, mesh,
                                            abstract_state.params)
  replicated = sharding.replicated(mesh)
  opt_shardings = optax.tree_map_params(
      tx, lambda _, s: s, abstract_state.opt_state, param_shardings,
      transform_non_params=lambda _: replicated)
  return TrainState(
      step=replicated,
      params=param_shardings,
      opt_state=opt_shardings,
      rng=replicated,
      stats=jax.tree.map(lambda _: replicated, abstract_state.stats),
      train_metrics=jax.tree.map(lambda _: replicated,
                                 abstract_state.train_metrics))


def abstract_state(arch: Architecture, tx: optax.GradientTransformation,
                   mesh: Mesh) -> TrainState:
  """ShapeDtypeStructs carrying the current mesh's shardings (restore target)."""
  return jax.tree.map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
      _state_shapes(arch, tx), state_shardings(arch, tx, mesh))


def create_train_state(arch: Architecture, tx: optax.GradientTransformation,
                       mesh: Mesh, seed: int,
                       stats: FeatureStats) -> TrainState:
  """A fresh train state, each leaf created directly in its sharding."""
  init = jax.jit(lambda s: _init(arch, tx, seed, s),
                 out_shardings=state_shardings(arch, tx, mesh))
  return init(jax.tree.map(jnp.asarray, stats))
