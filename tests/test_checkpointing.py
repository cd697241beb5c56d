"""BackgroundSaver: periodic checkpoints written without stopping training."""

import os
import threading

import pytest

from meshfit.checkpoints import checkpointer


class _SlowCheckpointer:
  """Records saves; each one blocks until the test lets it finish."""

  def __init__(self, fail_step: int | None = None):
    self.saved = []
    self.started = threading.Semaphore(0)
    self.release = threading.Semaphore(0)
    self._fail_step = fail_step

  def save(self, step, state, meta, val_loss=None):
    del state, meta
    self.started.release()
    self.release.acquire()
    if step == self._fail_step:
      raise OSError(f'disk full at {step}')
    self.saved.append(step)

  def wait(self):
    pass


def test_saves_coming_faster_than_writes_are_all_written_in_order():
  ckpt = _SlowCheckpointer()
  saver = checkpointer.BackgroundSaver(ckpt)
  try:
    saver.submit(50, 'state50', {})
    assert ckpt.started.acquire(timeout=10)  # 50 is being written
    saver.submit(100, 'state100', {})  # waits its turn; submit returns
    third = threading.Thread(target=saver.submit, args=(150, 'state150', {}))
    third.start()
    third.join(timeout=0.5)
    assert third.is_alive()  # 100 is still waiting: the loop waits too
    ckpt.release.release()  # 50 done; the writer takes 100, 150 gets in
    third.join(timeout=10)
    assert not third.is_alive()
    for _ in range(2):
      ckpt.release.release()
    saver.wait()
    assert ckpt.saved == [50, 100, 150]
  finally:
    saver.close()


@pytest.mark.parametrize('writing', [
    True,   # the second comes while the first is being written: submit
            # returns at once (it would hang here if it waited for the write)
    False,  # back to back to an idle writer, before its thread may have run
])
def test_two_saves_are_both_written(writing):
  ckpt = _SlowCheckpointer()
  saver = checkpointer.BackgroundSaver(ckpt)
  try:
    saver.submit(1, 's', {})
    if writing:
      assert ckpt.started.acquire(timeout=10)
    saver.submit(2, 's', {})
    assert ckpt.saved == []
    ckpt.release.release()
    ckpt.release.release()
    saver.wait()
    assert ckpt.saved == [1, 2]
  finally:
    saver.close()


def test_a_failed_write_is_raised_in_the_loop_thread():
  ckpt = _SlowCheckpointer(fail_step=7)
  saver = checkpointer.BackgroundSaver(ckpt)
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
  saver = checkpointer.BackgroundSaver(ckpt)
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


def test_a_damaged_best_checkpoint_is_set_aside_for_the_next_best(tmp_path):
  import jax.numpy as jnp  # noqa: PLC0415
  ckpt = checkpointer.Checkpointer(str(tmp_path), max_to_keep=3)
  try:
    for step, loss in ((10, 0.5), (20, 0.2), (30, None)):
      ckpt.save(step, {'w': jnp.full(4, step, jnp.float32)}, {'step': step},
                val_loss=loss)
    ckpt.wait()
    for root, _, files in os.walk(tmp_path / 'checkpoints' / '20' / 'state'):
      for name in files:
        with open(os.path.join(root, name), 'r+b') as f:
          f.truncate(0)
    step, state, loss = ckpt.restore_best({'w': jnp.zeros(4, jnp.float32)})
    assert (step, loss, float(state['w'][0])) == (10, 0.5, 10.0)
    assert os.listdir(tmp_path / 'damaged_checkpoints') == ['20']
    assert ckpt.all_steps() == [10, 30]
    # With no best left, there is none to restore (the caller's last state).
    for root, _, files in os.walk(tmp_path / 'checkpoints' / '10' / 'state'):
      for name in files:
        with open(os.path.join(root, name), 'r+b') as f:
          f.truncate(0)
    assert ckpt.restore_best({'w': jnp.zeros(4, jnp.float32)}) is None
    assert sorted(os.listdir(tmp_path / 'damaged_checkpoints')) == [
        '10', '20']
  finally:
    ckpt.close()


def test_a_save_that_fills_the_disk_half_way_is_one_storage_error(tmp_path):
  import subprocess  # noqa: PLC0415

  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from meshfit import storage  # noqa: PLC0415
  disk = tmp_path / 'disk'
  disk.mkdir()
  if subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=512k', 'tmpfs',
                     str(disk)], capture_output=True).returncode != 0:
    pytest.skip('cannot mount a tmpfs')
  try:
    ckpt = checkpointer.Checkpointer(str(disk), max_to_keep=3)
    try:
      ckpt.save(10, {'w': jnp.ones(4, jnp.float32)}, {'step': 10})
      ckpt.wait()
      # The check before a save takes the last checkpoint's size: this one
      # passes it and fills the disk in Orbax's writers.
      with pytest.raises(storage.StorageError) as e:
        noise = np.random.default_rng(0).normal(size=1_000_000)  # no zstd
        ckpt.save(20, {'w': jnp.asarray(noise, jnp.float32)}, {'step': 20})
        ckpt.wait()
      message = str(e.value)
      assert 'step 20' in message and 'No space left' in message, message
      assert 'before it are intact' in message
      state = ckpt.restore_state(10, {'w': jnp.zeros(4, jnp.float32)})
      assert float(state['w'].sum()) == 4.0
    finally:
      ckpt.close()
  finally:
    subprocess.run(['umount', str(disk)], check=True)


def test_held_checkpoints_keep_and_write_what_orbax_keeps(tmp_path):
  import jax.numpy as jnp  # noqa: PLC0415
  from meshfit.checkpoints.held import HeldCheckpoints  # noqa: PLC0415
  saves = ((10, 0.5), (20, 0.2), (30, None), (40, 0.3), (50, None))
  on_disk = checkpointer.Checkpointer(str(tmp_path / 'disk'), max_to_keep=2)
  held = HeldCheckpoints(str(tmp_path / 'held')).keeping(2)
  try:
    for step, loss in saves:
      for ckpt in (on_disk, held):
        ckpt.save(step, {'w': jnp.full(4, step, jnp.float32)},
                  {'step': step}, val_loss=loss)
    on_disk.wait()
    assert held.all_steps() == on_disk.all_steps() == [20, 40, 50]
    assert held.step_to_restore(None) == on_disk.step_to_restore(None) == 20
    target = {'w': jnp.zeros(4, jnp.float32)}
    assert held.restore_best(target)[::2] == (20, 0.2)
    assert held.restore_meta(50) == {'step': 50}
    held.write()
    assert held.all_steps() == []
  finally:
    on_disk.close()
  written = checkpointer.Checkpointer(str(tmp_path / 'held'), read_only=True)
  try:
    assert written.all_steps() == [20, 40, 50]
    step, state, loss = written.restore_best(target)
    assert (step, loss, float(state['w'][0])) == (20, 0.2, 20.0)
  finally:
    written.close()
