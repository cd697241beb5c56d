"""The training loop: `train_and_evaluate`.

Data travels one way: config -> mesh -> data -> state -> step ->
metrics/checkpoints. A run starts from its newest checkpoint or afresh
(`resume`). The loop runs calls of many steps (`call_plan`), reads
each call's losses one call behind (`loss_watch`), and at the end of a call
logs, evaluates (`evaluations`, which validates: `validation`), checkpoints
(`checkpoint_policy`), profiles or stops for a preemption.
"""

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator

import jax
import ml_collections
import numpy as np
from absl import logging

from meshfit import storage
from meshfit.input_pipeline.tables import Table
from meshfit import config as config_lib
from meshfit.checkpoints import checkpointer, reading, workdir_lock
from meshfit.checkpoints.held import HeldCheckpoints
from meshfit.config import json_files, sizing
from meshfit.config import Config
from meshfit.data import feeding, splits as splits_lib
from meshfit.data.features import InputLayout
from meshfit.model import optim, state as state_lib, steps
from meshfit.model.setup import Setup, make_setup
from meshfit.parallel import compilation_cache, sharding
from meshfit.report import plots, progress, writers
from meshfit.train import (call_plan, checkpoint_policy,
                           evaluations as evaluations_lib, resume, train_log)
from meshfit.train.loss_watch import LossWatch, NonFiniteLossError
from meshfit.train.preemption import Preempted, PreemptionWatch
from meshfit.train.profiling import ProfileWindow
from meshfit.train.validation import BestTracker
from meshfit.models import mlp

# Called after each train call is dispatched, with the step it reaches and
# its losses, K steps x M members (a benchmark's or a test's view into the
# loop).
CallObserver = Callable[[int, jax.Array], None]


