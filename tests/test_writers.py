"""The writers of logged scalars: console, TensorBoard, metrics.jsonl."""

import os

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from meshfit.report import writers


def _tensorboard_scalars(logdir) -> dict[str, dict[int, float]]:
  """Every scalar of `logdir` as TensorBoard's own reader finds it."""
  acc = event_accumulator.EventAccumulator(
      str(logdir), size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  out = {}
  for tag in acc.Tags()['tensors']:
    assert acc.SummaryMetadata(tag).plugin_data.plugin_name == 'scalars'
    out[tag] = {}
    for event in acc.Tensors(tag):
      value = tensor_util.make_ndarray(event.tensor_proto)
      assert value.shape == () and value.dtype == np.float32
      out[tag][event.step] = float(value)
  return out


def test_tensorboard_writer_events_are_read_back_by_tensorboard(tmp_path):
  writer = writers.TensorBoardWriter(str(tmp_path / 'run'))
  writer.write_scalars(10, {'train/loss': np.float32(0.5), 'lr': 1e-3})
  writer.write_scalars(20, {'train/loss': jnp.asarray(0.25)})
  writer.flush()
  writer.write_scalars(30, {'eval/rmse': 1.5})
  writer.close()
  assert _tensorboard_scalars(tmp_path / 'run') == {
      'train/loss': {10: 0.5, 20: 0.25},
      'lr': {10: pytest.approx(1e-3, rel=1e-7)},
      'eval/rmse': {30: 1.5}}


def test_two_tensorboard_writers_in_one_second_keep_both_files(tmp_path):
  first = writers.TensorBoardWriter(str(tmp_path))
  second = writers.TensorBoardWriter(str(tmp_path))
  first.write_scalars(1, {'a': 1.0})
  second.write_scalars(2, {'a': 2.0})
  first.close()
  second.close()
  assert first.path != second.path
  assert _tensorboard_scalars(tmp_path) == {'a': {1: 1.0, 2: 2.0}}


def test_create_writer_sends_scalars_to_every_destination(tmp_path,
                                                         absl_caplog):
  caplog = absl_caplog
  writer = writers.create_writer(str(tmp_path), is_main=True,
                                 console=writers.LoggingWriter())
  writer.write_scalars(7, {'train/loss': np.float32(0.125), 'eval/r2': 0.5})
  writer.close()
  assert writers.read_jsonl(str(tmp_path / 'metrics.jsonl')) == [
      {'step': 7, 'train/loss': 0.125, 'eval/r2': 0.5}]
  assert _tensorboard_scalars(tmp_path) == {'train/loss': {7: 0.125},
                                            'eval/r2': {7: 0.5}}
  assert '[7] eval/r2=0.5, train/loss=0.125' in caplog.text


def test_other_processes_only_log(tmp_path, absl_caplog):
  caplog = absl_caplog
  writer = writers.create_writer(str(tmp_path), is_main=False,
                                 console=writers.LoggingWriter())
  writer.write_scalars(3, {'train/loss': 2.0})
  writer.close()
  assert os.listdir(tmp_path) == []
  assert '[3] train/loss=2' in caplog.text


def test_without_a_console_process_0_writes_the_files_only(tmp_path,
                                                           absl_caplog):
  writer = writers.create_writer(str(tmp_path), is_main=True, console=None)
  writer.write_scalars(3, {'train/loss': 2.0})
  writer.close()
  assert writers.read_jsonl(str(tmp_path / 'metrics.jsonl')) == [
      {'step': 3, 'train/loss': 2.0}]
  assert 'train/loss' not in absl_caplog.text


def test_the_console_shows_a_metric_per_target_only_for_several(
    tmp_path, absl_caplog):
  one = {'eval/mae': 2.0, 'eval/mae/y': 2.0, 'eval/rmse': 3.0,
         'eval/rmse/y': 3.0, 'val/loss': 0.5, 'val/loss_all_members': 0.6}
  two = {'eval/mae': 2.0, 'eval/mae/y': 1.0, 'eval/mae/z': 3.0}
  writer = writers.create_writer(str(tmp_path), is_main=True,
                                 console=writers.LoggingWriter())
  writer.write_scalars(1, one)
  writer.write_scalars(2, two)
  writer.close()
  assert ('[1] eval/mae=2, eval/rmse=3, val/loss=0.5, '
          'val/loss_all_members=0.6\n') in absl_caplog.text
  assert '[2] eval/mae=2, eval/mae/y=1, eval/mae/z=3\n' in absl_caplog.text
  # The files keep every scalar.
  assert writers.read_jsonl(str(tmp_path / 'metrics.jsonl')) == [
      {'step': 1, **one}, {'step': 2, **two}]


def test_async_writer_keeps_order_and_raises_a_failed_write(tmp_path):
  path = str(tmp_path / 'metrics.jsonl')
  writer = writers.AsyncWriter(writers.JsonlWriter(path))
  for step in range(1, 51):
    writer.write_scalars(step, {'a': jnp.float32(step) / 2})
  writer.flush()
  assert [(r['step'], r['a']) for r in writers.read_jsonl(path)] == [
      (s, s / 2) for s in range(1, 51)]

  class Broken(writers.ScalarWriter):
    def write_scalars(self, step, scalars):
      raise OSError('disk full')
  broken = writers.AsyncWriter(Broken())
  broken.write_scalars(1, {'a': 1.0})
  with pytest.raises(OSError, match='disk full'):
    broken.flush()
  writer.close()


def test_truncate_jsonl_drops_later_steps_and_torn_lines(tmp_path):
  path = tmp_path / 'metrics.jsonl'
  path.write_text('{"step": 10, "a": 1}\n{"step": 20, "a": 2}\n'
                  '{"step": 30, "a": 3}\n{"step": 3')  # torn by a crash
  writers.truncate_jsonl(str(path), 20)
  assert [r['step'] for r in writers.read_jsonl(str(path))] == [10, 20]
  assert os.listdir(tmp_path) == ['metrics.jsonl']  # no temporary left
