"""Where a run starts: the newest intact checkpoint in its workdir that
this run may resume, or a fresh state.

A checkpoint of other data, of a config a resumed run may not change, or
of columns this meshfit reads otherwise is refused (`check_resumable`);
a damaged one is skipped and set aside once an older one restored.
"""

from absl import logging

from meshfit.input_pipeline.column_plan import ColumnPlan
from meshfit.input_pipeline.order import block_rows
from meshfit.checkpoints import checkpointer, reading
from meshfit.config import Config, json_files
from meshfit.data import feeding, splits as splits_lib
from meshfit.data.features import FeatureStats
from meshfit.errors import UsageError
from meshfit.model import (optim, ridge_fit, state as state_lib,
                           vocabulary_fit)
from meshfit.model.setup import Setup
from meshfit.train.validation import BestTracker
from meshfit.models import mlp


def restore_or_init(config: Config, setup: Setup,
                    ckpt: checkpointer.Checkpointer, splits: splits_lib.Splits
                    ) -> tuple[state_lib.TrainState, int, BestTracker]:
  """The newest intact checkpoint's state, input position and best-step
  tracker, or a fresh start.

  Damaged checkpoints are skipped with a warning naming their step and, once
  a restore succeeded, moved aside (never deleted).

  Raises:
    UsageError: the newest checkpoint was trained on other data or by an
      older meshfit, or with an incompatible config (nothing is set aside).
  """
  damaged = []
  for step in reversed(ckpt.all_steps()):
    try:
      meta = ckpt.restore_meta(step)
      check_resumable(meta, config, splits, ckpt, step)
      target = state_lib.abstract_state(setup.arch, setup.tx, setup.mesh)
      state = ckpt.restore_state(step, target)
    except checkpointer.DamagedCheckpointError as e:
      logging.warning('Checkpoint of step %d is damaged and is skipped: %s',
                      step, str(e).splitlines()[0][:300])
      damaged.append(step)
      continue
    ckpt.set_aside(damaged)
    logging.info('Resuming from the checkpoint of step %d.', step)
    # A checkpoint without 'order' was written by a meshfit that read every
    # table in the block order.
    order, now = meta.get('order', 'blocks'), feeding.order_of(splits.train)
    if order != now:
      logging.warning(
          'The checkpoint of step %d was trained reading its table in the '
          '%s order and this run goes on in the %s order (%s): it trains '
          'as well, but not on the batches the run would have read without '
          'the interruption.', step, order, now,
          'an older meshfit wrote it' if 'order' not in meta else
          'dataset.resident_table_mb moved the table between memory and '
          'disk')
    return (state, int(meta['data_position']),
            BestTracker.from_json(meta.get('validation'),
                                  config.early_stopping_evals))
  ckpt.set_aside(damaged)
  sample = splits_lib.training_sample(splits)
  stats = FeatureStats.fit(setup.arch.layout, sample.x_NxF, sample.y_NxT)
  state = state_lib.create_train_state(setup.arch, setup.tx, setup.mesh,
                                       config.seed, stats,
                                       optim.Hyperparameters.of(config))
  if config.model.ridge_blend:
    state = ridge_fit.fit_into(state, setup, splits)
  if mlp.VOCABULARY in state.params:
    state = vocabulary_fit.fit_into(state, setup, splits,
                                    config.model.category_member_min_count)
  return state, 0, BestTracker(config.early_stopping_evals)


def _plan_change(before: ColumnPlan, now: ColumnPlan) -> str:
  """The columns whose kind differs between two column plans, or what
  else does."""
  kinds = [{c.name: c.kind for c in p.features} for p in (before, now)]
  changed = [f'{n!r}: {kinds[0].get(n, "absent")} in the checkpoint, '
             f'{kinds[1].get(n, "absent")} now'
             for n in sorted(kinds[0].keys() | kinds[1].keys())
             if kinds[0].get(n) != kinds[1].get(n)]
  return '; '.join(changed) or 'the same kinds, other values or vocabularies'


def check_resumable(meta: dict, config: Config, splits: splits_lib.Splits,
                    ckpt: checkpointer.Checkpointer, step: int) -> None:
  """Refuses a checkpoint of other data, another meshfit or config.

  Args:
    meta: the checkpoint's JSON side.
    config: the config of the run that would resume it.
    splits: the tables that run reads.
    ckpt: the workdir's checkpointer.
    step: the checkpoint's step.

  Raises:
    UsageError: saying what differs and how to go on.
  """
  plan, _ = reading.read_model(meta, step, ckpt.directory)
  json_files.check_resume_compatible(meta['config'], config, step)
  if meta.get('train_key') != splits.train_key:
    path = config.dataset.train_path or config.dataset.name
    raise UsageError(
        f'the training data {path!r} is not what the checkpoint of step '
        f'{step} in {ckpt.directory} was trained on (its content changed); '
        'restore that file to resume, or train into a new --workdir')
  # A meshfit that reads a cell differently (a money column it left out is
  # a number now) plans other inputs: the state would not restore, and the
  # checkpoints would be set aside as damaged.
  if plan != splits.train.plan:
    raise UsageError(
        f'the checkpoint of step {step} in {ckpt.directory} reads the '
        'training table\'s columns differently from this meshfit ('
        f'{_plan_change(plan, splits.train.plan)}); finish that run with the '
        'meshfit that started it, or train into a new --workdir (eval and '
        'predict read its checkpoints as they are)')
  # A checkpoint without 'fold_rows' dealt the order's blocks into folds:
  # those of a table under 2,048 rows are single rows, the same folds.
  dealt = meta.get('fold_rows', block_rows(splits.train.num_examples))
  if splits.folds and dealt != splits_lib.FOLD_ROWS:
    raise UsageError(
        f'the checkpoint of step {step} in {ckpt.directory} was cross-fitted '
        'on folds of consecutive rows (an older meshfit); this meshfit deals '
        'single rows into folds, so its members would go on training on '
        'rows they are validated on. Finish that run with the meshfit that '
        'started it, or train into a new --workdir (eval and predict read '
        'its checkpoints as they are)')
