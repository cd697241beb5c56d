"""The progress display: where a run is, how long it has left, and whether
the model still improves, on the console of process 0.

On a terminal it is one line redrawn in place (a few times a second at
most, by a thread of its own, so the clock moves between writes); anywhere
else (a file, a pipe, CI) one plain line per evaluation, which a log keeps
readable. It is a ScalarWriter: it sees the scalars the loop writes anyway
(`train/loss` at log steps, `val/*` and `eval/*` at evaluations), in the
AsyncWriter's thread, so it never slows the loop.
"""

import dataclasses
import logging
import math
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TextIO

from meshfit.report import writers

REDRAW_SECONDS = 0.25  # a terminal's line is redrawn at most this often
# A log record clears the line; it is redrawn no sooner than this after, so
# that the record is printed first.
AFTER_RECORD_SECONDS = 0.1
# Evaluations in a row without a better validation loss that earn a line
# (early stopping, when set sooner, says so itself).
STALL_EVALS = 10
# A run whose best validation step falls in this last fraction of its steps
# was still improving when it ended: the display says a longer run may help
# (docs/tables.md has what twice the length bought such tables).
LATE_BEST_FRACTION = 0.1
_CLEAR_LINE = '\r\x1b[K'
# A notebook's line is as wide as this (it has no terminal size).
NOTEBOOK_COLUMNS = 120


