"""meshfit.checkpoint_policy: which steps the loop checkpoints."""

import pytest

from meshfit.train import checkpoint_policy


class _Clock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


@pytest.fixture
def clock(monkeypatch):
  clock = _Clock()
  monkeypatch.setattr(checkpoint_policy.time, 'monotonic', clock)
  return clock


def _policy(every_steps, every_seconds):
  return checkpoint_policy.LoopCheckpoints(
      ckpt=None, watch=None, writer=None, shardings=None, meta=dict,
      every_steps=every_steps, every_seconds=every_seconds)


def test_steps_and_seconds_each_make_a_checkpoint_due(clock):
  policy = _policy(every_steps=50, every_seconds=10.0)
  try:
    assert policy.due(50) and not policy.due(49)
    clock.now += 9.9
    assert not policy.due(51)
    clock.now += 0.1
    assert policy.due(52)
    policy._last = clock.now  # pylint: disable=protected-access (a save)
    clock.now += 5
    assert not policy.due(53)
  finally:
    policy.close()


def test_zero_turns_each_off(clock):
  policy = _policy(every_steps=0, every_seconds=0)
  try:
    clock.now += 1e6
    assert not any(policy.due(s) for s in (1, 100, 1000))
  finally:
    policy.close()
