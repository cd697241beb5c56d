"""What training, evaluation, prediction and export share: set-up, what a
checkpoint's model reads, restore, and predictions or metrics over a table."""

import dataclasses

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from input_pipeline.column_plan import ColumnPlan
from input_pipeline.errors import DataError
from input_pipeline.tables import Table
from meshfit import (checkpointing, feeding, in_flight, metrics, optim,
                     sharding, state as state_lib, steps)
from meshfit.config import Config
from meshfit.errors import UsageError
from meshfit.features import InputLayout

# The version of what a checkpoint's meta describes: 2 has the column plan
# and the input layout (meshfit before it stored feature names only).
META_FORMAT = 2


@dataclasses.dataclass(frozen=True)
class Setup:
  """Mesh, model structure, optimizer and state shardings of a run."""
  mesh: Mesh
  arch: state_lib.Architecture
  graphdef: nnx.GraphDef
  tx: optax.GradientTransformation
  shardings: state_lib.TrainState


def make_setup(config: Config, layout: InputLayout, num_targets: int,
               mesh: Mesh | None = None) -> Setup:
  """The set-up of `config` for a table of this layout.

  Args:
    config: the parsed run config (its mesh, model and optimizer).
    layout: the model's inputs (`InputLayout.of` a training table).
    num_targets: T, its outputs.
    mesh: the mesh to use; default: built from config.mesh over every device.
  """
  if mesh is None:
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.model)
  arch = state_lib.Architecture(config.model, layout, num_targets)
  tx = optim.make_optimizer(config.optimizer, config.num_train_steps)
  return Setup(mesh, arch, state_lib.graphdef(arch), tx,
               state_lib.state_shardings(arch, tx, mesh))


def model_meta(plan: ColumnPlan, layout: InputLayout) -> dict:
  """What a checkpoint's meta records of its model's inputs."""
  return {'format': META_FORMAT, 'column_plan': plan.to_json(),
          'layout': dataclasses.asdict(layout)}


def read_model(meta: dict, step: int, directory: str
               ) -> tuple[ColumnPlan, InputLayout]:
  """The column plan and input layout a checkpoint's model was trained on.

  Raises:
    UsageError: the checkpoint was written by an older meshfit.
  """
  if meta.get('format') != META_FORMAT:
    raise UsageError(
        f'the checkpoint of step {step} in {directory} was written by an '
        'older meshfit (before column plans: its inputs are not recorded); '
        'use that version of meshfit for it, or train into a new workdir')
  layout = meta['layout']
  try:
    plan = ColumnPlan.from_json(meta['column_plan'])
  except DataError as e:
    raise UsageError(f'the checkpoint of step {step} in {directory}: {e}'
                     ) from None
  return plan, InputLayout(**{k: tuple(v) if isinstance(v, list) else v
                              for k, v in layout.items()})


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
  predict_step = steps.jit_predict_step(setup.graphdef, setup.arch.layout,
                                        setup.shardings, setup.mesh)
  batch_preds = (predict_step(state, batch['x']) for batch in
                 feeding.eval_batches(
                     x_NxF, None, batch_size=batch_size,
                     batch_sharding=sharding.batch_sharding(setup.mesh)))
  preds = list(in_flight.fetched(batch_preds))
  if not preds:
    return np.zeros((0, setup.arch.num_targets), np.float32)
  return np.concatenate(preds)[:x_NxF.shape[0]]


def evaluate_table(setup: Setup, state: state_lib.TrainState, table: Table,
                   batch_size: int, eval_step=None) -> dict:
  """mse, rmse, mae, r2 (original units) over every example of `table`.

  The overall values average the targets'; `targets` holds each target's
  own, in its units.

  Args:
    setup: the run's set-up.
    state: the train state.
    table: the examples, each counted once.
    batch_size: the global eval batch size.
    eval_step: `steps.jit_eval_step` of this set-up, when the caller has
      one already (default: made here).
  """
  if eval_step is None:
    eval_step = steps.jit_eval_step(setup.graphdef, setup.arch.layout,
                                    setup.shardings, setup.mesh)
  batch_sums = (eval_step(state, batch) for batch in feeding.eval_batches(
      table.x_NxF, table.y_NxT, batch_size=batch_size,
      batch_sharding=sharding.batch_sharding(setup.mesh)))
  total = metrics.host_sum(batch_sums, table.y_NxT.shape[1])
  y_std_T = np.asarray(jax.device_get(state.stats.y_std_T))
  result = total.compute(y_std_T)
  result['num_examples'] = int(total.count)
  per_target = total.compute_per_target(y_std_T)
  result['targets'] = {name: {k: float(v[t]) for k, v in per_target.items()}
                       for t, name in enumerate(table.target_names)}
  return result
