"""Orbax checkpoints of the whole train state, plus what decides the run.

Layout: `workdir/checkpoints/<step>/{state,meta}`. `state` is the TrainState
(every leaf a global jax.Array); `meta` is JSON: the input position and the
config the state was trained with. Restores go into the shardings of the
*current* mesh (an abstract target built from it), so a checkpoint written
on one mesh loads on any other.

Retention keeps the newest `max_to_keep` checkpoints and, beside them, the
one saved with the lowest validation loss (`metrics`): Orbax's own
preservation policies, the best kept by its metric and never counted among
the newest (a best-only policy would evict the newest, orbax#526).

A checkpoint that cannot be restored (no commit marker, truncated or missing
files) is never deleted: training moves it to `workdir/damaged_checkpoints/`
with a warning naming its step and resumes from the newest intact one.
"""

import concurrent.futures
import contextlib
import errno
import os
import shutil
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils
from orbax.checkpoint.checkpoint_managers import preservation_policy

from meshfit import storage
from meshfit.storage import gcs
from meshfit.errors import UsageError
from meshfit.model.state import TrainState

# Orbax writes this file last, into every finished checkpoint.
COMMIT_MARKER = 'commit_success.txt'
DAMAGED_DIR = 'damaged_checkpoints'
# The metric a best checkpoint is saved with (lower is better).
BEST_METRIC = 'val_loss'


class DamagedCheckpointError(Exception):
  """A checkpoint exists but cannot be restored."""


