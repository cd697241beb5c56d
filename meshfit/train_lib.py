"""The training loop, evaluation and their shared set-up.

Data travels one way: config -> mesh -> data -> state -> step ->
metrics/checkpoints.
"""

import collections
import dataclasses
import json
import os

import jax
import ml_collections
import numpy as np
import optax
from absl import logging
from clu import periodic_actions
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
from models.mlp import MlpConfig

# Dispatched but unfinished steps. XLA:CPU deadlocks in its collectives when
# many multi-device steps are queued at once; two keep the device busy while
# the host prepares the next step, and let every loss be checked as it lands.
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
  spec = state_lib.ModelSpec(MlpConfig(**config.model), num_features,
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
  """Bounds the steps in flight and stops at the first non-finite loss."""

  def __init__(self):
    self._pending = collections.deque()

  def add(self, step: int, loss: jax.Array) -> None:
    self._pending.append((step, loss))
    while len(self._pending) > MAX_STEPS_IN_FLIGHT:
      self._check(*self._pending.popleft())

  def drain(self) -> None:
    """Waits for every dispatched step; call before saving or logging."""
    while self._pending:
      self._check(*self._pending.popleft())

  @staticmethod
  def _check(step: int, loss: jax.Array) -> None:
    value = float(loss)
    if not np.isfinite(value):
      raise NonFiniteLossError(step, value)


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
  if jax.process_index() == 0:
    plots.write_loss_curve(workdir, config.dataset.name,
                           splits.train.target_names)
  return final


def _train(config, workdir, setup, splits, ckpt, preemption, state,
           position) -> dict[str, float]:
  """The loop: steps, metrics, evaluations, checkpoints, preemption."""
  initial_step = int(jax.device_get(state.step))
  is_main = jax.process_index() == 0
  if is_main:
    config_lib.save_json(config, os.path.join(workdir, 'config.json'))
    metrics.truncate_jsonl(os.path.join(workdir, 'metrics.jsonl'),
                           initial_step)
  writer = metrics.create_writer(workdir, is_main)
  train_step = steps.jit_train_step(setup.graphdef, setup.tx, setup.shardings,
                                    setup.mesh, config.log_every_steps)
  eval_step = steps.jit_eval_step(setup.graphdef, setup.shardings, setup.mesh)
  schedule = optim.learning_rate_schedule(config, config.num_train_steps)
  batches = loader.TrainLoader(
      splits.train.x_NxF, splits.train.y_NxT, batch_size=config.batch_size,
      seed=config.seed, sharding=sharding.batch_sharding(setup.mesh),
      position=position, prefetch=config.dataset.prefetch_batches)
  progress = periodic_actions.ReportProgress(
      num_train_steps=config.num_train_steps, writer=writer,
      every_steps=config.log_every_steps, every_secs=None)
  watch = _LossWatch()
  last_saved = initial_step if initial_step else None

  def save(step):
    nonlocal last_saved
    watch.drain()  # never save a state whose loss was not checked
    ckpt.save(step, state, {'data_position': batches.position,
                            'config': config.to_dict(),
                            # What --mode=predict reads from a user's file.
                            'feature_names': splits.train.feature_names,
                            'target_names': splits.train.target_names})
    last_saved = step

  logging.info('Training steps %d..%d on a %s mesh.', initial_step + 1,
               config.num_train_steps, dict(setup.mesh.shape))
  try:
    if preemption.received:
      raise Preempted(initial_step)
    for step in range(initial_step + 1, config.num_train_steps + 1):
      with jax.profiler.StepTraceAnnotation('train', step_num=step):
        state, loss = train_step(state, next(batches))
      watch.add(step, loss)
      progress(step)
      last = step == config.num_train_steps
      if step % config.log_every_steps == 0 or last:
        watch.drain()
        summary = jax.device_get(state.train_metrics).compute()
        writer.write_scalars(step, {
            'train/loss': summary['loss'],
            'train/grad_norm': summary['grad_norm'],
            'train/learning_rate': schedule(step - 1)})
      if step % config.eval_every_steps == 0 and not last:
        watch.drain()  # train and eval steps share the in-flight bound
        with progress.timed('eval'):
          _write_eval(writer, step, evaluate_table(
              setup, state, splits.eval, config.eval_batch_size, eval_step))
      if step % config.checkpoint_every_steps == 0 or last:
        save(step)
      if preemption.should_stop(step):
        if last_saved != step:
          save(step)
        ckpt.wait()
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
    ckpt.wait()
    if last_saved is not None and last_saved >= e.step - 1:
      ckpt.set_aside([last_saved])
    e.last_good = max((s for s in ckpt.all_steps() if s < e.step - 1),
                      default=None)
    raise
  finally:
    batches.close()
    writer.close()


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
  pred_NxT = predict_table(setup, state, table.x_NxF, config.eval_batch_size)
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
    plots.write_predictions_figure(
        os.path.join(workdir, 'eval', f'step_{step}_predictions.png'),
        table.y_NxT, pred_NxT, table.target_names,
        title=(f'{os.path.basename(os.path.abspath(workdir))}: step {step}, '
               f'split {config.dataset.eval_split!r} of '
               f'{config.dataset.name}'))
  return result
