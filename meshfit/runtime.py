"""What training, evaluation and prediction share: set-up, restore, and
predictions or metrics over a whole table."""

import dataclasses

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from input_pipeline.tables import Table
from meshfit import (checkpointing, feeding, in_flight, metrics, optim,
                     sharding, state as state_lib, steps)
from meshfit.config import Config
from meshfit.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Setup:
  """Mesh, model structure, optimizer and state shardings of a run."""
  mesh: Mesh
  arch: state_lib.Architecture
  graphdef: nnx.GraphDef
  tx: optax.GradientTransformation
  shardings: state_lib.TrainState


def make_setup(config: Config, num_features: int, num_targets: int,
               mesh: Mesh | None = None) -> Setup:
  """The set-up of `config` for a table of these widths.

  Args:
    config: the parsed run config (its mesh, model and optimizer).
    num_features: F, the model's inputs.
    num_targets: T, its outputs.
    mesh: the mesh to use; default: built from config.mesh over every device.
  """
  if mesh is None:
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.model)
  arch = state_lib.Architecture(config.model, num_features, num_targets)
  tx = optim.make_optimizer(config.optimizer, config.num_train_steps)
  return Setup(mesh, arch, state_lib.graphdef(arch), tx,
               state_lib.state_shardings(arch, tx, mesh))


def restore(ckpt: checkpointing.Checkpointer, setup: Setup,
            step: int) -> state_lib.TrainState:
  """The state of checkpoint `step` on `setup`'s mesh (eval, predict, export).

  Raises:
    UsageError: the checkpoint cannot be read.
  """
  try:
    return ckpt.restore_state(
        step, state_lib.abstract_state(setup.arch, setup.tx, setup.mesh))
  except checkpointing.DamagedCheckpointError as e:
    raise _unreadable(ckpt, step, e) from None


def restore_meta(ckpt: checkpointing.Checkpointer, step: int) -> dict:
  """The JSON side of checkpoint `step` (predict, export).

  Raises:
    UsageError: the checkpoint cannot be read.
  """
  try:
    return ckpt.restore_meta(step)
  except checkpointing.DamagedCheckpointError as e:
    raise _unreadable(ckpt, step, e) from None


def _unreadable(ckpt: checkpointing.Checkpointer, step: int,
                e: checkpointing.DamagedCheckpointError) -> UsageError:
  return UsageError(f'the checkpoint of step {step} in {ckpt.directory} '
                    f'cannot be read ({str(e).splitlines()[0][:200]}); '
                    'pick another with --step')


def predict_table(setup: Setup, state: state_lib.TrainState,
                  x_NxF: np.ndarray, batch_size: int) -> np.ndarray:
  """Predictions (original units) for every row of `x_NxF`, in order.

  Batches are sharded over the mesh; the last one is padded and the padding
  dropped. Every process returns all N rows.
  """
  predict_step = steps.jit_predict_step(setup.graphdef, setup.shardings,
                                        setup.mesh)
  batch_preds = (predict_step(state, batch['x']) for batch in
                 feeding.eval_batches(
                     x_NxF, None, batch_size=batch_size,
                     batch_sharding=sharding.batch_sharding(setup.mesh)))
  preds = list(in_flight.fetched(batch_preds))
  if not preds:
    return np.zeros((0, setup.arch.num_targets), np.float32)
  return np.concatenate(preds)[:x_NxF.shape[0]]


def evaluate_table(setup: Setup, state: state_lib.TrainState, table: Table,
                   batch_size: int, eval_step=None) -> dict[str, float]:
  """mse, rmse, mae, r2 (original units) over every example of `table`.

  Args:
    setup: the run's set-up.
    state: the train state.
    table: the examples, each counted once.
    batch_size: the global eval batch size.
    eval_step: `steps.jit_eval_step` of this set-up, when the caller has
      one already (default: made here).
  """
  if eval_step is None:
    eval_step = steps.jit_eval_step(setup.graphdef, setup.shardings,
                                    setup.mesh)
  batch_sums = (eval_step(state, batch) for batch in feeding.eval_batches(
      table.x_NxF, table.y_NxT, batch_size=batch_size,
      batch_sharding=sharding.batch_sharding(setup.mesh)))
  total = metrics.host_sum(batch_sums, table.y_NxT.shape[1])
  result = total.compute(np.asarray(jax.device_get(state.norm.y_std_T)))
  result['num_examples'] = int(total.count)
  return result
