"""The training loop, evaluation and their shared set-up.

Data travels one way: config -> mesh -> data -> state -> step ->
metrics/checkpoints.
"""

import collections
import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import nnx
from jax.sharding import Mesh

import input_pipeline
from input_pipeline import loader
from input_pipeline.tables import Table
from meshfit import (checkpointing, compilation_cache, config_lib, metrics,
                     optim, plots, sharding, state as state_lib, steps,
                     workdir_lock)
from meshfit.errors import UsageError
from meshfit.preemption import Preempted, PreemptionWatch
from meshfit.normalization import Normalizer
from models import mlp

# Dispatched but unfinished calls (train calls of several steps, eval or
# predict batches). XLA:CPU deadlocks in its collectives when many
# multi-device executions are queued at once; two keep the device busy while
# the host prepares the next, and let every loss be checked as it lands.
MAX_STEPS_IN_FLIGHT = 2


@dataclasses.dataclass(frozen=True)
class Setup:
  """What training, evaluation and prediction share, built from a config."""
  mesh: Mesh
  spec: state_lib.ModelSpec
  graphdef: nnx.GraphDef
  tx: optax.GradientTransformation
  shardings: state_lib.TrainState


def make_setup(config: ml_collections.ConfigDict, num_features: int,
               num_targets: int, mesh: Mesh | None = None) -> Setup:
  """Mesh, model structure, optimizer and state shardings for `config`."""
  if mesh is None:
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.model)
  spec = state_lib.ModelSpec(mlp.MlpConfig(**config.model), num_features,
                             num_targets)
  tx = optim.make_optimizer(config, config.num_train_steps)
  return Setup(mesh, spec, state_lib.graphdef(spec), tx,
               state_lib.state_shardings(spec, tx, mesh))


def restore(ckpt: checkpointing.Checkpointer, setup: Setup,
            step: int) -> state_lib.TrainState:
  """The state of checkpoint `step` on `setup`'s mesh (eval and predict).

  Raises:
    UsageError: the checkpoint cannot be read.
  """
  try:
    return ckpt.restore_state(
        step, state_lib.abstract_state(setup.spec, setup.tx, setup.mesh))
  except checkpointing.DamagedCheckpointError as e:
    raise UsageError(f'the checkpoint of step {step} in {ckpt.directory} '
                     f'cannot be read ({str(e).splitlines()[0][:200]}); '
                     'pick another with --step') from None


def predict_table(setup: Setup, state: state_lib.TrainState,
                  x_NxF: np.ndarray, batch_size: int) -> np.ndarray:
  """Predictions (original units) for every row of `x_NxF`, in order.

  Batches are sharded over the mesh; the last one is padded and the padding
  dropped. Every process returns all N rows.
  """
  predict_step = steps.jit_predict_step(setup.graphdef, setup.shardings,
                                        setup.mesh)
  batch_preds = (predict_step(state, batch['x']) for batch in
                 loader.eval_batches(x_NxF, None, batch_size=batch_size,
                                     sharding=sharding.batch_sharding(
                                         setup.mesh)))
  preds = list(metrics.fetched(batch_preds, MAX_STEPS_IN_FLIGHT))
  if not preds:
    return np.zeros((0, setup.spec.num_targets), np.float32)
  return np.concatenate(preds)[:x_NxF.shape[0]]


def evaluate_table(setup: Setup, state: state_lib.TrainState, table: Table,
                   batch_size: int, eval_step=None) -> dict[str, float]:
  """mse, rmse, mae, r2 (original units) over every example of `table`."""
  if eval_step is None:
    eval_step = steps.jit_eval_step(setup.graphdef, setup.shardings,
                                    setup.mesh)
  batch_sums = (eval_step(state, batch) for batch in loader.eval_batches(
      table.x_NxF, table.y_NxT, batch_size=batch_size,
      sharding=sharding.batch_sharding(setup.mesh)))
  total = metrics.host_sum(batch_sums, table.y_NxT.shape[1],
                           MAX_STEPS_IN_FLIGHT)
  result = total.compute(np.asarray(jax.device_get(state.norm.y_std_T)))
  result['num_examples'] = int(total.count)
  return result


