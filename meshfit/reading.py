"""What a checkpoint's model reads (its column plan and input layout) and
its state restored onto a set-up, for eval, predict and export."""

import dataclasses

from input_pipeline.column_plan import ColumnPlan
from input_pipeline.errors import DataError
from meshfit import checkpointing, config_files, state as state_lib
from meshfit.errors import UsageError
from meshfit.features import InputLayout
from meshfit.setup import Setup


# The version of what a checkpoint holds: 2 has the column plan and the
# input layout in its meta (meshfit before it stored feature names only), 3
# a member axis in its state.
META_FORMAT = 3


def model_meta(plan: ColumnPlan, layout: InputLayout) -> dict:
  """What a checkpoint's meta records of its model's inputs."""
  return {'format': META_FORMAT, 'column_plan': plan.to_json(),
          'layout': dataclasses.asdict(layout)}


def read_model(meta: dict, step: int, directory: str
               ) -> tuple[ColumnPlan, InputLayout]:
  """The column plan and input layout a checkpoint's model was trained on.

  Raises:
    UsageError: the checkpoint was written by an older meshfit, or with a
      config key this one does not have.
  """
  if meta.get('format') != META_FORMAT:
    raise UsageError(
        f'the checkpoint of step {step} in {directory} was written by an '
        f'older meshfit (checkpoint format {meta.get("format", 1)}, this '
        f'meshfit reads {META_FORMAT}); use that version of meshfit for it, '
        'or train into a new workdir')
  config_files.check_known_keys(meta.get('config', {}), step, directory)
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
