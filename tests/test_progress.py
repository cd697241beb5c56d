"""The progress display: its lines, its terminal line, and when it says the
model has stopped improving."""

import io
import logging

import pytest

from meshfit.report import progress, writers
from meshfit.train.validation import BestTracker


class Clock:
  """A clock the test moves."""

  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    return self.now


class Terminal(io.StringIO):
  def isatty(self) -> bool:
    return True


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
  monkeypatch.setenv('COLUMNS', '200')


def _plain(plan: progress.Plan, clock: Clock | None = None):
  out = io.StringIO()
  return progress.Progress(plan, out, clock=clock or Clock()), out


def test_a_file_gets_one_line_per_evaluation_and_none_per_log_step():
  clock = Clock()
  shown, out = _plain(progress.Plan(0, 100, 10), clock)
  clock.now = 5.0  # the first call compiled the step
  shown.write_scalars(5, {'train/loss': 0.9})
  clock.now = 5.5
  shown.write_scalars(10, {'train/loss': 0.75, 'train/grad_norm': 2.0})
  clock.now = 6.0  # so did the first evaluation
  shown.write_scalars(10, {'val/loss': 0.5, 'eval/rmse': 2.25,
                           'eval/rmse/y': 2.25, 'eval/mae': 1.0})
  assert out.getvalue() == (
      'step  10/100 (1.0 epochs), 0:06 elapsed, 0:18 left: train loss 0.75, '
      'val loss 0.5 (best step 10), eval rmse 2.25\n')
  clock.now = 7.0
  shown.write_scalars(20, {'train/loss': 0.5})
  clock.now = 11.0  # 15 steps in 6 s since step 5, evaluations included
  shown.write_scalars(20, {'val/loss': 0.625})
  shown.close()
  lines = out.getvalue().splitlines()
  # The eval split was not scored at step 20: no rmse of step 10 beside it.
  assert lines[1:] == [
      ('step  20/100 (2.0 epochs), 0:11 elapsed, 0:32 left: train loss 0.5, '
       'val loss 0.625 (best step 10)')]


def test_a_run_without_validation_shows_the_losses_it_has():
  shown, out = _plain(progress.Plan(0, 300, 390))
  shown.write_scalars(300, {'train/loss': 0.0697})
  shown.write_scalars(300, {'eval/rmse': 1.27244, 'eval/rmse/y': 1.27244})
  assert out.getvalue() == ('step 300/300 (0.77 epochs), 0:00 elapsed, ? '
                            'left: train loss 0.0697, eval rmse 1.2724\n')


def test_several_targets_show_each_targets_rmse():
  shown, out = _plain(progress.Plan(0, 10, 5))
  shown.write_scalars(10, {'eval/rmse': 2.0, 'eval/rmse/y': 1.5,
                           'eval/rmse/z': 2.5, 'eval/mae/y': 1.0})
  assert out.getvalue().endswith('eval rmse 2 (y 1.5, z 2.5)\n')


def _validate(plan: progress.Plan, losses: list[float], period: int = 10
              ) -> list[str]:
  """The lines of a run whose evaluations find `losses`, one every
  `period` steps."""
  shown, out = _plain(plan)
  for i, loss in enumerate(losses):
    shown.write_scalars((i + 1) * period, {'val/loss': loss})
  return out.getvalue().splitlines()


def test_it_says_so_when_the_validation_loss_stops_improving():
  losses = [1.0, 0.5] + [0.75] * (progress.STALL_EVALS + 5)
  lines = _validate(progress.Plan(0, 1000, 10), losses)
  notices = [line for line in lines if not line.startswith('step')]
  assert notices == [
      ('The validation loss has not improved for 10 evaluations (best 0.5 at '
       'step 20); training goes on to step 1000.')]
  after = lines.index(notices[0])
  assert lines[after - 1].split()[1] == '120/1000'  # the 10th since 20
  assert all('(best step 20)' in line for line in lines[1:]
             if line != notices[0])


@pytest.mark.parametrize('patience', [3, progress.STALL_EVALS + 2])
def test_early_stopping_is_announced_where_the_tracker_stops(patience):
  losses = [1.0, 0.5, 0.75, 0.5, 0.25] + [0.3] * (patience + 3)
  tracker = BestTracker(patience)
  stopped_at = None
  for i, loss in enumerate(losses):
    tracker.update((i + 1) * 10, loss)
    if tracker.stopped:
      stopped_at = (i + 1) * 10
      break
  lines = _validate(progress.Plan(0, 1000, 10, patience), losses)
  stops = [line for line in lines if line.startswith('Early stopping')]
  assert stops == [
      (f'Early stopping at step {stopped_at}: the validation loss has not '
       f'improved for {patience} evaluations (best 0.25 at step 50).')]
  stalls = [line for line in lines if line.startswith('The validation')]
  assert len(stalls) == (patience > progress.STALL_EVALS)


@pytest.mark.parametrize('best_at, said', [(100, True), (91, True),
                                            (90, False), (50, False)])
def test_a_run_still_improving_at_its_end_says_a_longer_one_may_help(
    best_at, said):
  losses = [1.0 - 0.001 * min(s, best_at) for s in range(1, 101)]
  lines = _validate(progress.Plan(0, 100, 10, patience=20), losses, period=1)
  ends = [line for line in lines if line.startswith('The validation loss was')]
  assert ends == ([
      f'The validation loss was still improving at the end (best '
      f'{losses[best_at - 1]:.4g} at step {best_at} of 100): a longer run '
      '(--config.train_epochs, or num_train_steps) may lower it.'] if said
                  else [])
  assert lines.index(ends[0]) == len(lines) - 1 if said else True