class _LossWatch:
  """Bounds the calls in flight and stops at the first non-finite loss.

  A call's losses are read once a later call has been dispatched (or at a
  drain), so the host never waits for the device just to check them. What
  must not happen before they are known to be finite (the call's train
  metrics log, a checkpoint of its state) is attached with `then` and runs
  then.
  """

  def __init__(self):
    self._pending = collections.deque()

  def add(self, first_step: int, num_steps: int, losses_K: jax.Array) -> None:
    """Records a dispatched call of steps first_step..+num_steps-1."""
    self._pending.append((first_step, num_steps, losses_K, []))

  def then(self, action: Callable[[], None]) -> None:
    """Runs `action` once the last added call's losses are finite."""
    self._pending[-1][3].append(action)

  def settle(self) -> None:
    """Checks calls until at most MAX_STEPS_IN_FLIGHT are unread."""
    while len(self._pending) > MAX_STEPS_IN_FLIGHT:
      self._check(*self._pending.popleft())

  def drain(self) -> None:
    """Waits for every dispatched call; call before saving or evaluating."""
    while self._pending:
      self._check(*self._pending.popleft())

  @staticmethod
  def _check(first_step: int, num_steps: int, losses_K: jax.Array,
             actions: list[Callable[[], None]]) -> None:
    losses = np.asarray(losses_K)[:num_steps]
    bad = np.flatnonzero(~np.isfinite(losses))
    if bad.size:
      raise NonFiniteLossError(first_step + int(bad[0]),
                               float(losses[bad[0]]))
    for action in actions:
      action()


class NonFiniteLossError(RuntimeError):
  """Training produced a NaN or infinite loss; nothing after it was saved."""

  def __init__(self, step: int, value: float):
    super().__init__(f'loss is {value} at step {step}')
    self.step = step
    self.last_good: int | None = None  # set by the loop

  def explain(self, workdir: str) -> str:
    """The one-line error: the step, and the checkpoint to go back to."""
    if self.last_good is None:
      where = 'no checkpoint was written'
    else:
      path = os.path.join(workdir, 'checkpoints', str(self.last_good))
      where = (f'the last good checkpoint is step {self.last_good} ({path}), '
               'left untouched')
    return (f'{self}: training stopped; {where}. Lower '
            'optimizer.learning_rate or set optimizer.grad_clip_norm')


def _restore_or_init(config, setup, ckpt, train_table):
  """The newest intact checkpoint's state and input position, or a start.

  Damaged checkpoints are skipped with a warning naming their step and, once
  a restore succeeded, moved aside (never deleted).
  """
  damaged = []
  for step in reversed(ckpt.all_steps()):
    try:
      meta = ckpt.restore_meta(step)
      config_lib.check_resume_compatible(meta['config'], config, step)
      target = state_lib.abstract_state(setup.spec, setup.tx, setup.mesh)
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
  return state_lib.create_train_state(setup.spec, setup.tx, setup.mesh,
                                      config.seed, norm), 0


