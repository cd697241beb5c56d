"""A saved model opened: what a checkpoint's model reads (its column plan
and input layout), the estimate of its error it recorded, and its state
restored onto a set-up, for eval, predict and export (`SavedModel`)."""

import dataclasses

from jax.sharding import Mesh

from input_pipeline.column_plan import ColumnPlan
from input_pipeline.errors import DataError
from meshfit.checkpoints import checkpointer
from meshfit.config import Config, json_files
from meshfit.data.features import InputLayout
from meshfit.errors import UsageError
from meshfit.model import state as state_lib
from meshfit.model.setup import Setup, make_setup


# The version of what a checkpoint holds: 2 has the column plan and the
# input layout in its meta (meshfit before it stored feature names only), 3
# a member axis in its state.
META_FORMAT = 3
# `split` of a recorded estimate: every training row predicted out of fold
# (cross-fitting), or the held-out rows' (a validation fraction).
OUT_OF_FOLD, HELD_OUT = 'out_of_fold', 'held_out'


def model_meta(plan: ColumnPlan, layout: InputLayout) -> dict:
  """What a checkpoint's meta records of its model's inputs."""
  return {'format': META_FORMAT, 'column_plan': plan.to_json(),
          'layout': dataclasses.asdict(layout)}


def estimate(step: int, result: dict, folds: int) -> dict:
  """What a checkpoint records of the validation metrics `result` of its
  step: the estimate of its error where there is no eval file, marked as
  such (`split`, `note`) wherever it is shown."""
  n = result['num_examples']
  if folds > 1:
    split, note = OUT_OF_FOLD, (
        f'estimated out of fold, not on an eval file: each of the {n} '
        'training rows predicted by the members that did not train on it')
  else:
    split, note = HELD_OUT, (
        f'estimated on the {n} training rows held out of training '
        '(a fraction in dataset.validation), not on an eval file')
  return {'step': step, 'split': split, 'note': note, **result}


def recorded_estimate(meta: dict, step: int) -> dict | None:
  """The estimate checkpoint `step` recorded of its own state (`estimate`),
  or None: a checkpoint records the latest validation, which is of its own
  step only where that step was evaluated (the best, the last)."""
  recorded = meta.get('estimate')
  return recorded if recorded and recorded.get('step') == step else None


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
  json_files.check_known_keys(meta.get('config', {}), step, directory)
  layout = meta['layout']
  try:
    plan = ColumnPlan.from_json(meta['column_plan'])
  except DataError as e:
    raise UsageError(f'the checkpoint of step {step} in {directory}: {e}'
                     ) from None
  return plan, InputLayout(**{k: tuple(v) if isinstance(v, list) else v
                              for k, v in layout.items()})


def restore(ckpt: checkpointer.Checkpointer, setup: Setup,
            step: int) -> state_lib.TrainState:
  """The state of checkpoint `step` on `setup`'s mesh (eval, predict, export).

  Raises:
    UsageError: the checkpoint cannot be read.
  """
  try:
    return ckpt.restore_state(
        step, state_lib.abstract_state(setup.arch, setup.tx, setup.mesh))
  except checkpointer.DamagedCheckpointError as e:
    raise _unreadable(ckpt, step, e) from None


def restore_meta(ckpt: checkpointer.Checkpointer, step: int) -> dict:
  """The JSON side of checkpoint `step` (predict, export).

  Raises:
    UsageError: the checkpoint cannot be read.
  """
  try:
    return ckpt.restore_meta(step)
  except checkpointer.DamagedCheckpointError as e:
    raise _unreadable(ckpt, step, e) from None


def _unreadable(ckpt: checkpointer.Checkpointer, step: int,
                e: checkpointer.DamagedCheckpointError) -> UsageError:
  return UsageError(f'the checkpoint of step {step} in {ckpt.directory} '
                    f'cannot be read ({str(e).splitlines()[0][:200]}); '
                    'pick another with --step')


class SavedModel:
  """A workdir's checkpoint opened for use (eval, predict, export, the model
  card): its step, column plan and input layout at once, its state when
  `restore` is called, so that a caller can check its input before the
  slower restore. Use it as a context manager: it holds the checkpointer.

  Attributes:
    step: the checkpoint's step.
    plan: the column plan its model was trained with.
    layout: its model's inputs.
    estimate: the estimate of its error on validation rows it recorded
      (`estimate`), or None.
  """

  def __init__(self, workdir: str, step: int | None = None):
    """Opens `step` of `workdir` (None: the best by validation, else the
    newest intact one).

    Raises:
      UsageError: no such checkpoint, or one that cannot be read.
    """
    self._ckpt = checkpointer.Checkpointer(workdir, read_only=True)
    try:
      self.step = self._ckpt.step_to_restore(step)
      meta = restore_meta(self._ckpt, self.step)
      self.plan, self.layout = read_model(meta, self.step,
                                          self._ckpt.directory)
      self.estimate = recorded_estimate(meta, self.step)
    except BaseException:
      self._ckpt.close()
      raise

  def restore(self, config: Config, mesh: Mesh | None = None
              ) -> tuple[Setup, state_lib.TrainState]:
    """(set-up, state) of the checkpoint under `config`, on `mesh`
    (default: the config's mesh over every device)."""
    setup = make_setup(config, self.layout, len(self.plan.targets), mesh)
    return setup, restore(self._ckpt, setup, self.step)

  def close(self) -> None:
    self._ckpt.close()

  def __enter__(self) -> 'SavedModel':
    return self

  def __exit__(self, *exc) -> None:
    self.close()