class Checkpointer:
  """Async saving, retention and restore for one workdir's checkpoints."""

  def __init__(self, workdir: str, *, max_to_keep: int | None = None,
               read_only: bool = False):
    """Opens (and, unless read_only, creates) `workdir/checkpoints`.

    Args:
      workdir: the run's workdir.
      max_to_keep: newest checkpoints kept; older ones are deleted.
      read_only: for evaluation: never writes or deletes anything.
    """
    self.workdir = storage.absolute(workdir)
    self.directory = storage.join(self.workdir, 'checkpoints')
    self._read_only = read_only
    self._saving: int | None = None  # the step of the newest save
    keep = preservation_policy.AnyPreservationPolicy([
        preservation_policy.LatestN(max_to_keep),
        preservation_policy.BestN(
            get_metric_fn=_best_metric, reverse=True, n=1,
            keep_checkpoints_without_metrics=False)])
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            preservation_policy=keep,
            # Also makes Orbax write (and read back) a checkpoint's metrics.
            best_fn=_best_metric, best_mode='min',
            create=not read_only,
            read_only=read_only,
            enable_async_checkpointing=not read_only),
        item_names=('state', 'meta'))

  def reload(self) -> None:
    """Lists the checkpoints again: another process (a trainer) may have
    written or deleted some since this one was opened."""
    self._manager.reload()

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def is_committed(self, step: int) -> bool:
    return storage.exists(storage.join(self.directory, str(step),
                                       COMMIT_MARKER))

  def save(self, step: int, state: TrainState, meta: dict[str, Any],
           val_loss: float | None = None) -> None:
    """Starts an async save; arrays are copied off-device before it returns.

    Errors of an earlier async save are raised here, not swallowed.

    Args:
      step: the state's step.
      state: the state.
      meta: its JSON side.
      val_loss: the validation loss of `state`, when this is a best
        checkpoint (kept beside the newest ones).
    """
    self._saving = step
    self._check_room(step, state)
    with self._storage_errors('saving'):
      self._manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          meta=ocp.args.JsonSave(meta)), force=True,
          metrics=None if val_loss is None else {BEST_METRIC: val_loss})

  def _check_room(self, step: int, state: TrainState) -> None:
    """Refuses a save that the local disk has no room for, before Orbax
    starts it: a write that fails half-way ends in many of its threads'
    tracebacks. The newest checkpoint's size on disk (else the state's
    bytes) is the estimate; one process alone checks (hosts that shared
    a disk would each count the others' writes)."""
    if storage.is_remote(self.directory) or jax.process_count() > 1:
      return
    committed = [s for s in self.all_steps() if self.is_committed(s)]
    if committed:
      need = _disk_bytes(os.path.join(self.directory, str(committed[-1])))
    else:
      need = sum(getattr(x, 'nbytes', 0) for x in jax.tree.leaves(state))
    free = shutil.disk_usage(self.directory).free
    if free < need:
      raise storage.write_error(
          self.directory, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
          f'the checkpoint of step {step}',
          after=f'it needs about {need / 1e6:.1f} MB, {free / 1e6:.1f} MB '
          'are free; the checkpoints written before it are intact: train '
          'again to resume from the newest')

  def best_step(self) -> int | None:
    """The step of the best checkpoint by validation loss, if there is one."""
    steps = [s for s in self.all_steps() if self._manager.metrics(s)]
    return min(steps, key=lambda s: _best_metric(self._manager.metrics(s)),
               default=None)

  def restore_best(self, target: TrainState
                   ) -> tuple[int, TrainState, float] | None:
    """(step, state, validation loss) of the intact checkpoint of the lowest
    validation loss, or None when none is left.

    A damaged one found on the way is set aside, like any damaged
    checkpoint, and the next best is tried: a run must not end, nor every
    rerun of it, on a best step it cannot read.
    """
    while (step := self.best_step()) is not None:
      try:
        state = self.restore_state(step, target)
      except DamagedCheckpointError as e:
        logging.warning('The best checkpoint, step %d, cannot be read (%s); '
                        'setting it aside and taking the next best.', step,
                        str(e).splitlines()[0][:200])
        self.set_aside([step])
        continue
      return step, state, _best_metric(self._manager.metrics(step))
    return None

  def restore_meta(self, step: int) -> dict[str, Any]:
    """The JSON side of a checkpoint: cheap, read before the arrays."""
    self._check_committed(step)
    try:
      return self._manager.restore(step, args=ocp.args.Composite(
          meta=ocp.args.JsonRestore())).meta
    except Exception as e:  # noqa: BLE001 (any read failure means damage)
      raise DamagedCheckpointError(f'{type(e).__name__}: {e}') from e

  def restore_state(self, step: int, target: TrainState) -> TrainState:
    """Restores `step` into `target`'s shapes, dtypes and shardings."""
    self._check_committed(step)
    try:
      return self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target))).state
    except Exception as e:  # noqa: BLE001 (any read failure means damage)
      raise DamagedCheckpointError(f'{type(e).__name__}: {e}') from e

  def _check_committed(self, step: int) -> None:
    if not self.is_committed(step):
      raise DamagedCheckpointError(f'incomplete: no {COMMIT_MARKER}')

  def set_aside(self, steps: list[int]) -> None:
    """Moves damaged checkpoints out of the way, keeping their files.

    A later save of the same step would otherwise collide with them.
    """
    if self._read_only or not steps:
      return
    if jax.process_index() == 0:
      for step in steps:
        target = storage.join(self.workdir, DAMAGED_DIR, str(step))
        suffix = 1
        while storage.exists(target):
          target = storage.join(self.workdir, DAMAGED_DIR, f'{step}.{suffix}')
          suffix += 1
        # On gs:// (no rename) every object is copied and checked before
        # the originals are deleted: never lost on the way.
        storage.move(storage.join(self.directory, str(step)), target)
        logging.warning('Moved damaged checkpoint %d to %s.', step, target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices('meshfit:set_aside_checkpoints')
    self._manager.reload()

  def step_to_restore(self, step: int | None) -> int:
    """`step`, or the best (by validation) or else newest intact one,
    checked to exist (eval, predict, export)."""
    return step_to_restore(self, step)

  def wait(self) -> None:
    """Blocks until pending async saves are on disk; raises their errors."""
    with self._storage_errors('saving'):
      self._manager.wait_until_finished()
      self._manager.check_for_errors()

  @contextlib.contextmanager
  def _storage_errors(self, doing: str) -> Iterator[None]:
    """A failure of Orbax's writers that the user can fix as one
    StorageError saying what was being written: on gs:// any (TensorStore's
    retries spent), locally a full disk or no permission. The checkpoints
    already written stay."""
    try:
      yield
    except Exception as e:
      if not storage.is_remote(self.directory):
        step = f' of step {self._saving}' if self._saving is not None else ''
        error = storage.write_error(
            self.directory, e, f'the checkpoint{step}',
            after='the checkpoints written before it are intact: train '
            'again to resume from the newest')
        if error is None:
          raise
        raise error from e
      cause = e
      while cause.__cause__ is not None and not isinstance(
          cause, storage.StorageError):
        cause = cause.__cause__  # Orbax wraps what its writers raised
      why = str(gcs.translate(self.directory, cause)).removeprefix(
          f'{self.directory}: ')
      raise storage.StorageError(
          f'{self.directory}: {why[:300]} ({doing} a checkpoint); the '
          'checkpoints written before are intact: train again to resume '
          'from the newest') from e

  def close(self) -> None:
    self._manager.close()


def step_to_restore(ckpt: Any, step: int | None) -> int:
  """`step`, or the best (by validation) or else newest intact one of
  `ckpt` (a Checkpointer, or checkpoints held in memory), checked to
  exist."""
  steps = ckpt.all_steps()
  if not steps:
    raise UsageError(f'no checkpoint in {ckpt.directory}; train first '
                     '(python train.py --workdir=...)')
  if step is None:
    best = ckpt.best_step()
    if best is not None and ckpt.is_committed(best):
      return best
    intact = [s for s in steps if ckpt.is_committed(s)]
    if not intact:
      raise UsageError(f'every checkpoint in {ckpt.directory} is '
                       'incomplete; resume training to write a new one')
    return intact[-1]
  if step not in steps:
    raise UsageError(f'no checkpoint of step {step} in {ckpt.directory}; '
                     f'available steps: {", ".join(map(str, steps))}')
  return step


def _disk_bytes(directory: str) -> int:
  """The bytes a local directory's files take on disk."""
  return sum(os.lstat(os.path.join(root, f)).st_blocks * 512
             for root, _, files in os.walk(directory) for f in files)


def _best_metric(metrics: dict[str, float]) -> float:
  return metrics[BEST_METRIC]


class BackgroundSaver:
  """Writes checkpoints from a thread, so training need not wait for one.

  `submit` hands over a state that nothing else will touch (a copy) and
  returns at once while the writer is free or busy with one checkpoint: the
  new one waits its turn. Every submitted checkpoint is written, in order;
  one that comes while another is already waiting makes `submit` wait until
  the writer takes that one (so the disk sets the pace, and at most two
  copies of the state exist besides the one training).
  """

  def __init__(self, ckpt: Checkpointer):
    self._ckpt = ckpt
    self._cond = threading.Condition()
    self._waiting: tuple | None = None  # (step, state, meta, wait_for, loss)
    self._busy = False
    self._closed = False
    self._error: BaseException | None = None
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name='meshfit-checkpoints')
    self._thread.start()

  def submit(self, step: int, state: TrainState, meta: dict[str, Any],
             wait_for: Iterable[concurrent.futures.Future] = (),
             val_loss: float | None = None) -> None:
    """Queues a checkpoint of `state` (a copy the caller will not change).

    Args:
      step: the state's step.
      state: the state to save.
      meta: its JSON side.
      wait_for: what must be done before the checkpoint exists (the metric
        writes of its steps: a resumed run never logs them again).
      val_loss: its validation loss, when it is a best checkpoint.
    """
    with self._cond:
      self._raise_error()
      while self._waiting is not None and not self._closed:
        self._cond.wait()
      self._raise_error()
      self._waiting = (step, state, meta, list(wait_for), val_loss)
      self._cond.notify_all()

  def _run(self) -> None:
    while True:
      with self._cond:
        while self._waiting is None and not self._closed:
          self._cond.wait()
        if self._waiting is None:
          return
        step, state, meta, wait_for, val_loss = self._waiting
        self._waiting = None
        self._busy = True
        self._cond.notify_all()
      try:
        for future in wait_for:
          future.result()
        self._ckpt.save(step, state, meta, val_loss)
        self._ckpt.wait()
      except BaseException as e:  # noqa: BLE001 (raised in the loop's thread)
        with self._cond:
          self._error = self._error or e
      finally:
        del state
        with self._cond:
          self._busy = False
          self._cond.notify_all()

  def _raise_error(self) -> None:
    if self._error is not None:
      error, self._error = self._error, None
      raise error

  def wait(self) -> None:
    """Blocks until every submitted checkpoint is written; raises errors."""
    with self._cond:
      while self._waiting is not None or self._busy:
        self._cond.wait()
      self._raise_error()

  def close(self, wait: bool = True) -> None:
    """Writes what is waiting, then stops the thread; without `wait`, does
    not wait for it (a save that cannot reach its storage would hold the
    run for its retries)."""
    with self._cond:
      self._closed = True
      self._cond.notify_all()
    if wait:
      self._thread.join()