def train_and_evaluate(config: ml_collections.ConfigDict,
                       workdir: str) -> dict[str, float]:
  """Trains `config` in `workdir` (resuming if it holds a run), then evaluates.

  Args:
    config: the run config (validated here).
    workdir: where config.json, checkpoints and metrics go.

  Returns:
    The final evaluation metrics.

  Raises:
    UsageError: bad config or data, an incompatible checkpoint, or a workdir
      that another trainer holds; nothing in the workdir has changed.
    Preempted: SIGTERM; the step reached is saved.
    NonFiniteLossError: the loss diverged; earlier checkpoints are intact.
  """
  config_lib.check_workdir(workdir)
  config_lib.validate(config, jax.device_count())
  compilation_cache.configure(config.compilation_cache_dir)
  splits = input_pipeline.load_splits(config.dataset)
  setup = make_setup(config, splits.train.x_NxF.shape[1],
                     splits.train.y_NxT.shape[1])
  preemption = PreemptionWatch()
  try:
    with workdir_lock.WorkdirLock(workdir):
      ckpt = checkpointing.Checkpointer(
          workdir, max_to_keep=config.max_checkpoints_to_keep)
      try:
        state, position = _restore_or_init(config, setup, ckpt, splits.train)
        final = _train(config, workdir, setup, splits, ckpt, preemption,
                       state, position)
      finally:
        ckpt.wait()
        ckpt.close()
  finally:
    preemption.close()
  if config.plots and jax.process_index() == 0:
    plots.write_loss_curve(workdir, config.dataset.name,
                           splits.train.target_names)
  return final


def _train(config, workdir, setup, splits, ckpt, preemption, state,
           position) -> dict[str, float]:
  """The loop: calls of several steps, metrics, evaluations, checkpoints,
  profiles and preemption, each at the end of a call."""
  initial_step = int(jax.device_get(state.step))
  is_main = jax.process_index() == 0
  if is_main:
    config_lib.save_json(config, os.path.join(workdir, 'config.json'))
    metrics.truncate_jsonl(os.path.join(workdir, 'metrics.jsonl'),
                           initial_step)
  writer = metrics.AsyncWriter(metrics.create_writer(workdir, is_main))
  train_steps = steps.jit_train_steps(setup.graphdef, setup.tx,
                                      setup.shardings, setup.mesh,
                                      config.log_every_steps)
  eval_step = steps.jit_eval_step(setup.graphdef, setup.shardings, setup.mesh)
  # Jitted: evaluated op by op, a schedule took ~0.3 ms of the writer
  # thread's (and so the loop's) time per log; one call takes ~15 us.
  schedule = jax.jit(optim.learning_rate_schedule(config,
                                                  config.num_train_steps))
  profile = _ProfileWindow(config, workdir)
  watch = _LossWatch()
  saves = _Saves(ckpt, watch, writer, setup.shardings, lambda: {
      'data_position': batches.position, 'config': config.to_dict(),
      # What --mode=predict reads from a user's file.
      'feature_names': splits.train.feature_names,
      'target_names': splits.train.target_names}, config.checkpoint_budget)
  calls_of = steps_per_call(config, setup.spec, saves.in_background)
  # A due checkpoint ends a call if the background saver wants it, always
  # with several processes.
  optional = config.checkpoint_every_steps if saves.in_background else 0
  plan = loader.chunk_plan(
      initial_step, config.num_train_steps, calls_of,
      (config.log_every_steps, config.eval_every_steps,
       0 if optional else config.checkpoint_every_steps),
      profile.stops, optional, saves.wants)
  try:
    batches = loader.TrainLoader(
        splits.train.x_NxF, splits.train.y_NxT, batch_size=config.batch_size,
        seed=config.seed, mesh=setup.mesh,
        chunk_sizes=(n for _, n in plan), steps_per_call=calls_of,
        resident=_fits_on_device(splits.train,
                                 config.dataset.resident_table_mb),
        position=position, prefetch=config.dataset.prefetch_batches)
  except BaseException:
    saves.close()
    raise
  table_z = ({} if not batches.resident else
             steps.jit_standardize(setup.mesh)(state.norm,
                                               batches.device_table()))
  speed = _StepsPerSecond(initial_step)

  logging.info('Training steps %d..%d on a %s mesh, up to %d per call, '
               'batches %s.', initial_step + 1, config.num_train_steps,
               dict(setup.mesh.shape), calls_of,
               'gathered on device' if batches.resident else
               'streamed from the host')
  try:
    if preemption.received:
      raise Preempted(initial_step)
    step = initial_step
    for call, (n, chunk) in enumerate(batches):
      done, step = step, step + n
      profile.before(done)
      with jax.profiler.StepTraceAnnotation('train', step_num=step):
        state, losses_K, train_metrics = train_steps(state, table_z, chunk,
                                                     np.int32(n))
      watch.add(done + 1, n, losses_K)
      last = step == config.num_train_steps
      if step % config.log_every_steps == 0 or last:
        # Computed and written by the writer's thread, once checked.
        scalars = functools.partial(_train_scalars, train_metrics, schedule,
                                    step, speed(step))
        watch.then(functools.partial(writer.write_scalars, step, scalars))
      if step % config.checkpoint_every_steps == 0 and not last:
        saves.periodic(step, state)
      watch.settle()
      profile.after(step, watch)
      if step % config.eval_every_steps == 0 and not last:
        watch.drain()  # train and eval steps share the in-flight bound
        _write_eval(writer, step, evaluate_table(
            setup, state, splits.eval, config.eval_batch_size, eval_step))
        speed.pause()
      if last:
        saves.now(step, state)
      # Every host asks at the same calls, numbered alike.
      if preemption.should_stop(call):
        saves.now(step, state)
        saves.wait()
        writer.flush()
        raise Preempted(step)
    watch.drain()
    final = evaluate_table(setup, state, splits.eval,
                           config.eval_batch_size, eval_step)
    _write_eval(writer, int(jax.device_get(state.step)), final)
    return final
  except NonFiniteLossError as e:
    # The state of step e.step - 1 produced the bad loss: a checkpoint of it
    # is not good either. Set it aside (kept, not deleted) so that a rerun
    # resumes from a state that produced a finite loss.
    saves.wait()
    newest = max(ckpt.all_steps(), default=None)
    if newest is not None and newest >= e.step - 1:
      ckpt.set_aside([newest])
    e.last_good = max((s for s in ckpt.all_steps() if s < e.step - 1),
                      default=None)
    raise
  finally:
    saves.close()
    profile.close()
    batches.close()
    writer.close()


