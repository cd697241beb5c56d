"""A run's set-up: the mesh, the model's structure, the optimizer and the
train state's shardings, made once from the config and the table's layout."""

import dataclasses
import functools
from collections.abc import Callable

import optax
from flax import nnx
from jax.sharding import Mesh

from meshfit.config import Config, MeshConfig, OptimizerConfig
from meshfit.data.features import InputLayout
from meshfit.model import optim, state as state_lib
from meshfit.parallel import sharding
from meshfit.models.mlp import MlpConfig


@dataclasses.dataclass(frozen=True)
class Setup:
  """Mesh, model structure, optimizer and state shardings of a run.

  Attributes:
    mesh: the device mesh.
    arch: the model.
    graphdef: one member's structure.
    tx: the config's optimizer (its state's structure).
    member_tx: a member's optimizer from its own hyperparameters.
    dropout: some member trains with dropout.
    shardings: the train state's shardings.
  """
  mesh: Mesh
  arch: state_lib.Architecture
  graphdef: nnx.GraphDef
  tx: optax.GradientTransformation
  member_tx: Callable[[optim.Hyperparameters], optax.GradientTransformation]
  dropout: bool
  shardings: state_lib.TrainState

  @property
  def distribution(self) -> bool:
    """The model predicts a distribution (a mean and a variance)."""
    return self.arch.mlp.likelihood == 'gaussian'


def make_setup(config: Config, layout: InputLayout, num_targets: int,
               mesh: Mesh | None = None) -> Setup:
  """The set-up of `config` for a table of this layout.

  The same set-up object for the same keys: the jitted programs made from
  its optimizer and shardings (parallel/programs.py) are then shared by the
  runs of one process.

  Args:
    config: the parsed run config (its mesh, model and optimizer).
    layout: the model's inputs (`InputLayout.of` a training table).
    num_targets: T, its outputs.
    mesh: the mesh to use; default: built from config.mesh over every device.
  """
  return _make_setup(config.mesh, config.model, config.optimizer,
                     config.num_train_steps, config.sweep.dropout_rates,
                     layout, num_targets, mesh)


@functools.lru_cache(maxsize=16)
def _make_setup(mesh_config: MeshConfig, model: MlpConfig,
                optimizer: OptimizerConfig, num_train_steps: int,
                dropout_rates: tuple[float, ...], layout: InputLayout,
                num_targets: int, mesh: Mesh | None) -> Setup:
  """`make_setup` of the config keys it reads."""
  if mesh is None:
    mesh = sharding.make_mesh(mesh_config.data, mesh_config.model,
                              members=mesh_config.members)
  arch = state_lib.Architecture(model, layout, num_targets)
  fitted = model.ridge_blend or model.category_member_min_count > 0
  tx = optim.make_optimizer(optimizer, num_train_steps, fitted=fitted)
  member_tx = functools.partial(optim.member_optimizer, optimizer,
                                num_train_steps, fitted=fitted)
  dropout = model.dropout_rate > 0 or any(r > 0 for r in dropout_rates)
  return Setup(mesh, arch, state_lib.graphdef(arch), tx, member_tx, dropout,
               state_lib.state_shardings(arch, tx, mesh))
