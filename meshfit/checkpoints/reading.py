"""A saved model opened: what a checkpoint's model reads (its column plan
and input layout), the estimate of its error it recorded, and its state
restored onto a set-up, for eval, predict and export (`SavedModel`)."""

import dataclasses

import ml_collections
from absl import logging
from jax.sharding import Mesh

from meshfit.input_pipeline.column_plan import ColumnPlan
from meshfit.input_pipeline.errors import DataError
from meshfit import config as config_lib
from meshfit.checkpoints import checkpointer
from meshfit.checkpoints.held import HeldCheckpoints
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
    UsageError: the checkpoint was written by another meshfit (an older
      format, fields this one does not know or lacks), or with a config key
      this one does not have.
  """
  version = meta.get('format', 1)
  if version != META_FORMAT:
    age = ('a newer' if isinstance(version, int) and version > META_FORMAT
           else 'an older')
    raise UsageError(
        f'the checkpoint of step {step} in {directory} was written by {age} '
        f'meshfit (checkpoint format {version}, this meshfit reads '
        f'{META_FORMAT}); use that version of meshfit for it, or train into '
        'a new workdir')
  trained = meta.get('config')
  if trained is None or json_files.shape_error(trained) is not None:
    raise _other_meshfit(step, directory, 'it records no config of the '
                         'form this meshfit reads')
  json_files.check_known_keys(trained, step, directory)
  layout = meta.get('layout')
  fields = {f.name for f in dataclasses.fields(InputLayout)}
  if not isinstance(layout, dict):
    raise _other_meshfit(step, directory, 'it records no input layout')
  if layout.keys() != fields:
    unknown = ', '.join(sorted(layout.keys() - fields)) or 'none'
    missing = ', '.join(sorted(fields - layout.keys())) or 'none'
    raise _other_meshfit(step, directory, 'its input layout has fields this '
                         f'meshfit does not know ({unknown}) or lacks '
                         f'fields it needs ({missing})')
  try:
    plan = ColumnPlan.from_json(meta['column_plan'])
  except DataError as e:
    raise UsageError(f'the checkpoint of step {step} in {directory}: {e}'
                     ) from None
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    raise _other_meshfit(step, directory, 'its column plan is not of the '
                         f'form this meshfit reads ({type(e).__name__}: '
                         f'{str(e)[:200]})') from None
  return plan, InputLayout(**{k: tuple(v) if isinstance(v, list) else v
                              for k, v in layout.items()})


def _other_meshfit(step: int, directory: str, what: str) -> UsageError:
  """A checkpoint of the same format that another meshfit wrote otherwise:
  not damage, nothing to set aside."""
  return UsageError(
      f'the checkpoint of step {step} in {directory} was written by another '
      f'meshfit: {what}; use the meshfit that trained it, or train into a '
      'new --workdir')


def _model_keys(trained: dict) -> dict:
  """The keys of a recorded config that say what its model is (all but
  those a run may change after training), dotted."""
  return {k: v for k, v in json_files.flatten(
      json_files.with_defaults(trained)).items()
          if k not in json_files.RESUME_SAFE_KEYS}


def model_config(trained: dict, given: Config, step: int) -> Config:
  """The config to use checkpoint `step` with: the checkpoint's own record
  of what it was trained as, with the keys a run may change after training
  (json_files.RESUME_SAFE_KEYS: how it is evaluated, where its files are)
  from `given`.

  The checkpoint's arrays are the model, so its record decides: a key of
  the model that `given` sets otherwise (config.json edited, or saved by
  a meshfit that reads it otherwise) would build another network around
  them. Such keys are named in a warning.

  Args:
    trained: the config the checkpoint recorded (its meta's 'config').
    given: the run's config as eval, predict or export was given it
      (config.json and the command line's evaluation keys).
    step: the checkpoint's step, for the warning.
  """
  record = json_files.with_defaults(trained).to_dict()
  now = json_files.flatten(given.to_dict())
  before = _model_keys(trained)
  differing = sorted(k for k in before.keys() & now.keys()
                     if before[k] != now[k])
  if differing:
    logging.warning(
        'The run\'s config (config.json) differs from what the checkpoint '
        'of step %d was trained with: %s. The checkpoint\'s values are '
        'used: they are what its arrays were trained as (train a new run '
        'for another model).', step, ', '.join(
            f'{k} ({now[k]!r} in config.json, {before[k]!r} in the '
            'checkpoint)' for k in differing))
  for key in json_files.RESUME_SAFE_KEYS:
    if key in now:
      *parents, leaf = key.split('.')
      node = record
      for p in parents:
        node = node[p]
      node[leaf] = now[key]
  return config_lib.parse(ml_collections.ConfigDict(record))


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


# How many times a reader takes the next checkpoint when a trainer's
# rotation deleted the one it chose before it was read.
ROTATION_RETRIES = 5


class SavedModel:
  """A workdir's checkpoint opened for use (eval, predict, export, the model
  card): its step, column plan and input layout at once, its state when
  `restore` is called, so that a caller can check its input before the
  slower restore. Use it as a context manager: it holds the checkpointer.

  A run may be training while it is read: when the trainer's rotation
  deletes the chosen checkpoint before it is read, the best or newest one
  is chosen again (a step named by the caller is not replaced: that is an
  error saying why).

  Attributes:
    step: the checkpoint's step.
    plan: the column plan its model was trained with.
    layout: its model's inputs.
    estimate: the estimate of its error on validation rows it recorded
      (`estimate`), or None.
  """

  def __init__(self, workdir: str, step: int | None = None,
               held: HeldCheckpoints | None = None):
    """Opens `step` of `workdir` (None: the best by validation, else the
    newest intact one).

    Args:
      workdir: the run's directory.
      step: the checkpoint.
      held: the run's checkpoints, when they are held in memory (a `fit`
        without a workdir) rather than written there.

    Raises:
      UsageError: no such checkpoint, or one that cannot be read.
    """
    self._ckpt = held or checkpointer.Checkpointer(workdir, read_only=True)
    self._named = step is not None
    self._retries = ROTATION_RETRIES
    try:
      self._open(step)
    except BaseException:
      self._ckpt.close()
      raise

  def _open(self, step: int | None) -> None:
    """Chooses a step and reads its meta, choosing again while rotation
    deletes the chosen one first."""
    while True:
      self.step = self._ckpt.step_to_restore(step)
      committed = self._ckpt.is_committed(self.step)
      try:
        meta = restore_meta(self._ckpt, self.step)
        break
      except UsageError as e:
        self._choose_again_if_rotated(e, committed)
    self._trained = meta.get('config')
    self.plan, self.layout = read_model(meta, self.step,
                                        self._ckpt.directory)
    self.estimate = recorded_estimate(meta, self.step)

  def _choose_again_if_rotated(self, error: UsageError,
                               committed: bool) -> None:
    """Returns when the checkpoint that `error` could not read was committed
    and is gone now (a trainer's rotation deleted it) and another may be
    chosen; raises `error` where it is damage, not rotation."""
    if not committed or self._ckpt.is_committed(self.step):
      raise error
    if self._named:
      raise UsageError(
          f'the checkpoint of step {self.step} in {self._ckpt.directory} was '
          'deleted while it was read: a trainer is rotating this run\'s '
          'checkpoints (max_checkpoints_to_keep); leave out --step to read '
          'the best or newest, or read it once training has ended') from None
    if self._retries == 0:
      raise UsageError(
          f'the checkpoints in {self._ckpt.directory} were deleted while '
          f'they were read, {ROTATION_RETRIES + 1} times: a trainer is '
          'rotating them faster than they can be read; read the run once '
          'it has ended, or train with a larger '
          'max_checkpoints_to_keep') from None
    self._retries -= 1
    logging.info('The checkpoint of step %d was deleted by a trainer\'s '
                 'rotation before it was read; choosing again.', self.step)
    self._ckpt.reload()

  def model_config(self, given: Config) -> Config:
    """The config to use this checkpoint with (`model_config`): its own
    record of the model, the evaluation keys from `given`."""
    return model_config(self._trained, config_lib.parse(given), self.step)

  def restore(self, config: Config, mesh: Mesh | None = None
              ) -> tuple[Setup, state_lib.TrainState]:
    """(set-up, state) of the checkpoint under `config`, on `mesh`
    (default: the config's mesh over every device).

    When a trainer's rotation deletes the checkpoint before its arrays are
    read, the next one is read instead, and `step` and `estimate` change
    to it; its model is the same run's (the same plan, layout and config,
    or an error).
    """
    setup = make_setup(config, self.layout, len(self.plan.targets), mesh)
    while True:
      try:
        return setup, restore(self._ckpt, setup, self.step)
      except UsageError as e:
        self._choose_again_if_rotated(e, committed=True)
      plan, layout, trained = self.plan, self.layout, self._trained
      self._open(None)
      if ((self.plan, self.layout) != (plan, layout)
          or _model_keys(self._trained) != _model_keys(trained)):
        raise UsageError(
            f'the run in {self._ckpt.directory} changed while it was read '
            f'(a trainer replaced its checkpoints with those of step '
            f'{self.step}, of another model); read it again')

  def close(self) -> None:
    self._ckpt.close()

  def __enter__(self) -> 'SavedModel':
    return self

  def __exit__(self, *exc) -> None:
    self.close()