class _Saves:
  """The loop's checkpoints: periodic ones in the background, others now.

  With one process, a periodic checkpoint copies the state on device (the
  next call consumes the original) and, once the losses up to it are known
  to be finite, hands the copy to a thread that writes it: the loop never
  waits for the disk, and a save that comes while the previous is still
  being written replaces any older one still waiting (see
  checkpointing.BackgroundSaver). Several processes must write the same
  checkpoints in step, so they save each one from the loop.
  """

  def __init__(self, ckpt: checkpointing.Checkpointer, watch: _LossWatch,
               writer: metrics.AsyncWriter, shardings: state_lib.TrainState,
               meta: Callable[[], dict], budget: float):
    self._ckpt, self._watch, self._writer, self._meta = (ckpt, watch, writer,
                                                         meta)
    self._saver = (checkpointing.BackgroundSaver(ckpt, budget)
                   if jax.process_count() == 1 else None)
    self._copy = jax.jit(lambda s: jax.tree.map(jnp.copy, s),
                         out_shardings=shardings)
    self._handing = 0  # periodic copies not yet handed to the saver

  @property
  def in_background(self) -> bool:
    """Periodic checkpoints are optional (written by a thread, within a
    budget); with several processes every one is written, in step."""
    return self._saver is not None

  def wants(self, step: int) -> bool:
    """Whether a periodic checkpoint due at `step` would be written now.

    Asked when the call that holds `step` is planned: a step the saver will
    not take (still writing, over its budget, or one already on its way to
    it) need not end a call; it is counted as skipped here.
    """
    if self._handing == 0 and self._saver.ready():
      return True
    self._saver.skipped.append(step)
    return False

  def periodic(self, step: int, state: state_lib.TrainState) -> None:
    """A checkpoint of `state` (the last call's result) at `step`."""
    if self._saver is None:
      self.now(step, state)
      return
    if not self._saver.ready():  # still writing, or over its time budget
      self._saver.skipped.append(step)
      return
    copy, meta = self._copy(state), self._meta()
    self._handing += 1

    def hand_over():
      self._handing -= 1
      self._saver.submit(step, copy, meta, self._writer.pending())
    self._watch.then(hand_over)

  def now(self, step: int, state: state_lib.TrainState) -> None:
    """Starts saving `state` (unless `step` is saved already).

    Every dispatched call is checked first: that also hands any periodic
    checkpoint waiting on those checks to the background writer.
    """
    self._watch.drain()  # never save a state whose loss was not checked
    self._writer.flush()  # nor one whose logs could be lost to a crash
    if self._saver is not None:
      self._saver.wait()
    if step not in self._ckpt.all_steps():
      self._ckpt.save(step, state, self._meta())

  def wait(self) -> None:
    """Every checkpoint started so far is on disk; raises their errors."""
    if self._saver is not None:
      self._saver.wait()
    self._ckpt.wait()

  def close(self) -> None:
    if self._saver is not None:
      self._saver.close()
      skipped = sorted(self._saver.skipped)
      if skipped:
        logging.warning(
            '%d periodic checkpoint(s) skipped (steps %s): each came while '
            'an earlier one was being written or sooner than '
            'checkpoint_budget allows. Raise checkpoint_every_steps, or '
            'checkpoint_budget (up to 1), to have more of them.',
            len(skipped), ', '.join(map(str, skipped[:10])) +
            (', ...' if len(skipped) > 10 else ''))