def train_and_evaluate(config: ml_collections.ConfigDict | Config,
                       workdir: str, *, splits: splits_lib.Splits | None = None,
                       on_call: CallObserver | None = None,
                       console: progress.Console | None = None,
                       held: HeldCheckpoints | None = None) -> dict:
  """Trains `config` in `workdir` (resuming if it holds a run), then evaluates.

  Args:
    config: the run config (checked here).
    workdir: where config.json, checkpoints and metrics go.
    splits: train on these tables instead of reading config.dataset.
    on_call: called after each train call is dispatched (see CallObserver).
    console: what the console shows of the scalars (default: every write
      as an INFO line; train.py shows progress.Progress).
    held: keep the checkpoints here, in memory, instead of writing them
      (a temporary workdir's run, used from this process).

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
                          config.dataset.numeric_scaling,
                          config.model.raw_numbers)
  setup = make_setup(config, layout, train.num_targets)
  preemption = PreemptionWatch()
  try:
    with workdir_lock.WorkdirLock(workdir):
      ckpt = (held.keeping(config.max_checkpoints_to_keep) if held else
              checkpointer.Checkpointer(
                  workdir, max_to_keep=config.max_checkpoints_to_keep))
      try:
        state, position, tracker = resume.restore_or_init(config, setup,
                                                          ckpt, splits)
        run = _Run(config, workdir, setup, splits, ckpt, preemption, on_call,
                   console)
        final = _train(run, state, position, tracker)
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


@dataclasses.dataclass(frozen=True)
class _Run:
  """What `train_and_evaluate` sets up for the loop, and the caller's hooks
  (see its Args)."""
  config: Config
  workdir: str
  setup: Setup
  splits: splits_lib.Splits
  ckpt: checkpointer.Checkpointer
  preemption: PreemptionWatch
  on_call: CallObserver | None
  console: progress.Console | None


@dataclasses.dataclass(frozen=True)
class _Loop:
  """What the loop's calls use, opened by `_opened`.

  Attributes:
    first_step: the state's step when the loop starts.
    last_step: the step the loop stops at (unless early stopping does).
    calls: the lengths of the calls to come, drawn as they are taken.
    feed: the training chunks.
    table_z: the encoded training table on every device (a resident
      table; else empty).
    train_call: the jitted call of several steps.
    schedule: the learning rate at a step, logged (None: members have
      their own).
  """
  first_step: int
  last_step: int
  calls: Iterator[int]
  feed: feeding.TrainFeed
  table_z: dict[str, jax.Array]
  train_call: steps.TrainCall
  schedule: Callable[[int], jax.Array] | None
  writer: writers.AsyncWriter
  watch: LossWatch
  evaluations: evaluations_lib.Evaluations
  checkpoints: checkpoint_policy.LoopCheckpoints
  profile: ProfileWindow


def _train(run: _Run, state: state_lib.TrainState, position: int,
           tracker: BestTracker) -> dict:
  """Trains `state` from input `position` to the last step, then evaluates
  the model eval and predict use (`Evaluations.final`)."""
  with _opened(run, state, position, tracker) as loop:
    try:
      state, step = _train_calls(run, loop, state)
      return loop.evaluations.final(state, run.ckpt,
                                    trained=step > loop.first_step)
    except NonFiniteLossError as e:
      # The state of step e.step - 1 produced the bad loss: a checkpoint of
      # it is not good either. Set it aside (kept, not deleted) so that a
      # rerun resumes from a state that produced a finite loss.
      loop.checkpoints.wait()
      newest = max(run.ckpt.all_steps(), default=None)
      if newest is not None and newest >= e.step - 1:
        run.ckpt.set_aside([newest])
      e.last_good = max((s for s in run.ckpt.all_steps() if s < e.step - 1),
                        default=None)
      raise


def _train_calls(run: _Run, loop: _Loop, state: state_lib.TrainState
                 ) -> tuple[state_lib.TrainState, int]:
  """The calls of several steps, each followed by what its last step asks:
  a log, an evaluation, a checkpoint, a trace's end, a stop.

  Returns:
    The state of the last step trained, and that step.
  """
  config, watch, checkpoints = run.config, loop.watch, loop.checkpoints
  if run.preemption.received:
    raise Preempted(loop.first_step)
  speed = train_log.StepsPerSecond(loop.first_step)
  step = loop.first_step
  for call_index, (n, chunk) in enumerate(loop.feed.chunks(loop.calls)):
    done, step = step, step + n
    loop.profile.before(done)
    with jax.profiler.StepTraceAnnotation('train', step_num=step):
      state, losses_KxM, train_metrics = loop.train_call(
          state, loop.table_z, chunk, np.int32(n))
    watch.add(done + 1, n, losses_KxM)
    if run.on_call is not None:
      run.on_call(step, losses_KxM)
    last = step == loop.last_step
    if step % config.log_every_steps == 0 or last:
      watch.once_checked(functools.partial(
          train_log.log_train, loop.writer, speed, train_metrics,
          loop.schedule, step))
    if step % config.eval_every_steps == 0 or last:
      state = _evaluate(run, loop, step, state)
      speed.pause()
      last = last or loop.evaluations.tracker.stopped
    if last:
      checkpoints.save_now(step, state)
    elif checkpoints.due(step):
      checkpoints.save_periodic(step, state)
    watch.settle()
    loop.profile.after(step, watch)
    # Every host asks after the same calls, numbered alike.
    if run.preemption.should_stop(call_index):
      checkpoints.save_now(step, state)
      checkpoints.wait()
      loop.writer.flush()
      raise Preempted(step)
    if last:
      break
  watch.drain()
  return state, step


def _evaluate(run: _Run, loop: _Loop, step: int,
              state: state_lib.TrainState) -> state_lib.TrainState:
  """Evaluates `state` at `step`; returns it with the members' weights the
  evaluation chose, which its checkpoints (and a new best's) hold."""
  loop.watch.drain()  # train and eval steps share the in-flight bound
  choice, val_loss = loop.evaluations.at(step, state)
  if choice is not None:
    state = evaluations_lib.with_choice(state, choice, run.setup)
  if val_loss is not None:
    loop.evaluations.best_state = loop.checkpoints.note_best(step, state,
                                                             val_loss)
  return state


@contextlib.contextmanager
def _opened(run: _Run, state: state_lib.TrainState, position: int,
            tracker: BestTracker) -> Iterator[_Loop]:
  """Writes the run's config, then opens what the calls use (the metrics
  writer, the feed, the evaluations, the checkpoints) and closes them on
  the way out, the checkpoints first."""
  config, setup, splits = run.config, run.setup, run.splits
  first_step = int(jax.device_get(state.step))
  last_step = first_step if tracker.stopped else config.num_train_steps
  is_main = jax.process_index() == 0
  if is_main:
    json_files.save_json(config, storage.join(run.workdir, 'config.json'))
    writers.truncate_jsonl(storage.join(run.workdir, 'metrics.jsonl'),
                           first_step)
    if config.plots:
      plots.preload()
  shown = (run.console or progress.Console()).writer(is_main, progress.Plan.of(
      first_step, last_step, -(-splits.member_rows // config.batch_size),
      tracker))
  with contextlib.ExitStack() as stack:
    writer = writers.AsyncWriter(
        writers.create_writer(run.workdir, is_main, shown))
    stack.callback(writer.close)
    profile = ProfileWindow(config.profile_start_step,
                            config.profile_num_steps, run.workdir)
    feed, calls = _plan(config, setup, splits, profile, first_step,
                        last_step, position)
    stack.callback(feed.close)
    stack.callback(profile.close)
    table_z = ({} if not feed.resident else steps.jit_encode(
        setup.mesh, setup.arch.layout)(state.stats, feed.device_table()))
    evaluations = evaluations_lib.Evaluations(config, setup, splits, writer,
                                              tracker)
    evaluations.use_encoded_table(table_z)
    watch = _loss_watch(config)
    checkpoints = stack.enter_context(checkpoint_policy.LoopCheckpoints(
        run.ckpt, watch, writer, setup.shardings,
        functools.partial(_checkpoint_meta, run, feed, tracker, evaluations),
        config.checkpoint_every_steps, config.checkpoint_every_seconds))
    train_call = steps.jit_train_call(setup.graphdef, setup.arch.layout,
                                      setup.member_tx, setup.shardings,
                                      setup.mesh, config.log_every_steps,
                                      setup.dropout)
    yield _Loop(first_step, last_step, calls, feed, table_z, train_call,
                _schedule(config), writer, watch, evaluations, checkpoints,
                profile)


def _checkpoint_meta(run: _Run, feed: feeding.TrainFeed,
                     tracker: BestTracker,
                     evaluations: evaluations_lib.Evaluations) -> dict:
  """The JSON side of a checkpoint made now: where the input stands, what
  the run trains on, and what validation has chosen and found."""
  splits = run.splits
  return {'data_position': feed.position, 'order': feed.order,
          'config': run.config.to_dict(),
          'train_key': splits.train_key, 'validation': tracker.to_json(),
          **({'fold_rows': splits_lib.FOLD_ROWS} if splits.folds else {}),
          **evaluations.meta(),
          **reading.model_meta(splits.train.plan, run.setup.arch.layout)}


def _loss_watch(config: Config) -> LossWatch:
  """A loss watch that logs a diverged member with its hyperparameters."""
  hparams = optim.Hyperparameters.of(config)
  return LossWatch(lambda member, step, value: logging.warning(
      'Member %d (%s) diverged: its loss is %s at step %d. It is left out of '
      "the ensemble's predictions; the other members train on.", member,
      ', '.join(f'{k}={v:g}' for k, v in hparams.member(member).items()),
      value, step))


def _schedule(config: Config) -> Callable[[int], jax.Array] | None:
  """The learning rate at a step, as the train scalars log it; None when
  members have their own (it is not logged then)."""
  if len(config.sweep.learning_rates) > 1:
    return None
  # Jitted: op by op, the schedule cost the writer thread (and so the loop)
  # more than the rest of a log.
  return optim.jit_learning_rate_schedule(
      config.optimizer, config.num_train_steps,
      (config.sweep.learning_rates or (config.optimizer.learning_rate,))[0])


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