def test_a_run_stopped_early_near_its_end_is_not_told_to_run_longer():
  losses = [1.0 - 0.01 * s for s in range(1, 93)] + [0.5] * 3
  lines = _validate(progress.Plan(0, 100, 10, patience=3), losses, period=1)
  assert lines[-1].startswith('Early stopping at step 95')
  assert not any('still improving' in line for line in lines)


def test_a_resumed_run_counts_on_from_its_checkpoints_tracker():
  tracker = BestTracker(patience=4, best_step=30, best_loss=0.5,
                        evals_since_best=2)
  plan = progress.Plan.of(50, 200, 10, tracker)
  lines = _validate(plan, [0.75, 0.75], period=60)
  assert lines[0].endswith('(best step 30)')
  assert lines[-1] == ('Early stopping at step 120: the validation loss has '
                       'not improved for 4 evaluations (best 0.5 at step 30).')


def test_on_a_terminal_one_line_is_redrawn_in_place_and_ended():
  clock, out = Clock(), Terminal()
  shown = progress.Progress(progress.Plan(0, 40, 10), out, clock=clock)
  for step in (10, 20, 30, 40):
    clock.now = step / 10
    shown.write_scalars(step, {'train/loss': 1 / step})
    # The best step is not the last: no line saying to train longer.
    val_loss = 1 / step if step < 40 else 0.5
    shown.write_scalars(step, {'val/loss': val_loss, 'eval/rmse': 2.0})
    shown.redraw()
  shown.close()
  text = out.getvalue()
  assert text.endswith('\n') and text.count('\n') == 1  # no line per eval
  draws = [d.replace('\x1b[K', '') for d in text[:-1].split('\r')[1:]]
  steps = [d.split(' (')[0] for d in draws]  # its thread may draw too
  assert steps == sorted(steps) and set(steps) == {
      'step 10/40', 'step 20/40', 'step 30/40', 'step 40/40'}
  assert draws[-1] == ('step 40/40 (4.0 epochs), 0:04 elapsed, 0:00 left: '
                       'train loss 0.025, val loss 0.5 (best step 30), '
                       'eval rmse 2')


def test_a_narrow_terminal_drops_the_parts_that_do_not_fit():
  shown = progress.Progress(progress.Plan(0, 700, 7), io.StringIO())
  shown.write_scalars(700, {'train/loss': 0.02446})
  shown.write_scalars(700, {'val/loss': 0.1569, 'eval/rmse': 339.69})
  full = shown.line(0.0)
  assert full.endswith('train loss 0.02446, val loss 0.1569 (best step '
                       '700), eval rmse 339.69')
  assert shown.line(0.0, len(full) - 1).endswith(
      'train loss 0.02446, val loss 0.1569 (best step 700)')
  assert shown.line(0.0, 90).endswith(': val loss 0.1569 (best step 700)')
  assert shown.line(0.0, 79).endswith(': train loss 0.02446')
  assert shown.line(0.0, 20) == 'step 700/700 (100.0 '


def test_a_log_record_takes_the_terminal_line_off_first():
  out, records = Terminal(), io.StringIO()
  handler = logging.StreamHandler(records)
  logging.getLogger().addHandler(handler)
  try:
    shown = progress.Progress(progress.Plan(0, 10, 10), out, clock=Clock())
    shown.write_scalars(5, {'train/loss': 0.5})
    shown.redraw()
    drawn = out.getvalue()
    logging.getLogger('some.library').warning('disk almost full')
    assert out.getvalue() == drawn + '\r\x1b[K'  # cleared before it printed
    assert 'disk almost full' in records.getvalue()
    shown.close()
    assert out.getvalue().endswith('\n')
    assert shown._guard not in handler.filters  # noqa: SLF001
  finally:
    logging.getLogger().removeHandler(handler)


def test_a_console_that_is_gone_does_not_stop_the_run():
  class Gone(io.StringIO):
    def write(self, text):
      raise BrokenPipeError('the reader left')

  shown = progress.Progress(progress.Plan(0, 10, 10), Gone())
  shown.write_scalars(10, {'val/loss': 0.5})  # no exception
  shown.close()


def test_the_console_writer_of_each_process(capsys):
  plan = progress.Plan(0, 10, 10)
  assert progress.Console(progress=True, log_scalars=False).writer(
      False, plan) is None
  shown = progress.Console(progress=True, log_scalars=False).writer(
      True, plan)
  shown.write_scalars(10, {'val/loss': 0.5})
  shown.close()
  assert capsys.readouterr().out.startswith('step 10/10')
  default = progress.Console().writer(True, plan)
  assert isinstance(default, writers.MultiWriter)
  default.write_scalars(10, {'val/loss': 0.5})
  default.close()
  assert capsys.readouterr().out == ''  # INFO lines only


@pytest.mark.parametrize('seconds, text', [
    (None, '?'), (0.4, '0:00'), (7, '0:07'), (754, '12:34'),
    (3723, '1:02:03'), (float('inf'), '?')])
def test_durations(seconds, text):
  assert progress._duration(seconds) == text  # noqa: SLF001


def test_a_notebook_gets_the_line_redrawn_without_terminal_escapes():
  # ipykernel's OutStream: no terminal, but a carriage return redraws.
  notebook = type('OutStream', (io.StringIO,),
                  {'__module__': 'ipykernel.iostream'})()
  shown = progress.Progress(progress.Plan(0, 10, 10), notebook, clock=Clock())
  shown.write_scalars(5, {'train/loss': 0.5})
  shown.redraw()
  shown.write_scalars(10, {'train/loss': 0.25})
  shown.redraw()
  shown.close()
  text = notebook.getvalue()
  assert '\x1b' not in text
  assert text.count('\r') >= 2 and text.endswith('\n')
  assert text.rstrip('\n').split('\r')[-1].startswith('step 10/10')