# What `steps_per_call = 0` aims one call at: enough work to hide the
# ~0.1-0.3 ms a call costs the host, little enough that SIGTERM is answered
# soon (the call in flight finishes first): ~0.1-0.2 s at the ~1e11 flop/s of
# a CPU, less on accelerators (1e14 and more).
CALL_FLOPS = {'cpu': 2e10}
CALL_FLOPS_ACCELERATOR = 2e13
MAX_AUTO_STEPS_PER_CALL = 128


def steps_per_call(config: ml_collections.ConfigDict,
                   spec: state_lib.ModelSpec,
                   background_checkpoints: bool) -> int:
  """config.steps_per_call, or for 0 a call length sized to the model.

  Calls of about CALL_FLOPS of work, at most MAX_AUTO_STEPS_PER_CALL steps;
  among those lengths (the largest power of two, divisors of a period), the
  one that needs the fewest calls, given that log and eval steps end calls too,
  and checkpoint steps unless checkpoints are written in the background
  (one process: only the few the saver takes end a call). The same on every
  host (it depends on the config, the platform and the process count only),
  as it must be: every host runs the same calls.
  """
  if config.steps_per_call:
    return config.steps_per_call
  flops_per_step = 6.0 * mlp.num_params(
      (spec.num_features, *spec.mlp.hidden_sizes, spec.num_targets)
  ) * config.batch_size
  target = CALL_FLOPS.get(jax.devices()[0].platform, CALL_FLOPS_ACCELERATOR)
  most = min(MAX_AUTO_STEPS_PER_CALL, max(1, int(target // flops_per_step)))
  periods = (config.log_every_steps, config.eval_every_steps)
  if not background_checkpoints:
    periods += (config.checkpoint_every_steps,)
  candidates = {1 << (most.bit_length() - 1)} | {
      d for d in range(1, most + 1) if any(p % d == 0 for p in periods)}

  # Counted over a stretch long enough to see the pattern; ties go to the
  # shorter call (the least padding).
  return min(sorted(candidates),
             key=lambda k: loader.num_calls(10_000, k, periods))


def _train_scalars(train_metrics: metrics.TrainMetrics,
                   schedule: optax.Schedule, step: int,
                   steps_per_sec: float) -> dict[str, float]:
  """The train scalars logged at `step` (from its call's metrics copy)."""
  summary = jax.device_get(train_metrics).compute()
  return {'train/loss': summary['loss'],
          'train/grad_norm': summary['grad_norm'],
          'train/learning_rate': schedule(step - 1),
          'train/steps_per_sec': steps_per_sec}


def _fits_on_device(table: Table, limit_mb: int) -> bool:
  """Whether a train table is small enough to copy to every device."""
  return table.x_NxF.nbytes + table.y_NxT.nbytes <= limit_mb * 2**20


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


class _ProfileWindow:
  """A `jax.profiler` trace of steps profile_start_step..+profile_num_steps.

  The trace goes to workdir/profile (open it with TensorBoard's profile
  plugin or Perfetto). Both ends of the window end a call, so the trace holds
  exactly those steps' calls.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self._first = config.profile_start_step
    self._last = self._first + config.profile_num_steps - 1
    self._dir = os.path.join(workdir, 'profile')
    self._active = False
    self.stops = ((self._first - 1, self._last) if self._first > 0 else ())

  def before(self, done: int) -> None:
    """Starts the trace if the next call begins the window."""
    if self._first > 0 and done == self._first - 1 and not self._active:
      jax.profiler.start_trace(self._dir)
      self._active = True
      logging.info('Tracing steps %d..%d into %s.', self._first, self._last,
                   self._dir)

  def after(self, step: int, watch: _LossWatch) -> None:
    """Stops the trace once the window's last call has finished."""
    if self._active and step >= self._last:
      watch.drain()
      self.close()

  def close(self) -> None:
    if self._active:
      jax.profiler.stop_trace()
      self._active = False


def _write_eval(writer, step: int, result: dict[str, float]) -> None:
  writer.write_scalars(step, {f'eval/{k}': result[k]
                              for k in ('mse', 'rmse', 'mae', 'r2')})
  writer.flush()


def evaluate(config: ml_collections.ConfigDict, workdir: str,
             step: int | None = None) -> dict[str, float | int | str]:
  """Evaluates a saved checkpoint on the eval split.

  Writes eval/step_N.json and eval/step_N_predictions.png (predicted against
  actual, and residuals).

  Args:
    config: the run's saved config (evaluation keys may be overridden).
    workdir: the run's workdir.
    step: the checkpoint to evaluate; None takes the newest.

  Returns:
    {"step", "split", "num_examples", "mse", "rmse", "mae", "r2"}.
  """
  config_lib.validate(config, jax.device_count())
  compilation_cache.configure(config.compilation_cache_dir)
  ckpt = checkpointing.Checkpointer(workdir, read_only=True)
  try:
    step = ckpt.step_to_restore(step)
    table = input_pipeline.load_eval_split(config.dataset)
    setup = make_setup(config, table.x_NxF.shape[1], table.y_NxT.shape[1])
    state = restore(ckpt, setup, step)
  finally:
    ckpt.close()
  scores = evaluate_table(setup, state, table, config.eval_batch_size)
  result = {'step': step, 'split': config.dataset.eval_split,
            'num_examples': scores['num_examples'],
            **{k: scores[k] for k in ('mse', 'rmse', 'mae', 'r2')}}
  if jax.process_index() == 0:
    os.makedirs(os.path.join(workdir, 'eval'), exist_ok=True)
    path = os.path.join(workdir, 'eval', f'step_{step}.json')
    with open(path + '.tmp', 'w', encoding='utf-8') as f:
      json.dump(result, f, indent=2)
      f.write('\n')
    os.replace(path + '.tmp', path)
  if config.plots:
    # Every process takes part in the predictions; process 0 draws them.
    pred_NxT = predict_table(setup, state, table.x_NxF,
                             config.eval_batch_size)
  if config.plots and jax.process_index() == 0:
    plots.write_predictions_figure(
        os.path.join(workdir, 'eval', f'step_{step}_predictions.png'),
        table.y_NxT, pred_NxT, table.target_names,
        title=(f'{os.path.basename(os.path.abspath(workdir))}: step {step}, '
               f'split {config.dataset.eval_split!r} of '
               f'{config.dataset.name}'))
  return result
