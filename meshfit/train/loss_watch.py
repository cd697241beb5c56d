"""Every training loss checked as it lands; nothing acts on an unchecked one.

A call's losses are read once a later call has been dispatched (or at a
drain), so the host never waits for the device just to check them, and the
calls in flight stay within `in_flight.MAX_IN_FLIGHT`. What must not happen
before a call's losses are known to be finite (its train-metrics log, a
checkpoint of its state) is attached to it with `once_checked`.

An ensemble's members are checked one by one: a member whose loss turns
non-finite (a learning rate too high for it, in a sweep) is reported once
and left out of the ensemble's predictions (`meshfit/model/uncertainty.py`) while
the others train on; the run stops only when every member has diverged.
"""

from collections.abc import Callable

import jax
import numpy as np

from meshfit import storage
from meshfit.parallel.in_flight import InFlight


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
      path = storage.join(workdir, 'checkpoints', str(self.last_good))
      where = (f'the last good checkpoint is step {self.last_good} ({path}), '
               'left untouched')
    return (f'{self}: training stopped; {where}. Lower '
            'optimizer.learning_rate or set optimizer.grad_clip_norm')


class LossWatch:
  """Bounds the calls in flight and stops once no member's loss is finite."""

  def __init__(self, on_diverged: Callable[[int, int, float], None]
               = lambda member, step, value: None):
    """Args:
      on_diverged: called with (member, step, loss) the first time a
        member's loss is not finite while others' still are.
    """
    # (first step, steps, losses_KxM, actions) of each dispatched call.
    self._calls = InFlight()
    self._on_diverged = on_diverged
    self.diverged: dict[int, int] = {}  # member -> its first bad step

  def add(self, first_step: int, num_steps: int,
          losses_KxM: jax.Array) -> None:
    """Records a dispatched call of steps first_step..+num_steps-1."""
    self._calls.add((first_step, num_steps, losses_KxM, []))

  def once_checked(self, action: Callable[[], None]) -> None:
    """Runs `action` once the last added call's losses are known finite (at
    once if every call dispatched so far has been checked)."""
    if self._calls.pending:
      self._calls.newest[3].append(action)
    else:
      action()

  def settle(self) -> None:
    """Checks the oldest calls until at most MAX_IN_FLIGHT are unread."""
    for call in self._calls.excess():
      self._check(*call)

  def drain(self) -> None:
    """Waits for every dispatched call; call before saving or evaluating."""
    for call in self._calls.drain():
      self._check(*call)

  def _check(self, first_step: int, num_steps: int, losses_KxM: jax.Array,
             actions: list[Callable[[], None]]) -> None:
    losses = np.asarray(losses_KxM)[:num_steps].reshape(num_steps, -1)
    finite = np.isfinite(losses)
    none_left = np.flatnonzero(~finite.any(axis=1))
    if none_left.size:
      k = int(none_left[0])
      raise NonFiniteLossError(first_step + k, float(losses[k][0]))
    for member in np.flatnonzero(~finite.all(axis=0)):
      if int(member) not in self.diverged:
        k = int(np.argmin(finite[:, member]))
        self.diverged[int(member)] = first_step + k
        self._on_diverged(int(member), first_step + k,
                          float(losses[k, member]))
    for action in actions:
      action()
