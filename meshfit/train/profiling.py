"""A `jax.profiler` trace of a window of training steps."""

import shutil
import tempfile

import jax
from absl import logging

from meshfit import storage
from meshfit.train.loss_watch import LossWatch


class ProfileWindow:
  """Traces steps first_step..+num_steps-1 into workdir/profile.

  The profiler writes local files only; with a gs:// workdir the trace is
  written to a local temporary directory and uploaded when it stops.

  Open the trace with TensorBoard's profile plugin or Perfetto. Both ends of
  the window end a call (`stops`), so the trace holds exactly those steps'
  calls.
  """

  def __init__(self, first_step: int, num_steps: int, workdir: str):
    """Args:
      first_step: the first traced step; 0 traces nothing.
      num_steps: how many steps to trace.
      workdir: the run's workdir.
    """
    self._first = first_step
    self._last = first_step + num_steps - 1
    self._target = storage.join(workdir, 'profile')
    self._dir = self._target
    self._active = False
    # Steps at which a call must end for the trace to hold the window.
    self.stops = (self._first - 1, self._last) if self._first > 0 else ()

  def before(self, done: int) -> None:
    """Starts the trace if the next call, after step `done`, begins it."""
    if self._first > 0 and done == self._first - 1 and not self._active:
      if storage.is_remote(self._target):
        self._dir = tempfile.mkdtemp(prefix='meshfit-profile-')
      jax.profiler.start_trace(self._dir)
      self._active = True
      logging.info('Tracing steps %d..%d into %s.', self._first, self._last,
                   self._target)

  def after(self, step: int, watch: LossWatch) -> None:
    """Stops the trace once the window's last call has finished."""
    if self._active and step >= self._last:
      watch.drain()
      self.close()

  def close(self) -> None:
    if self._active:
      jax.profiler.stop_trace()
      self._active = False
      if self._dir != self._target:
        storage.copytree(self._dir, self._target)
        shutil.rmtree(self._dir)
        self._dir = self._target
