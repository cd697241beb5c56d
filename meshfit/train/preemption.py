"""SIGTERM handling: finish the step, save it, exit 143, resume later.

TPU VMs get SIGTERM before maintenance or preemption. Where the JAX
coordination service runs (jax.distributed is initialised), its preemption
sync point makes every host stop at the same step; without it (one host),
a Python signal handler sets a flag that the loop reads after each call.
"""

import signal
import threading

from jax._src import distributed
from jax.experimental import multihost_utils

EXIT_CODE = 143  # 128 + SIGTERM, what schedulers expect


class Preempted(Exception):
  """Training stopped for SIGTERM after saving a checkpoint."""

  def __init__(self, step: int):
    super().__init__(f'stopped by SIGTERM after saving the checkpoint of '
                     f'step {step}; run the same command again to resume')
    self.step = step


class PreemptionWatch:
  """Says, once per train call, whether training must stop and save now."""

  def __init__(self):
    self._service = (distributed.global_state.client is not None and
                     distributed.global_state.preemption_sync_manager
                     is not None)
    self._received = threading.Event()
    self._previous = None
    if not self._service and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

  def _on_sigterm(self, signum, frame):  # noqa: ARG002
    self._received.set()

  @property
  def received(self) -> bool:
    """A SIGTERM arrived (single-host mode; the service tracks its own)."""
    return self._received.is_set()

  def should_stop(self, call_index: int) -> bool:
    """Whether to save and stop now.

    Call after every train call, on every host, with the call's index
    (0, 1, 2, ... from the start of this process): the coordination service
    makes every host stop after the same call.
    """
    if self._service:
      return multihost_utils.reached_preemption_sync_point(call_index)
    return self._received.is_set()

  def close(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
