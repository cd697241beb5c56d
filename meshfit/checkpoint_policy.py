"""Which checkpoints the training loop writes, and how.

With one process, a periodic checkpoint copies the state on device (the next
call consumes the original) and, once the losses up to it are known to be
finite, hands the copy to a thread that writes it: the loop never waits for
the disk, and a save that comes while the previous is still being written
replaces any older one still waiting (see checkpointing.BackgroundSaver).
Several processes must write the same checkpoints in step, so they save
each one from the loop.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from absl import logging

from meshfit import checkpointing, state as state_lib
from meshfit.loss_watch import LossWatch
from meshfit.writers import AsyncWriter


class LoopCheckpoints:
  """The loop's checkpoints: periodic ones in the background, others now."""

  def __init__(self, ckpt: checkpointing.Checkpointer, watch: LossWatch,
               writer: AsyncWriter, shardings: state_lib.TrainState,
               meta: Callable[[], dict], budget: float):
    """Args:
      ckpt: the workdir's checkpointer.
      watch: the loop's loss watch: a state is saved only once its losses
        are known finite.
      writer: the loop's metrics writer: a checkpoint exists only once the
        logs of its steps are written (a resumed run never logs them again).
      shardings: the train state's shardings (of the device copy).
      meta: the JSON side of a checkpoint made now (input position, ...).
      budget: the most of the time periodic checkpoints may take.
    """
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

  def would_write(self, step: int) -> bool:
    """Whether a periodic checkpoint due at `step` would be written now.

    Asked, in the loop's thread, when the call that holds `step` is
    planned: a step the saver will not take (still writing, over its
    budget, or one already on its way to it) need not end a call; it is
    counted as skipped here.
    """
    if self._handing == 0 and self._saver.ready():
      return True
    self._saver.skipped.append(step)
    return False

  def save_periodic(self, step: int, state: state_lib.TrainState) -> None:
    """A periodic checkpoint of `state` (the last call's result) at `step`."""
    if self._saver is None:
      self.save_now(step, state)
      return
    if not self._saver.ready():  # still writing, or over its time budget
      self._saver.skipped.append(step)
      return
    copy, meta = self._copy(state), self._meta()
    self._handing += 1

    def hand_over():
      self._handing -= 1
      self._saver.submit(step, copy, meta, self._writer.pending())
    self._watch.once_checked(hand_over)

  def save_now(self, step: int, state: state_lib.TrainState) -> None:
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
