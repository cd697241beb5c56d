"""The progress reporter the training loop calls after every step."""

import logging

import pytest

from meshfit import metrics, progress


class _Recorder(metrics.ScalarWriter):

  def __init__(self):
    self.records = []

  def write_scalars(self, step, scalars):
    self.records.append((step, dict(scalars)))


@pytest.fixture
def clock(monkeypatch):
  """A fake time.monotonic: set `clock.now` to move time."""

  class Clock:
    now = 100.0

  monkeypatch.setattr(progress.time, 'monotonic', lambda: Clock.now)
  return Clock


def test_reports_every_n_steps_and_at_the_last(clock, caplog):
  caplog.set_level(logging.INFO)
  writer = _Recorder()
  report = progress.ReportProgress(num_train_steps=25, writer=writer,
                                   every_steps=10, every_secs=None)
  reported = []
  for step in range(1, 26):
    clock.now += 0.5  # two steps a second
    if report(step):
      reported.append(step)
  assert reported == [10, 20, 25]
  assert [step for step, _ in writer.records] == [10, 20, 25]
  for _, scalars in writer.records:
    assert scalars['steps_per_sec'] == pytest.approx(2.0)
  assert writer.records[-1][1]['uptime'] == pytest.approx(12.5)
  assert '2.0 steps/s, 40.0% (10/25), ETA: 0m' in caplog.text


def test_every_secs_and_the_share_of_timed_parts(clock, caplog):
  caplog.set_level(logging.INFO)
  report = progress.ReportProgress(num_train_steps=10_000, every_steps=None,
                                   every_secs=60.0)
  report(1)  # starts the clock, never reports
  clock.now += 30
  with report.timed('eval'):
    clock.now += 30
  assert not report(2)  # 60 s since step 1 is not more than 60 s
  clock.now += 1  # 2 steps in 61 s: 9,997 steps left take 3.5 days
  assert report(3)
  assert ('0.0 steps/s, 0.0% (3/10000), ETA: 3d12h41m (1m : 49.2% eval)'
          in caplog.text)
