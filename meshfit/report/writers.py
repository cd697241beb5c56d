"""Where logged scalars go: the console, TensorBoard and metrics.jsonl.

meshfit's own writers rather than `clu.metric_writers`: importing that
package imports TensorFlow (for its TF summary writer), which would slow
every start. TensorBoard event files are written with the `tensorboard` package's
record format and protos, which need no TensorFlow.
"""

import abc
import concurrent.futures
import json
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from absl import logging
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

from meshfit import storage

# On gs:// (no append) a flush uploads the whole file again: writers there
# flush at most this often between the loop's own flushes (evaluations, the
# end), so a crash loses at most this many seconds of records.
REMOTE_FLUSH_SECONDS = 30.0


def json_safe(value: Any) -> Any:
  """`value` (dicts, lists and numbers, nested) as standard JSON holds it:
  a NaN or infinite number becomes null, since json.dump would write NaN,
  which no strict JSON reader takes (the r2 of a constant target is none)."""
  if isinstance(value, dict):
    return {k: json_safe(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [json_safe(v) for v in value]
  if isinstance(value, (float, np.floating)):
    return float(value) if np.isfinite(value) else None
  return value


class ScalarWriter(abc.ABC):
  """Where logged scalars go (the part of CLU's MetricWriter meshfit uses)."""

  @abc.abstractmethod
  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Records `scalars` (name -> number) at training step `step`."""

  def flush(self) -> None:
    """Makes everything written so far reach its destination."""

  def close(self) -> None:
    """Flushes and releases the writer; nothing may be written after."""
    self.flush()


class LoggingWriter(ScalarWriter):
  """Logs `[step] name=value, ...` at INFO, as CLU's LoggingWriter does,
  each metric once per target only when there are several targets."""

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    shown = without_single_target(scalars)
    values = [f'{k}={float(v):.6g}' for k, v in sorted(shown.items())]
    logging.info('[%d] %s', step, ', '.join(values))


def without_single_target(scalars: Mapping[str, Any]) -> dict[str, Any]:
  """`scalars` less each `name/<target>` that is the only one of its
  `name`: with one target, `eval/mae/y` repeats `eval/mae` (metrics.jsonl
  and TensorBoard keep both)."""
  children: dict[str, list[str]] = {}
  for key in scalars:
    for name in scalars:
      if key.startswith(name + '/'):
        children.setdefault(name, []).append(key)
  alone = {keys[0] for keys in children.values() if len(keys) == 1}
  return {k: v for k, v in scalars.items() if k not in alone}


def _new_event_file(logdir: str) -> storage.AppendWriter:
  """Creates a new event file in `logdir`, named as TensorFlow names them."""
  storage.makedirs(logdir)
  # TensorBoard reads a directory's event files in name order, so the name
  # starts with the time; the counter keeps apart two writers of one process
  # started within a second (a run and its resumption in a test).
  prefix = (f'events.out.tfevents.{int(time.time()):010d}.'
            f'{socket.gethostname()}.{os.getpid()}')
  uid = 0
  while not storage.create_exclusive(
      storage.join(logdir, f'{prefix}.{uid}'), b''):
    uid += 1
  return storage.AppendWriter(storage.join(logdir, f'{prefix}.{uid}'))


class TensorBoardWriter(ScalarWriter):
  """Writes scalars to a TensorBoard event file, without TensorFlow.

  Each scalar is stored as `tf.summary.scalar` stores it (a float32 tensor
  marked for the scalars plugin), so TensorBoard and its readers see the same
  records as from a TF summary writer.

  Attributes:
    path: the event file.
  """

  def __init__(self, logdir: str):
    """Creates a new event file in `logdir` (created if missing).

    Args:
      logdir: the directory TensorBoard is pointed at.
    """
    self._file = _new_event_file(logdir)
    self.path = self._file.name
    self._records = RecordWriter(self._file)
    self._metadata = scalar_metadata.create_summary_metadata(
        display_name=None, description=None)
    # Readers recognise an event file by this first record.
    self._write(event_pb2.Event(wall_time=time.time(),
                                file_version='brain.Event:2'))
    self.flush()

  def _write(self, event: event_pb2.Event) -> None:
    self._records.write(event.SerializeToString())

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    values = [
        summary_pb2.Summary.Value(
            tag=name, metadata=self._metadata,
            tensor=tensor_util.make_tensor_proto(np.float32(value)))
        for name, value in scalars.items()]
    self._write(event_pb2.Event(wall_time=time.time(), step=int(step),
                                summary=summary_pb2.Summary(value=values)))

  def flush(self) -> None:
    self._records.flush()

  def close(self) -> None:
    if not self._file.closed:
      self._records.close()  # flushes first


class JsonlWriter(ScalarWriter):
  """Appends `{"step": N, name: value, ...}` lines at full float precision."""

  def __init__(self, path: str):
    self._path = path
    self._file = storage.AppendWriter(path)
    self._local = not storage.is_remote(path)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    record = {'step': int(step)}
    record.update({k: json_safe(float(v)) for k, v in scalars.items()})
    self._file.write((json.dumps(record) + '\n').encode('utf-8'))
    if self._local:
      # Each record reaches the file as it is written, so a killed run
      # loses at most the line it was writing.
      self._file.flush()

  def flush(self) -> None:
    self._file.sync()

  def close(self) -> None:
    if not self._file.closed:
      self.flush()
      self._file.close()


class MultiWriter(ScalarWriter):
  """Writes the same scalars to several writers, in order."""

  def __init__(self, writers: Sequence[ScalarWriter]):
    self._writers = tuple(writers)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    for writer in self._writers:
      writer.write_scalars(step, scalars)

  def flush(self) -> None:
    for writer in self._writers:
      writer.flush()

  def close(self) -> None:
    for writer in self._writers:
      writer.close()


def truncate_jsonl(path: str, last_step: int) -> None:
  """Drops records after `last_step`: a resumed run writes them again.

  The file is replaced atomically, so a crash here loses nothing.
  """
  try:
    lines = storage.read_text(path).splitlines(keepends=True)
  except FileNotFoundError:
    return
  kept = []
  for line in lines:
    try:
      if json.loads(line)['step'] <= last_step:
        kept.append(line)
    except (json.JSONDecodeError, KeyError, TypeError):
      pass  # a line torn by a crash mid-write
  if len(kept) == len(lines):
    return
  with storage.atomic_write(path) as f:
    f.writelines(kept)


def read_jsonl(path: str) -> list[dict[str, float]]:
  """All records of a metrics.jsonl file."""
  return [json.loads(line) for line in storage.read_text(path).splitlines()
          if line.strip()]


def create_writer(workdir: str, is_main: bool,
                  console: ScalarWriter | None) -> ScalarWriter:
  """TensorBoard and metrics.jsonl on process 0, and the console.

  Args:
    workdir: the run's directory; the event file and metrics.jsonl go there.
    is_main: whether this is the process that writes files (process 0).
    console: what the console shows of the scalars (None: nothing;
      meshfit/report/progress.py's `Console` makes it).

  Returns:
    A writer to which the training loop hands every scalar it logs.
  """
  destinations = []
  if is_main:
    files: ScalarWriter = MultiWriter([
        TensorBoardWriter(workdir),
        JsonlWriter(storage.join(workdir, 'metrics.jsonl'))])
    if storage.is_remote(workdir):
      files = TimedFlush(files, REMOTE_FLUSH_SECONDS)
    destinations.append(files)
  if console is not None:
    # After the files: a console that fails cannot cost them a record.
    destinations.append(console)
  return MultiWriter(destinations)


class TimedFlush(ScalarWriter):
  """Flushes another writer once `seconds` have passed since its last
  flush, at the next write: a bound on what a crash loses where every
  flush costs an upload."""

  def __init__(self, writer: ScalarWriter, seconds: float):
    self._writer = writer
    self._seconds = seconds
    self._last = time.monotonic()

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    self._writer.write_scalars(step, scalars)
    if time.monotonic() - self._last >= self._seconds:
      self.flush()

  def flush(self) -> None:
    self._writer.flush()
    self._last = time.monotonic()

  def close(self) -> None:
    self._writer.close()


class AsyncWriter(ScalarWriter):
  """Hands writes to a background thread: the loop never waits on file I/O.

  Values may still be JAX scalars; they are converted in the thread. `flush`
  waits for every write so far and raises the first error of any of them.
  """

  def __init__(self, writer: ScalarWriter):
    self._writer = writer
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix='meshfit-metrics')
    self._pending: list[concurrent.futures.Future] = []

  def write_scalars(
      self, step: int,
      scalars: Mapping[str, Any] | Callable[[], Mapping[str, Any]]) -> None:
    """Queues a write; `scalars` may be a function computing them there."""
    def write():
      values = scalars() if callable(scalars) else scalars
      self._writer.write_scalars(
          step, {k: float(v) for k, v in values.items()})
    self._pending = [f for f in self._pending if not f.done() or
                     f.exception() is not None]
    self._pending.append(self._pool.submit(write))

  def pending(self) -> list[concurrent.futures.Future]:
    """What to wait for elsewhere before counting on every write so far:
    a flush queued behind them (on gs:// a write reaches the object only
    when flushed; a checkpoint must not exist before its steps' records)."""
    self._pending.append(self._pool.submit(self._writer.flush))
    return list(self._pending)

  def flush(self) -> None:
    pending, self._pending = self._pending, []
    for future in pending:
      future.result()
    self._writer.flush()

  def close(self) -> None:
    try:
      self.flush()
    finally:
      self._pool.shutdown(wait=True)
      self._writer.close()
