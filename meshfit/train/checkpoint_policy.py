"""Which checkpoints the training loop writes, and how.

Every checkpoint the config asks for is written: one every
`checkpoint_every_steps` steps, and one whenever `checkpoint_every_seconds`
of training have passed since the last, so that a run killed at any moment
loses at most that much work whatever its speed. Both are decided at the
end of a call, the same on every host. With validation, the state of each
new best validation loss is kept (a device copy) and written, with that
loss, before the next checkpoint of a later step, so that retention keeps it
beside the newest ones (checkpointer.Checkpointer) and every checkpoint on
disk has its best on disk too, at the cost of no extra writes.

With one process, a periodic checkpoint copies the state on device (the next
call consumes the original) and, once the losses up to it are known to be
finite, hands the copy to a thread that writes it: the loop does not wait
for the disk unless checkpoints come faster than it takes them (see
checkpointer.BackgroundSaver). Several processes must write the same
checkpoints in step, so they save each one from the loop.
"""

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from meshfit import storage
from meshfit.checkpoints import checkpointer
from meshfit.model import state as state_lib
from meshfit.parallel import programs
from meshfit.report.writers import AsyncWriter
from meshfit.train.loss_watch import LossWatch


def _copy_state(state):
  return jax.tree.map(jnp.copy, state)


@programs.memoize
def _jit_copy(shardings):
  """A copy of the train state in its shardings (a best step's, kept while
  training goes on), jitted once per set-up."""
  return jax.jit(_copy_state, out_shardings=shardings)


class LoopCheckpoints:
  """The loop's checkpoints: periodic ones in the background, others now."""

  def __init__(self, ckpt: checkpointer.Checkpointer, watch: LossWatch,
               writer: AsyncWriter, shardings: state_lib.TrainState,
               meta: Callable[[], dict], every_steps: int,
               every_seconds: float):
    """Args:
      ckpt: the workdir's checkpointer.
      watch: the loop's loss watch: a state is saved only once its losses
        are known finite.
      writer: the loop's metrics writer: a checkpoint exists only once the
        logs of its steps are written (a resumed run never logs them again).
      shardings: the train state's shardings (of the device copy).
      meta: the JSON side of a checkpoint made now (input position, ...).
      every_steps: a checkpoint at every multiple of this step; 0: none.
      every_seconds: a checkpoint once this much time has passed since the
        last one (or the start); 0: none.
    """
    self._ckpt, self._watch, self._writer, self._meta = (ckpt, watch, writer,
                                                         meta)
    self._every_steps, self._every_seconds = every_steps, every_seconds
    self._saver = (checkpointer.BackgroundSaver(ckpt)
                   if jax.process_count() == 1 else None)
    self._copy = _jit_copy(shardings)
    self._last = time.monotonic()
    # (step, state copy, meta, validation loss) of a best not yet written.
    self._best: tuple | None = None

  def due(self, step: int) -> bool:
    """Whether the config asks for a checkpoint at `step` (a call's end).

    Called after every call, on every host: the time-based decision is
    process 0's, so that every host saves the same steps.
    """
    if self._every_steps and step % self._every_steps == 0:
      return True
    if not self._every_seconds:
      return False
    due = time.monotonic() - self._last >= self._every_seconds
    if jax.process_count() > 1:
      due = bool(multihost_utils.broadcast_one_to_all(np.bool_(due)))
    return due

  def note_best(self, step: int, state: state_lib.TrainState,
                val_loss: float) -> state_lib.TrainState:
    """Keeps the best state so far, to be written before the next save.

    Returns:
      The device copy kept (the caller may evaluate it later).
    """
    copy = self._copy(state)
    self._best = (step, copy, self._meta(), val_loss)
    return copy

  def _write_best(self) -> int | None:
    """Writes the best kept, if any not yet written; returns its step."""
    if self._best is None:
      return None
    step, copy, meta, val_loss = self._best
    self._best = None
    if self._saver is None:
      self._watch.drain()
      self._ckpt.save(step, copy, meta, val_loss)
    else:
      self._watch.once_checked(lambda: self._saver.submit(
          step, copy, meta, self._writer.pending(), val_loss))
    return step

  def save_periodic(self, step: int, state: state_lib.TrainState) -> None:
    """A checkpoint of `state` (the last call's result) at `step`."""
    self._last = time.monotonic()
    if self._write_best() == step:
      return  # the best is this step's state, saved already
    if self._saver is None:
      self.save_now(step, state)
      return
    copy, meta = self._copy(state), self._meta()
    self._watch.once_checked(lambda: self._saver.submit(
        step, copy, meta, self._writer.pending()))

  def save_now(self, step: int, state: state_lib.TrainState) -> None:
    """Starts saving `state` (unless `step` is saved already).

    Every dispatched call is checked first: that also hands any periodic
    checkpoint waiting on those checks to the background writer.
    """
    self._last = time.monotonic()
    best = self._write_best()
    self._watch.drain()  # never save a state whose loss was not checked
    self._writer.flush()  # nor one whose logs could be lost to a crash
    if self._saver is not None:
      self._saver.wait()
    if step != best and step not in self._ckpt.all_steps():
      self._ckpt.save(step, state, self._meta())

  def wait(self) -> None:
    """Every checkpoint started so far is on disk; raises their errors."""
    if self._saver is not None:
      self._saver.wait()
    self._ckpt.wait()

  def close(self, wait: bool = True) -> None:
    """Stops the background saver; `wait=False` leaves a save in flight
    to finish (or fail) on its own: storage out of reach."""
    if self._saver is not None:
      self._saver.close(wait)

  def __enter__(self) -> 'LoopCheckpoints':
    return self

  def __exit__(self, kind, error, traceback) -> None:
    # With storage out of reach what is in flight cannot be written: it is
    # not waited on.
    self.close(wait=not isinstance(error, storage.StorageError))
