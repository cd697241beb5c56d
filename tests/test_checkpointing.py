"""BackgroundSaver: periodic checkpoints written without stopping training."""

import threading
import time

import pytest

from meshfit import checkpointing


class _SlowCheckpointer:
  """Records saves; each one blocks until the test lets it finish."""

  def __init__(self, fail_step: int | None = None):
    self.saved = []
    self.started = threading.Semaphore(0)
    self.release = threading.Semaphore(0)
    self._fail_step = fail_step

  def save(self, step, state, meta):
    del state, meta
    self.started.release()
    self.release.acquire()
    if step == self._fail_step:
      raise OSError(f'disk full at {step}')
    self.saved.append(step)

  def wait(self):
    pass


def test_saves_coming_faster_than_writes_keep_the_newest():
  ckpt = _SlowCheckpointer()
  saver = checkpointing.BackgroundSaver(ckpt)
  try:
    saver.submit(50, 'state50', {})
    assert ckpt.started.acquire(timeout=10)  # 50 is being written
    for step in (100, 150, 200):  # each replaces the one waiting
      saver.submit(step, f'state{step}', {})
    for _ in range(2):
      ckpt.release.release()
    saver.wait()
    assert ckpt.saved == [50, 200]
    assert saver.skipped == [100, 150]
  finally:
    saver.close()


@pytest.mark.parametrize('writing', [
    True,   # the second comes while the first is being written: submit
            # returns at once (it would hang here if it waited for the write)
    False,  # back to back to an idle writer, before its thread may have run
])
def test_two_saves_are_both_written(writing):
  ckpt = _SlowCheckpointer()
  saver = checkpointing.BackgroundSaver(ckpt)
  try:
    saver.submit(1, 's', {})
    if writing:
      assert ckpt.started.acquire(timeout=10)
    saver.submit(2, 's', {})
    assert ckpt.saved == []
    ckpt.release.release()
    ckpt.release.release()
    saver.wait()
    assert ckpt.saved == [1, 2] and not saver.skipped
  finally:
    saver.close()


def test_a_failed_write_is_raised_in_the_loop_thread():
  ckpt = _SlowCheckpointer(fail_step=7)
  saver = checkpointing.BackgroundSaver(ckpt)
  try:
    saver.submit(7, 's', {})
    ckpt.release.release()
    with pytest.raises(OSError, match='disk full at 7'):
      saver.wait()
    saver.wait()  # raised once, then cleared
  finally:
    saver.close()


def test_metric_writes_finish_before_the_checkpoint_is_written():
  import concurrent.futures  # noqa: PLC0415
  ckpt = _SlowCheckpointer()
  saver = checkpointing.BackgroundSaver(ckpt)
  write = concurrent.futures.Future()
  try:
    saver.submit(3, 's', {}, wait_for=[write])
    assert not ckpt.started.acquire(timeout=0.3)  # waits for the write
    write.set_result(None)
    assert ckpt.started.acquire(timeout=10)
    ckpt.release.release()
    saver.wait()
    assert ckpt.saved == [3]
  finally:
    saver.close()


def test_the_time_budget_spaces_out_writes():
  ckpt = _SlowCheckpointer()
  saver = checkpointing.BackgroundSaver(ckpt, budget=0.25)
  try:
    assert saver.ready()
    saver.submit(1, 's', {})
    assert not saver.ready()  # writing
    assert ckpt.started.acquire(timeout=10)
    time.sleep(0.2)  # the write takes >= 0.2 s ...
    ckpt.release.release()
    saver.wait()
    # ... so, at 25% of the time, the next may start >= 0.6 s after it.
    assert not saver.ready()
    time.sleep(0.8)
    assert saver.ready()
    saver.submit(2, 's', {})  # and wait() never waits for the budget
    ckpt.release.release()
    saver.wait()
    assert ckpt.saved == [1, 2]
  finally:
    saver.close()