class Validated(Protocol):
  """The validation so far, as meshfit/train/validation.py's BestTracker
  keeps it."""
  patience: int
  best_step: int
  best_loss: float
  evals_since_best: int


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the loop knows of a run before its first step.

  Attributes:
    first_step: the step training starts from (a resumed run's checkpoint).
    last_step: the step it trains to.
    steps_per_epoch: steps of an epoch of a member's training rows (as
      meshfit/config/sizing.py counts them: its `train_epochs` read back).
    patience: config.early_stopping_evals (0: no early stopping).
    best_step: the best validation step so far (0: none; a resumed run's).
    best_loss: its validation loss.
    evals_since_best: evaluations since then.
  """
  first_step: int
  last_step: int
  steps_per_epoch: int
  patience: int = 0
  best_step: int = 0
  best_loss: float = math.inf
  evals_since_best: int = 0

  @classmethod
  def of(cls, first_step: int, last_step: int, steps_per_epoch: int,
         validated: Validated) -> 'Plan':
    """The plan of a run whose validation so far is `validated`."""
    return cls(first_step, last_step, steps_per_epoch, validated.patience,
               validated.best_step, validated.best_loss,
               validated.evals_since_best)


@dataclasses.dataclass(frozen=True)
class Console:
  """What the console shows of the scalars a run writes.

  Attributes:
    progress: process 0's progress display (what train.py shows).
    log_scalars: every write as an INFO line, on every process (train.py
      --verbose; what callers of `train_and_evaluate` get by default).
  """
  progress: bool = False
  log_scalars: bool = True

  def writer(self, is_main: bool, plan: Plan) -> writers.ScalarWriter | None:
    """The console's writer for this process (None: it shows nothing)."""
    shown: list[writers.ScalarWriter] = []
    if self.log_scalars:
      shown.append(writers.LoggingWriter())
    if self.progress and is_main:
      shown.append(Progress(plan))
    return writers.MultiWriter(shown) if shown else None


class Progress(writers.ScalarWriter):
  """The display: a line in place on a terminal, else a line an evaluation.

  The time left is measured from the steps finished since the second step
  it was written at (the first includes compiling the train and eval
  steps), evaluations included, as the rest of the run will spend it.
  """

  def __init__(self, plan: Plan, stream: TextIO | None = None,
               live: bool | None = None,
               clock: Callable[[], float] = time.monotonic):
    """Starts the display (on a terminal, its redrawing thread too).

    Args:
      plan: the run, as the loop knows it.
      stream: where to print (default: stdout).
      live: redraw a line in place (default: whether `stream` is a
        terminal).
      clock: seconds, for the elapsed time and the time left.
    """
    self._plan, self._clock = plan, clock
    self._stream = sys.stdout if stream is None else stream
    # A notebook's output area redraws a line after a carriage return too,
    # but shows other escape sequences as they are.
    self._notebook = _is_notebook(self._stream)
    self._live = (_is_terminal(self._stream) or self._notebook
                  if live is None else live)
    self._erase = '\r' if self._notebook else _CLEAR_LINE
    # Reentrant: a record logged while the display holds it (by a stream's
    # own warning, say) passes through _ClearLine in the same thread.
    self._lock = threading.RLock()
    self._start = clock()
    self._step = plan.first_step
    self._train_loss: float | None = None
    self._val_loss: float | None = None
    self._rmse: dict[str, float] = {}  # '' overall, then each target's
    self._rmse_step = None
    self._best_step, self._best_loss = plan.best_step, plan.best_loss
    self._evals_since_best = plan.evals_since_best
    self._last_write: tuple[int, float] | None = None  # (step, time)
    self._since: tuple[int, float] | None = None  # speed measured from
    self._shown = ''  # the line on screen now ('' none)
    self._hold_until = -math.inf
    self._closed = threading.Event()
    self._thread = None
    if self._live:
      self._guard = _ClearLine(self)
      for handler in _console_handlers():
        handler.addFilter(self._guard)
      self._thread = threading.Thread(target=self._redraw_loop, daemon=True,
                                      name='meshfit-progress')
      self._thread.start()

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    with self._lock:
      now = self._clock()
      if (self._since is None and self._last_write is not None
          and step > self._last_write[0]):
        self._since = self._last_write
      self._last_write, self._step = (step, now), step
      if 'train/loss' in scalars:
        self._train_loss = float(scalars['train/loss'])
      if 'eval/rmse' in scalars:
        self._rmse = {'': float(scalars['eval/rmse'])}
        targets = _per_target(scalars, 'eval/rmse')
        if len(targets) > 1:
          self._rmse.update(targets)
        self._rmse_step = step
      notice = None
      if 'val/loss' in scalars:
        self._val_loss = float(scalars['val/loss'])
        notice = self._validated(step, self._val_loss)
      evaluated = any(k.startswith(('val/', 'eval/')) for k in scalars)
      if ('eval/rmse' in scalars and 'val/loss' not in scalars
          and self._val_loss is not None):
        # The eval file scored once, for the final model (the run's
        # `eval_during_training` off): a line of its own, not a repeat.
        self._print(self._final_line())
      elif evaluated and not self._live:
        self._print(self.line(now))
      if notice:
        self._print(notice)

  def line(self, now: float | None = None, width: int | None = None) -> str:
    """What the display says now: step, epochs, times, losses.

    Args:
      now: the clock's time (default: now).
      width: the most characters: parts are left out, the eval rmse first,
        then the train loss, then the validation loss, to fit.
    """
    now = self._clock() if now is None else now
    plan, step = self._plan, self._step
    epochs = step / max(plan.steps_per_epoch, 1)
    where = (f'step {step:>{len(str(plan.last_step))}}/{plan.last_step} '
             f'({epochs:.{1 if epochs >= 1 else 2}f} epochs), '
             f'{_duration(now - self._start)} elapsed, '
             f'{_duration(self._left(now))} left')
    train = val = rmse = None
    if self._train_loss is not None:
      train = f'train loss {self._train_loss:.4g}'
    if self._val_loss is not None:
      val = f'val loss {self._val_loss:.4g} (best step {self._best_step})'
    if self._rmse and (self._live or self._rmse_step == step):
      rmse = f'eval rmse {self._rmse[""]:.5g}'
      if len(self._rmse) > 1:
        rmse += ' (' + ', '.join(
            f'{t} {v:.5g}' for t, v in self._rmse.items() if t) + ')'
    for values in ((train, val, rmse), (train, val), (val,), (train,), ()):
      shown = [v for v in values if v]
      text = where + (': ' + ', '.join(shown) if shown else '')
      if width is None or len(text) <= width:
        return text
    return text[:width]

  def _final_line(self) -> str:
    """The eval file's score of the model eval and predict use."""
    rmse = f'{self._rmse[""]:.5g}'
    if len(self._rmse) > 1:
      rmse += ' (' + ', '.join(
          f'{t} {v:.5g}' for t, v in self._rmse.items() if t) + ')'
    return f'The final model on the eval file: rmse {rmse}.'

  def _left(self, now: float) -> float | None:
    """Seconds to the last step at the speed measured so far."""
    if self._since is None or self._last_write is None:
      return None
    (step0, time0), (step, written) = self._since, self._last_write
    if step <= step0:
      return None
    left = (self._plan.last_step - step) * (written - time0) / (step - step0)
    return max(left - (now - written), 0.0)  # counting down between writes

  def _validated(self, step: int, loss: float) -> str | None:
    """Updates the best step as validation.BestTracker does; a line to
    print when the model has stopped improving, or was still improving
    when the run ended."""
    improved = loss < self._best_loss
    if improved:
      self._best_step, self._best_loss = step, loss
      self._evals_since_best = 0
    else:
      self._evals_since_best += 1
    since = self._evals_since_best
    patience, last = self._plan.patience, self._plan.last_step
    found = f'best {self._best_loss:.4g} at step {self._best_step}'
    if step >= last and self._best_step > (1 - LATE_BEST_FRACTION) * last:
      return (f'The validation loss was still improving at the end ({found} '
              f'of {last}): a longer run (--config.train_epochs, or '
              f'num_train_steps) may lower it.')
    if improved:
      return None
    if patience and since == patience and step < last:
      return (f'Early stopping at step {step}: the validation loss has not '
              f'improved for {since} evaluations ({found}).')
    if since == STALL_EVALS and not 0 < patience <= STALL_EVALS:
      then = (f'early stopping after {patience}' if patience else
              f'training goes on to step {last}')
      return (f'The validation loss has not improved for {since} '
              f'evaluations ({found}); {then}.')
    return None

  def _print(self, text: str) -> None:
    """A line of its own (on a terminal, above the progress line)."""
    self._write((self._erase if self._shown else '') + text + '\n')
    self._shown = ''

  def _write(self, text: str) -> None:
    try:
      self._stream.write(text)
      self._stream.flush()
    except (OSError, ValueError):
      # A console gone (a closed pipe, `| head`) must not stop training:
      # the run's records are in metrics.jsonl.
      pass

  def redraw(self) -> None:
    """Redraws the terminal's line if it changed (its thread calls this a
    few times a second)."""
    with self._lock:
      self._draw(force=False)

  def _draw(self, force: bool) -> None:
    """Redraws the terminal's line if it changed (and is due)."""
    now = self._clock()
    if not force and now < self._hold_until:
      return
    if self._last_write is None:
      return  # nothing trained yet: no line
    # The last column left free: a terminal wraps a line that fills it.
    width = (NOTEBOOK_COLUMNS if self._notebook else
             max(shutil.get_terminal_size().columns - 1, 20))
    text = self.line(now, width)
    if force or text != self._shown:
      # A terminal keeps the end of a longer line unless told to clear it.
      self._write('\r' + text + ('' if self._notebook else '\x1b[K'))
      self._shown = text

  def _redraw_loop(self) -> None:
    while not self._closed.wait(REDRAW_SECONDS):
      self.redraw()

  def clear(self) -> None:
    """Takes the line off the screen (a log record is about to print)."""
    with self._lock:
      if self._shown:
        self._write(self._erase)
        self._shown = ''
      self._hold_until = self._clock() + AFTER_RECORD_SECONDS

  def close(self) -> None:
    """On a terminal: the last line drawn, and a newline after it."""
    if self._closed.is_set():
      return
    self._closed.set()
    if self._thread is None:
      return
    self._thread.join()
    for handler in _console_handlers():
      handler.removeFilter(self._guard)
    with self._lock:
      if self._last_write is not None:
        self._hold_until = -math.inf
        self._draw(force=not self._shown)
        self._write('\n')
        self._shown = ''


class _ClearLine(logging.Filter):
  """Lets every record through, after taking the progress line off the
  screen: a record printed on the same terminal would follow its text."""

  def __init__(self, progress: Progress):
    super().__init__()
    self._progress = progress

  def filter(self, record: logging.LogRecord) -> bool:  # noqa: ARG002
    self._progress.clear()
    return True


def _console_handlers() -> list[logging.Handler]:
  """The handlers a log record reaches the console through: the root
  logger's (train.py's absl handler), and absl's own (a library call's, see
  meshfit/api/console.py)."""
  handlers = [*logging.getLogger().handlers,
              *logging.getLogger('absl').handlers]
  return list({id(h): h for h in handlers}.values())


def _is_notebook(stream: TextIO) -> bool:
  """Whether `stream` is a Jupyter kernel's output (ipykernel's stream)."""
  return type(stream).__module__.startswith('ipykernel')


def _is_terminal(stream: TextIO) -> bool:
  try:
    return stream.isatty()
  except (AttributeError, ValueError):  # no such method, or closed
    return False


def _per_target(scalars: Mapping[str, Any], name: str) -> dict[str, float]:
  """{target: value} of `name/<target>` scalars."""
  prefix = name + '/'
  return {k[len(prefix):]: float(v) for k, v in scalars.items()
          if k.startswith(prefix)}


def _duration(seconds: float | None) -> str:
  """'0:07', '12:34' or '1:02:03' ('?' when not known yet)."""
  if seconds is None or not math.isfinite(seconds):
    return '?'
  minutes, secs = divmod(round(seconds), 60)
  hours, minutes = divmod(minutes, 60)
  return (f'{hours}:{minutes:02d}:{secs:02d}' if hours else
          f'{minutes}:{secs:02d}')
