"""The training loop: `train_and_evaluate`.

Data travels one way: config -> mesh -> data -> state -> step ->
metrics/checkpoints. The loop runs calls of many steps (`call_plan`), reads
each call's losses one call behind (`loss_watch`), and at the end of a call
logs, evaluates (`evaluations`, which validates: `validation`), checkpoints
(`checkpoint_policy`), profiles or stops for a preemption.
"""

import functools
from collections.abc import Callable

import jax
import ml_collections
import numpy as np
from absl import logging

import storage
from input_pipeline.column_plan import ColumnPlan
from input_pipeline.order import block_rows
from input_pipeline.tables import Table
from meshfit import config as config_lib
from meshfit.checkpoints import checkpointer, reading, workdir_lock
from meshfit.config import json_files, sizing
from meshfit.config import Config
from meshfit.data import feeding, splits as splits_lib
from meshfit.data.features import FeatureStats, InputLayout
from meshfit.errors import UsageError
from meshfit.model import (optim, ridge_fit, state as state_lib, steps,
                           vocabulary_fit)
from meshfit.model.setup import Setup, make_setup
from meshfit.parallel import compilation_cache, sharding
from meshfit.report import plots, progress, writers
from meshfit.train import (call_plan, checkpoint_policy,
                           evaluations as evaluations_lib, train_log)
from meshfit.train.loss_watch import LossWatch, NonFiniteLossError
from meshfit.train.preemption import Preempted, PreemptionWatch
from meshfit.train.profiling import ProfileWindow
from meshfit.train.validation import BestTracker
from models import mlp

# Called after each train call is dispatched, with the step it reaches and
# its losses, K steps x M members (a benchmark's or a test's view into the
# loop).
CallObserver = Callable[[int, jax.Array], None]


def train_and_evaluate(config: ml_collections.ConfigDict | Config,
                       workdir: str, *, splits: splits_lib.Splits | None = None,
                       on_call: CallObserver | None = None,
                       console: progress.Console | None = None) -> dict:
  """Trains `config` in `workdir` (resuming if it holds a run), then evaluates.

  Args:
    config: the run config (checked here).
    workdir: where config.json, checkpoints and metrics go.
    splits: train on these tables instead of reading config.dataset.
    on_call: called after each train call is dispatched (see CallObserver).
    console: what the console shows of the scalars (default: every write
      as an INFO line; train.py shows progress.Progress).

  Returns:
    The evaluation of the model eval and predict use (the best step's with
    validation, else the last): mse, rmse, mae, r2, num_examples, per-target
    values, and its step.

  Raises:
    UsageError: bad config, an incompatible checkpoint, or a workdir that
      another trainer holds; nothing in the workdir has changed.
    DataError: bad data files.
    Preempted: SIGTERM; the step reached is saved.
    NonFiniteLossError: the loss diverged; earlier checkpoints are intact.
  """
  config = config_lib.parse(config)
  workdir_lock.check_workdir(workdir)
  config_lib.check_devices(config, jax.device_count(),
                           jax.local_device_count())
  compilation_cache.configure(config.compilation_cache_dir)
  if splits is None:
    splits = splits_lib.load_splits(config.dataset, config.seed)
  config = splits_lib.with_validation(config, splits)  # before it is saved
  config = _size_to_table(config, splits)
  train = splits.train
  layout = InputLayout.of(train.plan.input_categories, train.missing_I,
                          config.dataset.numeric_scaling
                          if config.dataset.standardize else 'none',
                          config.model.raw_numbers)
  setup = make_setup(config, layout, train.num_targets)
  preemption = PreemptionWatch()
  try:
    with workdir_lock.WorkdirLock(workdir):
      ckpt = checkpointer.Checkpointer(
          workdir, max_to_keep=config.max_checkpoints_to_keep)
      try:
        state, position, tracker = _restore_or_init(config, setup, ckpt,
                                                    splits)
        final = _train(config, workdir, setup, splits, ckpt, preemption,
                       state, position, tracker, on_call, console)
      except storage.StorageError:
        # Storage out of reach: waiting on the saves in flight would only
        # wait out their retries; the committed checkpoints are intact.
        raise
      except BaseException:
        ckpt.wait()
        ckpt.close()
        raise
      ckpt.wait()
      ckpt.close()
  finally:
    preemption.close()
  _close_run(config, workdir, final, splits)
  return final


def _size_to_table(config: Config, splits: splits_lib.Splits) -> Config:
  """`config` with the keys it leaves at 0 sized to the training rows."""
  data_devices, _ = sharding.mesh_shape(config.mesh.data, config.mesh.model,
                                        jax.device_count(),
                                        config.mesh.members)
  # Validation rows only: scoring the eval split too (monitoring) must not
  # make the best step coarser.
  config, line = sizing.resolve(
      config, splits.member_rows, data_devices,
      splits.validation.num_examples if splits.validation else 0)
  if line:
    logging.info('%s', line)
  return config


