"""Checkpoints kept in memory, for a run that lives in a temporary workdir.

A `meshfit.fit` without a workdir trains in a temporary directory that no
later process can resume from, and its model is used from the same process:
writing each checkpoint through Orbax there costs a small table's refit a
third of its time and buys nothing. `HeldCheckpoints` stands in for the
run's `Checkpointer`: a save keeps the state's device arrays (the loop hands
over copies it will not touch again, or its final state), retention keeps
the same steps Orbax would, and `write` puts them on disk, as the loop would
have, once the run must be read from its directory (save, evaluate,
export, pickling).
"""

import threading
from typing import Any

import jax

from meshfit.checkpoints import checkpointer
from meshfit.model.state import TrainState


class HeldCheckpoints:
  """The parts of `checkpointer.Checkpointer` the training loop and
  `reading.SavedModel` use, over checkpoints held in memory."""

  def __init__(self, workdir: str):
    """Args:
      workdir: the run's (temporary) workdir, where `write` puts them.
    """
    self.workdir = workdir
    self.directory = f'{workdir} (checkpoints held in memory)'
    self._max_to_keep: int | None = None
    self._lock = threading.Lock()
    # step -> (state, meta, validation loss or None)
    self._held: dict[int, tuple[TrainState, dict[str, Any],
                                float | None]] = {}

  def keeping(self, max_to_keep: int | None) -> 'HeldCheckpoints':
    """Sets the retention (max_checkpoints_to_keep); returns self."""
    self._max_to_keep = max_to_keep
    return self

  def save(self, step: int, state: TrainState, meta: dict[str, Any],
           val_loss: float | None = None) -> None:
    with self._lock:
      self._held[step] = (state, meta, val_loss)
      self._retain()

  def _retain(self) -> None:
    """Orbax's retention (`Checkpointer`): the newest max_to_keep and the
    one of the lowest validation loss."""
    steps = sorted(self._held)
    keep = set(steps if self._max_to_keep is None
               else steps[-self._max_to_keep:])
    best = self._best_step()
    if best is not None:
      keep.add(best)
    for step in steps:
      if step not in keep:
        del self._held[step]

  def _best_step(self) -> int | None:
    scored = [s for s, (_, _, loss) in self._held.items() if loss is not None]
    return min(scored, key=lambda s: self._held[s][2], default=None)

  def all_steps(self) -> list[int]:
    with self._lock:
      return sorted(self._held)

  def is_committed(self, step: int) -> bool:
    with self._lock:
      return step in self._held

  def best_step(self) -> int | None:
    with self._lock:
      return self._best_step()

  def restore_best(self, target: TrainState
                   ) -> tuple[int, TrainState, float] | None:
    with self._lock:
      step = self._best_step()
      if step is None:
        return None
      loss = self._held[step][2]
    return step, self.restore_state(step, target), loss

  def restore_meta(self, step: int) -> dict[str, Any]:
    with self._lock:
      if step not in self._held:
        raise checkpointer.DamagedCheckpointError('not held')
      return self._held[step][1]

  def restore_state(self, step: int, target: TrainState) -> TrainState:
    """The held state, moved to `target`'s shardings where they differ."""
    with self._lock:
      if step not in self._held:
        raise checkpointer.DamagedCheckpointError('not held')
      state = self._held[step][0]
    return jax.tree.map(
        lambda a, t: a if a.sharding == t.sharding else jax.device_put(
            a, t.sharding), state, target)

  def set_aside(self, steps: list[int]) -> None:
    """Drops them: a temporary run is never resumed."""
    with self._lock:
      for step in steps:
        self._held.pop(step, None)

  def step_to_restore(self, step: int | None) -> int:
    return checkpointer.step_to_restore(self, step)

  def reload(self) -> None:
    pass

  def wait(self) -> None:
    pass

  def close(self) -> None:
    pass

  def write(self) -> None:
    """Writes every held checkpoint into workdir/checkpoints, in step
    order and with the same retention, as the run's own Checkpointer
    would have; then holds none."""
    with self._lock:
      held = sorted(self._held.items())
    ckpt = checkpointer.Checkpointer(self.workdir,
                                     max_to_keep=self._max_to_keep)
    try:
      for step, (state, meta, val_loss) in held:
        ckpt.save(step, state, meta, val_loss)
        ckpt.wait()
    finally:
      ckpt.close()
    with self._lock:
      self._held.clear()
