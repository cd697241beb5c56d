"""Steps per second and time left, logged as training goes.

What `clu.periodic_actions.ReportProgress` does for the training loop, without
its import of `clu.metric_writers`, which imports TensorFlow (seconds of every
start) for a TF summary writer that meshfit does not use.
"""

import contextlib
import time
from collections.abc import Iterator

from absl import logging

from meshfit import metrics


def _format_secs(secs: float) -> str:
  """123456.7 -> '1d10h17m', as CLU writes durations."""
  days, secs = divmod(int(secs), 24 * 3600)
  hours, secs = divmod(secs, 3600)
  return (f'{days}d' if days else '') + (f'{hours}h' if hours else '') + (
      f'{secs // 60}m')


class ReportProgress:
  """Logs steps/s, progress and ETA, and writes `steps_per_sec` and `uptime`.

  A drop-in for the part of CLU's ReportProgress that the loop uses: call it
  after every step; it reports every `every_steps` steps, at the last step,
  and when `every_secs` have passed. The first call only starts the clock.
  """

  def __init__(self, *, num_train_steps: int,
               writer: metrics.ScalarWriter | None = None,
               every_steps: int | None = None,
               every_secs: float | None = 60.0):
    """Starts the uptime clock.

    Args:
      num_train_steps: the last step; always reported.
      writer: gets `steps_per_sec` and `uptime` (seconds) at each report.
      every_steps: report at steps divisible by this.
      every_secs: also report when this long has passed since the last one.
    """
    self._num_train_steps = num_train_steps
    self._writer = writer
    self._every_steps = every_steps
    self._every_secs = every_secs
    self._start = time.monotonic()
    self._previous: tuple[int, float] | None = None  # (step, time)
    self._time_per_part: dict[str, float] = {}

  def _due(self, step: int, now: float) -> bool:
    previous_step, previous_time = self._previous
    return step != previous_step and (
        step == self._num_train_steps
        or (self._every_steps is not None and step % self._every_steps == 0)
        or (self._every_secs is not None
            and now - previous_time > self._every_secs))

  def __call__(self, step: int) -> bool:
    """Reports if `step` is due.

    Args:
      step: the step just dispatched.

    Returns:
      Whether a report was made.
    """
    now = time.monotonic()
    if self._previous is None:
      self._previous = (step, now)
      return False
    if not self._due(step, now):
      return False
    previous_step, previous_time = self._previous
    steps_per_sec = (step - previous_step) / max(now - previous_time, 1e-9)
    eta = (self._num_train_steps - step) / steps_per_sec
    message = (f'{steps_per_sec:.1f} steps/s, '
               f'{100 * step / self._num_train_steps:.1f}% '
               f'({step}/{self._num_train_steps}), ETA: {_format_secs(eta)}')
    uptime = now - self._start
    if self._time_per_part:
      parts = ', '.join(f'{100 * dt / uptime:.1f}% {name}'
                        for name, dt in sorted(self._time_per_part.items()))
      message += f' ({_format_secs(uptime)} : {parts})'
    logging.info('%s', message)
    if self._writer is not None:
      self._writer.write_scalars(step, {'steps_per_sec': steps_per_sec,
                                        'uptime': uptime})
    self._previous = (step, now)
    return True

  @contextlib.contextmanager
  def timed(self, name: str) -> Iterator[None]:
    """Counts the wall time of the block as part `name` of the run.

    Unlike CLU's, this does not wait for dispatched JAX work: the loop has
    already waited for its steps, and an evaluation fetches its results.

    Args:
      name: the part, shown with its share of the run in each report.
    """
    start = time.monotonic()
    try:
      yield
    finally:
      self._time_per_part[name] = (self._time_per_part.get(name, 0.0)
                                   + time.monotonic() - start)
