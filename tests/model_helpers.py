"""Building blocks the tests share: configs from configs/default.py's
defaults (the small config most tests train, `shrunk_config`), and a single
jitted train step as a reference for the loop's multi-step calls."""

from collections.abc import Callable

import jax
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from cli_helpers import override
from meshfit.configs import default
from meshfit.config import DatasetConfig
from meshfit.data.features import InputLayout
from meshfit.model.optim import Hyperparameters
from meshfit.model.state import TrainState
from meshfit.model.steps import Batch, encode, train_step
from meshfit.parallel import sharding
from meshfit.models.mlp import MlpConfig


# configs/default.py shrunk to train in seconds: the keys most tests share.
SMALL = {
    'model.hidden_sizes': (32, 32),
    'batch_size': 64,
    'eval_batch_size': 256,
    'num_train_steps': 60,
    'log_every_steps': 10,
    'eval_every_steps': 30,
    'checkpoint_every_steps': 20,
    'optimizer.warmup_steps': 10,
}


def shrunk_config(data_dir: str, overrides: dict | None = None
                  ) -> ml_collections.ConfigDict:
  """configs/default.py shrunk to train in seconds (SMALL), reading the
  tests' TFDS data in `data_dir`, with `overrides` on top (dotted keys:
  {'model.hidden_sizes': (64, 64), ...})."""
  config = default.get_config()
  override(config, {'dataset.data_dir': data_dir, **SMALL,
                    **(overrides or {})})
  return config


def mlp_config(**overrides) -> MlpConfig:
  """configs/default.py's model section with `overrides`: MlpConfig itself
  declares no defaults."""
  return MlpConfig(**{**default.get_config().model.to_dict(), **overrides})


def dataset_config(dataset) -> DatasetConfig:
  """A config.dataset ConfigDict, typed (unchecked)."""
  return DatasetConfig(**dataset.to_dict())


def uniform_hparams(members: int, learning_rate: float,
                    weight_decay: float = 0.0,
                    dropout_rate: float = 0.0) -> Hyperparameters:
  """The same hyperparameters for every member."""
  return Hyperparameters(*(np.full(members, v, np.float32)
                           for v in (learning_rate, weight_decay,
                                     dropout_rate)))


def jit_train_step(graphdef: nnx.GraphDef, layout: InputLayout,
                   member_tx: Callable[[Hyperparameters],
                                       optax.GradientTransformation],
                   state_shardings: TrainState, mesh: Mesh,
                   dropout: bool = False
                   ) -> Callable[[TrainState, Batch],
                                 tuple[TrainState, jax.Array]]:
  """One `train_step` on each member's batch of input columns and targets
  (M x B x ...), jitted: state donated, shardings pinned both ways (a
  reference for `train_call`'s losses; the train metrics are left as they
  are)."""
  batch = sharding.member_batch_sharding(mesh)

  def step(state, batch):
    x, y = batch['x'], batch['y']
    flat = encode(state.stats, layout, {'x': x.reshape(-1, x.shape[-1]),
                                        'y': y.reshape(-1, y.shape[-1])})
    batch_z = {name: a.reshape(x.shape[:2] + a.shape[1:])
               for name, a in flat.items()}
    return train_step(state, batch_z, graphdef=graphdef, member_tx=member_tx,
                      dropout=dropout)[:2]
  return jax.jit(
      step,
      in_shardings=(state_shardings, {'x': batch, 'y': batch}),
      out_shardings=(state_shardings, sharding.replicated(mesh)),
      donate_argnums=0)
