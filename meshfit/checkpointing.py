"""Orbax checkpoints of the whole train state plus the input position.

Layout: `workdir/checkpoints/<step>/{state,data}`. `state` is the TrainState
(every leaf a global jax.Array); `data` is JSON with the loader position.
Restores go into the shardings of the *current* mesh (an abstract target
built from it), so a checkpoint written on one mesh loads on any other.
"""

import os
from typing import Any

import orbax.checkpoint as ocp

from meshfit.errors import UsageError
from meshfit.state import TrainState


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
    self.directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            create=not read_only,
            read_only=read_only,
            enable_async_checkpointing=not read_only),
        item_names=('state', 'data'))

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: TrainState, data: dict[str, Any]) -> None:
    """Starts an async save; arrays are copied off-device before it returns."""
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave(data)), force=True)

  def restore(self, step: int,
              target: TrainState) -> tuple[TrainState, dict[str, Any]]:
    """Restores `step` into `target`'s shapes, dtypes and shardings."""
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target),
        data=ocp.args.JsonRestore()))
    return restored.state, restored.data

  def step_to_restore(self, step: int | None) -> int:
    """`step`, or the newest, checked to exist (for eval and predict)."""
    steps = self.all_steps()
    if not steps:
      raise UsageError(f'no checkpoint in {self.directory}; train first '
                       '(python train.py --workdir=...)')
    if step is None:
      return steps[-1]
    if step not in steps:
      raise UsageError(f'no checkpoint of step {step} in {self.directory}; '
                       f'available steps: {", ".join(map(str, steps))}')
    return step

  def wait(self) -> None:
    """Blocks until pending async saves are on disk; raises their errors."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()
