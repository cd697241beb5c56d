"""The training loop: `train_and_evaluate`.

Data travels one way: config -> mesh -> data -> state -> step ->
metrics/checkpoints. The loop runs calls of many steps (`call_plan`), reads
each call's losses one call behind (`loss_watch`), and at the end of a call
logs, evaluates, checkpoints (`checkpoint_policy`), profiles or stops for a
preemption.
"""

import functools
import os
import time
from collections.abc import Callable

import jax
import ml_collections
import numpy as np
import optax
from absl import logging

from meshfit import (call_plan, checkpoint_policy, checkpointing,
                     compilation_cache, config as config_lib, config_files,
                     data, feeding, metrics, optim, plots, runtime,
                     state as state_lib, steps, workdir_lock, writers)
from meshfit.config import Config
from meshfit.loss_watch import LossWatch, NonFiniteLossError
from meshfit.normalization import Normalizer
from meshfit.preemption import Preempted, PreemptionWatch
from meshfit.profiling import ProfileWindow
from models import mlp

# Called after each train call is dispatched, with the step it reaches and
# its losses (a benchmark's or a test's view into the loop).
CallObserver = Callable[[int, jax.Array], None]


def train_and_evaluate(config: ml_collections.ConfigDict | Config,
                       workdir: str, *, splits: data.Splits | None = None,
                       on_call: CallObserver | None = None
                       ) -> dict[str, float]:
  """Trains `config` in `workdir` (resuming if it holds a run), then evaluates.

  Args:
    config: the run config (checked here).
    workdir: where config.json, checkpoints and metrics go.
    splits: train on these tables instead of reading config.dataset.
    on_call: called after each train call is dispatched (see CallObserver).

  Returns:
    The final evaluation metrics.

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
    splits = data.load_splits(config.dataset)
  setup = runtime.make_setup(config, splits.train.x_NxF.shape[1],
                             splits.train.y_NxT.shape[1])
  preemption = PreemptionWatch()
  try:
    with workdir_lock.WorkdirLock(workdir):
      ckpt = checkpointing.Checkpointer(
          workdir, max_to_keep=config.max_checkpoints_to_keep)
      try:
        state, position = _restore_or_init(config, setup, ckpt, splits.train)
        final = _train(config, workdir, setup, splits, ckpt, preemption,
                       state, position, on_call)
      finally:
        ckpt.wait()
        ckpt.close()
  finally:
    preemption.close()
  if config.plots and jax.process_index() == 0:
    plots.write_loss_curve(workdir, config.dataset.name,
                           splits.train.target_names)
  return final


def _restore_or_init(config: Config, setup: runtime.Setup,
                     ckpt: checkpointing.Checkpointer,
                     train_table) -> tuple[state_lib.TrainState, int]:
  """The newest intact checkpoint's state and input position, or a start.

  Damaged checkpoints are skipped with a warning naming their step and, once
  a restore succeeded, moved aside (never deleted).
  """
  damaged = []
  for step in reversed(ckpt.all_steps()):
    try:
      meta = ckpt.restore_meta(step)
      config_files.check_resume_compatible(meta['config'], config, step)
      target = state_lib.abstract_state(setup.arch, setup.tx, setup.mesh)
      state = ckpt.restore_state(step, target)
    except checkpointing.DamagedCheckpointError as e:
      logging.warning('Checkpoint of step %d is damaged and is skipped: %s',
                      step, str(e).splitlines()[0][:300])
      damaged.append(step)
      continue
    ckpt.set_aside(damaged)
    logging.info('Resuming from the checkpoint of step %d.', step)
    return state, int(meta['data_position'])
  ckpt.set_aside(damaged)
  norm = Normalizer.fit(train_table.x_NxF, train_table.y_NxT,
                        config.dataset.standardize)
  return state_lib.create_train_state(setup.arch, setup.tx, setup.mesh,
                                      config.seed, norm), 0


def _train(config: Config, workdir: str, setup: runtime.Setup,
           splits: data.Splits, ckpt: checkpointing.Checkpointer,
           preemption: PreemptionWatch, state: state_lib.TrainState,
           position: int, on_call: CallObserver | None) -> dict[str, float]:
  """The loop: calls of several steps, then whatever their last step asks."""
  initial_step = int(jax.device_get(state.step))
  is_main = jax.process_index() == 0
  if is_main:
    config_files.save_json(config, os.path.join(workdir, 'config.json'))
    writers.truncate_jsonl(os.path.join(workdir, 'metrics.jsonl'),
                           initial_step)
  writer = writers.AsyncWriter(writers.create_writer(workdir, is_main))
  train_call = steps.jit_train_call(setup.graphdef, setup.tx,
                                    setup.shardings, setup.mesh,
                                    config.log_every_steps)
  eval_step = steps.jit_eval_step(setup.graphdef, setup.shardings, setup.mesh)
  # Jitted: op by op, the schedule cost the writer thread (and so the loop)
  # more than the rest of a log.
  schedule = jax.jit(optim.learning_rate_schedule(config.optimizer,
                                                  config.num_train_steps))
  profile = ProfileWindow(config.profile_start_step,
                          config.profile_num_steps, workdir)
  watch = LossWatch()
  checkpoints = checkpoint_policy.LoopCheckpoints(
      ckpt, watch, writer, setup.shardings, lambda: {
          'data_position': feed.position, 'config': config.to_dict(),
          # What --mode=predict reads from a user's file.
          'feature_names': splits.train.feature_names,
          'target_names': splits.train.target_names},
      config.checkpoint_every_steps, config.checkpoint_every_seconds)
  try:
    feed, calls = _plan(config, setup, splits.train, profile, initial_step,
                        position)
  except BaseException:
    checkpoints.close()
    raise
  table_z = ({} if not feed.resident else
             steps.jit_standardize(setup.mesh)(state.norm,
                                               feed.device_table()))
  speed = _StepsPerSecond(initial_step)
  try:
    if preemption.received:
      raise Preempted(initial_step)
    step = initial_step
    for call_index, (n, chunk) in enumerate(feed.chunks(calls)):
      done, step = step, step + n
      profile.before(done)
      with jax.profiler.StepTraceAnnotation('train', step_num=step):
        state, losses_K, train_metrics = train_call(state, table_z, chunk,
                                                    np.int32(n))
      watch.add(done + 1, n, losses_K)
      if on_call is not None:
        on_call(step, losses_K)
      last = step == config.num_train_steps
      if step % config.log_every_steps == 0 or last:
        # Computed and written by the writer's thread, once checked.
        scalars = functools.partial(_train_scalars, train_metrics, schedule,
                                    step, speed(step))
        watch.once_checked(functools.partial(writer.write_scalars, step,
                                             scalars))
      if checkpoints.due(step) and not last:
        checkpoints.save_periodic(step, state)
      watch.settle()
      profile.after(step, watch)
      if step % config.eval_every_steps == 0 and not last:
        watch.drain()  # train and eval steps share the in-flight bound
        _write_eval(writer, step, runtime.evaluate_table(
            setup, state, splits.eval, config.eval_batch_size, eval_step))
        speed.pause()
      if last:
        checkpoints.save_now(step, state)
      # Every host asks after the same calls, numbered alike.
      if preemption.should_stop(call_index):
        checkpoints.save_now(step, state)
        checkpoints.wait()
        writer.flush()
        raise Preempted(step)
    watch.drain()
    final = runtime.evaluate_table(setup, state, splits.eval,
                                   config.eval_batch_size, eval_step)
    _write_eval(writer, int(jax.device_get(state.step)), final)
    return final
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
  finally:
    checkpoints.close()
    profile.close()
    feed.close()
    writer.close()


def _plan(config: Config, setup: runtime.Setup, train_table,
          profile: ProfileWindow, initial_step: int, position: int):
  """The feed of training chunks, and the lengths of the calls to come.

  Log, eval and checkpoint steps end a call (a checkpoint by the clock is
  taken at whichever call's end it falls due).
  """
  periods = (config.log_every_steps, config.eval_every_steps,
             config.checkpoint_every_steps)
  arch = setup.arch
  flops_per_step = 6.0 * mlp.num_params(
      (arch.num_features, *arch.mlp.hidden_sizes, arch.num_targets)
  ) * config.batch_size
  max_steps_per_call = call_plan.choose_steps_per_call(
      config.steps_per_call, flops_per_step, jax.devices()[0].platform,
      periods)
  calls = call_plan.plan_calls(initial_step, config.num_train_steps,
                               max_steps_per_call, periods, profile.stops)
  resident = feeding.fits_on_device(train_table.x_NxF, train_table.y_NxT,
                                    config.dataset.resident_table_mb)
  feed = feeding.TrainFeed(
      train_table.x_NxF, train_table.y_NxT, batch_size=config.batch_size,
      seed=config.seed, mesh=setup.mesh, steps_per_call=max_steps_per_call,
      resident=resident, position=position,
      prefetch=config.dataset.prefetch_batches)
  logging.info('Training steps %d..%d on a %s mesh, up to %d per call, '
               'batches %s.', initial_step + 1, config.num_train_steps,
               dict(setup.mesh.shape), max_steps_per_call,
               'gathered on device' if resident else 'streamed from the host')
  return feed, calls


def _train_scalars(train_metrics: metrics.TrainMetrics,
                   schedule: optax.Schedule, step: int,
                   steps_per_sec: float) -> dict[str, float]:
  """The train scalars logged at `step` (from its call's metrics copy)."""
  summary = jax.device_get(train_metrics).compute()
  return {'train/loss': summary['loss'],
          'train/grad_norm': summary['grad_norm'],
          'train/learning_rate': schedule(step - 1),
          'train/steps_per_sec': steps_per_sec}


class _StepsPerSecond:
  """Training speed between logs; time spent evaluating is left out."""

  def __init__(self, step: int):
    self._step, self._time = step, time.perf_counter()

  def pause(self) -> None:
    """Restarts the clock: what happened since the last step is not training."""
    self._time = time.perf_counter()

  def __call__(self, step: int) -> float:
    now = time.perf_counter()
    rate = (step - self._step) / max(now - self._time, 1e-9)
    self._step, self._time = step, now
    return rate


def _write_eval(writer: writers.ScalarWriter, step: int,
                result: dict[str, float]) -> None:
  writer.write_scalars(step, {f'eval/{k}': result[k]
                              for k in ('mse', 'rmse', 'mae', 'r2')})
  writer.flush()
