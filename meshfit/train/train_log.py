"""The train scalars logged every `log_every_steps`: the loss and gradient
norm of the call's steps, the learning rate, and the speed of training
alone (evaluations left out)."""

import functools
import time

import jax
import optax

from meshfit.model import metrics
from meshfit.report import writers


def log_train(writer: writers.AsyncWriter, speed: 'StepsPerSecond',
              train_metrics: metrics.TrainMetrics,
              schedule: optax.Schedule | None, step: int) -> None:
  """Queues the train scalars of `step` (its call's losses are checked)."""
  rate = speed(step)  # measured now that the call is known to be done
  writer.write_scalars(step, functools.partial(
      train_scalars, train_metrics, schedule, step, rate))


def train_scalars(train_metrics: metrics.TrainMetrics,
                  schedule: optax.Schedule | None, step: int,
                  steps_per_sec: float) -> dict[str, float]:
  """The train scalars logged at `step` (from its call's metrics copy)."""
  summary = jax.device_get(train_metrics).compute()
  scalars = {'train/loss': summary['loss'],
             'train/grad_norm': summary['grad_norm'],
             'train/steps_per_sec': steps_per_sec}
  if schedule is not None:
    scalars['train/learning_rate'] = schedule(step - 1)
  return scalars


class StepsPerSecond:
  """Training speed over a logging window; evaluations are left out.

  Read when a call's losses have been checked, so the window's time is that
  of finished calls, not of dispatches (which run ahead of the device).
  """

  def __init__(self, step: int):
    self._step, self._time = step, time.perf_counter()

  def pause(self) -> None:
    """Restarts the clock: what happened since the last step is not training."""
    self._time = time.perf_counter()

  def __call__(self, step: int) -> float:
    now = time.perf_counter()
    rate = (step - self._step) / max(now - self._time, 1e-9)
    self._step, self._time = step, now
    return rate