def _restore_or_init(config: Config, setup: Setup,
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
      _check_resumable(meta, config, splits, ckpt, step)
      target = state_lib.abstract_state(setup.arch, setup.tx, setup.mesh)
      state = ckpt.restore_state(step, target)
    except checkpointer.DamagedCheckpointError as e:
      logging.warning('Checkpoint of step %d is damaged and is skipped: %s',
                      step, str(e).splitlines()[0][:300])
      damaged.append(step)
      continue
    ckpt.set_aside(damaged)
    logging.info('Resuming from the checkpoint of step %d.', step)
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


def _check_resumable(meta: dict, config: Config, splits: splits_lib.Splits,
                     ckpt: checkpointer.Checkpointer, step: int) -> None:
  """Refuses a checkpoint of other data, another meshfit or config."""
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


def _train(config: Config, workdir: str, setup: Setup,
           splits: splits_lib.Splits, ckpt: checkpointer.Checkpointer,
           preemption: PreemptionWatch, state: state_lib.TrainState,
           position: int, tracker: BestTracker,
           on_call: CallObserver | None,
           console: progress.Console | None) -> dict:
  """The loop: calls of several steps, then whatever their last step asks."""
  initial_step = int(jax.device_get(state.step))
  last_step = initial_step if tracker.stopped else config.num_train_steps
  is_main = jax.process_index() == 0
  if is_main:
    json_files.save_json(config, storage.join(workdir, 'config.json'))
    writers.truncate_jsonl(storage.join(workdir, 'metrics.jsonl'),
                           initial_step)
    if config.plots:
      plots.preload()
  shown = (console or progress.Console()).writer(is_main, progress.Plan.of(
      initial_step, last_step, -(-splits.member_rows // config.batch_size),
      tracker))
  writer = writers.AsyncWriter(writers.create_writer(workdir, is_main, shown))
  train_call = steps.jit_train_call(setup.graphdef, setup.arch.layout,
                                    setup.member_tx, setup.shardings,
                                    setup.mesh, config.log_every_steps,
                                    setup.dropout)
  evaluations = evaluations_lib.Evaluations(config, setup, splits, writer,
                                             tracker)
  # Jitted: op by op, the schedule cost the writer thread (and so the loop)
  # more than the rest of a log. Not logged when members have their own.
  schedule = (None if len(config.sweep.learning_rates) > 1 else
              optim.jit_learning_rate_schedule(
                  config.optimizer, config.num_train_steps,
                  (config.sweep.learning_rates or
                   (config.optimizer.learning_rate,))[0]))
  profile = ProfileWindow(config.profile_start_step,
                          config.profile_num_steps, workdir)
  hparams = optim.Hyperparameters.of(config)
  watch = LossWatch(lambda member, step, value: logging.warning(
      'Member %d (%s) diverged: its loss is %s at step %d. It is left out of '
      "the ensemble's predictions; the other members train on.", member,
      ', '.join(f'{k}={v:g}' for k, v in hparams.member(member).items()),
      value, step))
  checkpoints = checkpoint_policy.LoopCheckpoints(
      ckpt, watch, writer, setup.shardings, lambda: {
          'data_position': feed.position, 'config': config.to_dict(),
          'train_key': splits.train_key, 'validation': tracker.to_json(),
          **({'fold_rows': splits_lib.FOLD_ROWS} if splits.folds else {}),
          **evaluations.meta(),
          **reading.model_meta(splits.train.plan, setup.arch.layout)},
      config.checkpoint_every_steps, config.checkpoint_every_seconds)
  try:
    feed, calls = _plan(config, setup, splits, profile, initial_step,
                        last_step, position)
  except BaseException:
    checkpoints.close()
    writer.close()
    raise
  table_z = ({} if not feed.resident else steps.jit_encode(
      setup.mesh, setup.arch.layout)(state.stats, feed.device_table()))
  evaluations.use_encoded_table(table_z)
  speed = train_log.StepsPerSecond(initial_step)
  reachable = True
  try:
    if preemption.received:
      raise Preempted(initial_step)
    step = initial_step
    for call_index, (n, chunk) in enumerate(feed.chunks(calls)):
      done, step = step, step + n
      profile.before(done)
      with jax.profiler.StepTraceAnnotation('train', step_num=step):
        state, losses_KxM, train_metrics = train_call(state, table_z, chunk,
                                                    np.int32(n))
      watch.add(done + 1, n, losses_KxM)
      if on_call is not None:
        on_call(step, losses_KxM)
      last = step == last_step
      if step % config.log_every_steps == 0 or last:
        watch.once_checked(functools.partial(
            train_log.log_train, writer, speed, train_metrics, schedule,
            step))
      if step % config.eval_every_steps == 0 or last:
        watch.drain()  # train and eval steps share the in-flight bound
        choice, val_loss = evaluations.at(step, state)
        if choice is not None:  # the weights the checkpoints record
          state = evaluations_lib.with_choice(state, choice, setup)
        if val_loss is not None:
          evaluations.best_state = checkpoints.note_best(step, state,
                                                         val_loss)
        speed.pause()
        last = last or tracker.stopped
      if last:
        checkpoints.save_now(step, state)
      elif checkpoints.due(step):
        checkpoints.save_periodic(step, state)
      watch.settle()
      profile.after(step, watch)
      # Every host asks after the same calls, numbered alike.
      if preemption.should_stop(call_index):
        checkpoints.save_now(step, state)
        checkpoints.wait()
        writer.flush()
        raise Preempted(step)
      if last:
        break
    watch.drain()
    return evaluations.final(state, ckpt, trained=step > initial_step)
  except NonFiniteLossError as e:
    # The state of step e.step - 1 produced the bad loss: a checkpoint of it
    # is not good either. Set it aside (kept, not deleted) so that a rerun
    # resumes from a state that produced a finite loss.
    checkpoints.wait()
    newest = max(ckpt.all_steps(), default=None)
    if newest is not None and newest >= e.step - 1:
      ckpt.set_aside([newest])
    e.last_good = max((s for s in ckpt.all_steps() if s < e.step - 1),
                      default=None)
    raise
  except storage.StorageError:
    reachable = False  # what is in flight cannot be written: not waited on
    raise
  finally:
    checkpoints.close(wait=reachable)
    profile.close()
    feed.close()
    writer.close()


def _plan(config: Config, setup: Setup, splits: splits_lib.Splits,
          profile: ProfileWindow, initial_step: int, last_step: int,
          position: int):
  """The feed of training chunks, and the lengths of the calls to come.

  Log, eval and checkpoint steps end a call (a checkpoint by the clock is
  taken at whichever call's end it falls due).
  """
  periods = (config.log_every_steps, config.eval_every_steps,
             config.checkpoint_every_steps)
  arch = setup.arch
  flops_per_step = 6.0 * mlp.num_params(
      (arch.layout.shape.width(arch.mlp), *arch.mlp.hidden_sizes,
       arch.num_targets)) * config.batch_size * arch.num_members
  max_steps_per_call = call_plan.choose_steps_per_call(
      config.steps_per_call, flops_per_step, jax.devices()[0].platform,
      periods)
  calls = call_plan.plan_calls(initial_step, last_step, max_steps_per_call,
                               periods, profile.stops)
  # A CPU's devices hold their copies in the one host memory.
  copies = (jax.local_device_count() if jax.devices()[0].platform == 'cpu'
            else 1)
  resident = (isinstance(splits.train, Table) and feeding.fits_on_device(
      splits.train, config.dataset.resident_table_mb, copies))
  feed = feeding.TrainFeed(
      splits.train, blocks=splits.blocks, batch_size=config.batch_size,
      seed=config.seed, mesh=setup.mesh, steps_per_call=max_steps_per_call,
      resident=resident, position=position,
      prefetch=config.dataset.prefetch_batches,
      members=config.model.ensemble_size,
      member_blocks=[splits.member_blocks(m)
                     for m in range(config.model.ensemble_size)])
  logging.info('Training steps %d..%d on a %s mesh, up to %d per call, '
               'batches %s.', initial_step + 1, last_step,
               dict(setup.mesh.shape), max_steps_per_call,
               'gathered on device' if resident else 'streamed from the host')
  return feed, calls


def _close_run(config: Config, workdir: str, final: dict,
               splits: splits_lib.Splits) -> None:
  """Draws the loss curve and logs the run's closing line."""
  target_names = splits.train.target_names
  curve = None
  if config.plots and jax.process_index() == 0:
    train_mean_T = splits_lib.training_sample(splits).y_NxT.astype(
        np.float64).mean(axis=0)
    scored = splits.eval if splits.eval is not None else splits.validation
    mean_rmse = float(np.mean(np.sqrt(np.mean(
        (scored.y_NxT - train_mean_T)**2, axis=0))))
    curve = plots.write_loss_curve(
        workdir, config.dataset.name, target_names, mean_rmse,
        final['step'] if 'val_loss' in final else None)
  per_target = ''
  if len(target_names) > 1:
    per_target = '; ' + ', '.join(
        f'{t} rmse={final["targets"][t]["rmse"]:.6g}' for t in target_names)
  chosen = (f'best step {final["step"]} by validation loss '
            f'{final["val_loss"]:.6g}' if 'val_loss' in final else
            f'step {final["step"]}')
  if 'members' in final:
    chosen += (f', members {", ".join(final["members"])} of '
               f'{config.model.ensemble_size} ({config.sweep.select})')
  if 'ridge_weight' in final:
    chosen += ', ridge part ' + '/'.join(
        f'{w:.0%}' for w in final['ridge_weight'].values()) + ' of it'
  distribution = (f' nll={final["nll"]:.6g} coverage_90='
                  f'{final["coverage_90"]:.4f}' if 'nll' in final else '')
  logging.info('Done: %s; %s rmse=%.6g mae=%.6g r2=%.4f%s on %d rows%s%s',
               chosen, evaluations_lib.scored_on(final), final['rmse'],
               final['mae'], final['r2'],
               distribution, final['num_examples'], per_target,
               f'; loss curve: {curve}' if curve else '')
