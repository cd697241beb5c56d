"""Turns an in-memory table into global, sharded batches.

Regression tables fit in host memory, so each split is held resident and
batches are gathered from it in vectorised blocks (reading and decoding one
record at a time moves only ~16k rows/s here).

Order. Training examples form one endless stream: epoch e is the permutation
of the table drawn from (seed, e), and the global batch at step s is stream
entries [s * B, (s + 1) * B). The batch therefore holds the same examples
whatever the number of processes and devices, and the whole input position
is a single integer (`position`, entries consumed) saved in every checkpoint.

Placement. Training runs several steps per jitted call, so the loader hands
out chunks of batches. A table that fits is copied once to every device and
a chunk is then only the batches' row indices; the devices gather the rows.
Larger tables are streamed: the chunk holds the rows. Either way each process
prepares only the part of each batch that its own devices hold under the
batch sharding and hands it to `jax.make_array_from_process_local_data`,
which assembles the global array. (One process with a resident table hands
the jitted call its numpy indices instead: the call places them by its
in_shardings in ~20 us, where making the array first takes ~200 us, most of
a call's host cost.)
"""

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from meshfit import sharding
from meshfit.errors import UsageError


def epoch_permutation(seed: int, epoch: int, num_examples: int) -> np.ndarray:
  """The example order of one epoch; depends on nothing but its arguments."""
  rng = np.random.Generator(np.random.Philox(key=[seed, epoch]))
  return rng.permutation(num_examples)


def process_rows(sharding: NamedSharding, global_rows: int) -> slice:
  """The contiguous block of batch rows that this process's devices hold.

  Raises:
    ValueError: the sharding gives this process a non-contiguous set of rows
      (a mesh whose 'data' axis interleaves processes).
  """
  index_map = sharding.addressable_devices_indices_map((global_rows,))
  rows = set()
  for index in index_map.values():
    rows.update(range(*index[0].indices(global_rows)))
  start, stop = min(rows), max(rows) + 1
  if len(rows) != stop - start:
    raise ValueError('this process holds non-contiguous batch rows; build the '
                     "mesh so that each process owns a block of the 'data' axis")
  return slice(start, stop)


def check_batch_size(batch_size: int, sharding: NamedSharding,
                     name: str) -> None:
  """Raises UsageError unless `batch_size` splits evenly over the data axis."""
  shards = sharding.mesh.shape[sharding.spec[0]]
  if batch_size <= 0 or batch_size % shards:
    raise UsageError(
        f"{name} {batch_size} is not divisible by the {shards} devices of mesh "
        f"axis 'data'; use a multiple of {shards}")


class _Prefetcher:
  """Runs `produce` in a thread, keeping up to `size` results ahead."""

  def __init__(self, produce: Callable[[], Any], size: int):
    self._produce = produce
    self._queue = queue.Queue(maxsize=max(size, 1))
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _run(self):
    while not self._stop.is_set():
      try:
        item = (self._produce(), None)
      except Exception as e:  # handed to the consumer, raised there
        item = (None, e)
      while not self._stop.is_set():
        try:
          self._queue.put(item, timeout=0.1)
          break
        except queue.Full:
          continue
      if item[1] is not None:
        return

  def get(self) -> Any:
    item, error = self._queue.get()
    if error is not None:
      raise error
    return item

  def close(self):
    self._stop.set()
    self._thread.join()


def chunk_plan(first_step: int, last_step: int, steps_per_call: int,
               periods: Iterable[int] = (), stops: Iterable[int] = (),
               optional_period: int = 0,
               take: Callable[[int], bool] = lambda step: True
               ) -> Iterator[tuple[int, int]]:
  """How steps first_step+1..last_step are grouped into calls.

  A call ends at the next multiple of `steps_per_call`, of any of `periods`
  (logging, evaluation), at any of `stops`, or at `last_step`, whichever
  comes first. Boundaries are absolute step numbers, so a run resumed from
  any call's end groups the rest of its steps as the uninterrupted run does.

  A multiple of `optional_period` (single-process checkpoints) that falls
  inside a call ends it only if `take(step)`, asked once per such step when
  its call is planned, says so: a checkpoint that would not be written
  anyway does not cost a call. Grouping changes no bit of the result (see
  steps.train_steps), so such a plan still resumes exactly.

  Yields:
    (steps done before the call, steps in the call).
  """
  periods = [p for p in (steps_per_call, *periods) if p > 0]
  stops = sorted(s for s in stops if first_step < s < last_step)
  step = first_step
  while step < last_step:
    end = min([last_step] + [(step // p + 1) * p for p in periods] +
              [s for s in stops if s > step][:1])
    if optional_period > 0:
      for due in range((step // optional_period + 1) * optional_period, end,
                       optional_period):
        if take(due):
          end = due
          break
    yield step, end - step
    step = end


def num_calls(num_steps: int, steps_per_call: int,
              periods: Iterable[int] = ()) -> int:
  """How many calls `chunk_plan(0, num_steps, steps_per_call, periods)`
  makes, counted without walking it (a start weighs a hundred call lengths:
  walking their plans took ~30 ms)."""
  if num_steps <= 0:
    return 0
  ends = np.zeros(num_steps, bool)  # ends[s]: a call ends after step s
  for p in (steps_per_call, *periods):
    if p > 0:
      ends[p::p] = True
  return int(ends.sum()) + 1  # and the last call, at num_steps


class TrainLoader:
  """Deterministic chunks of training batches, one chunk per jitted call.

  Each chunk holds the next `num_steps` (at most `steps_per_call`) global
  batches of the stream, padded to `steps_per_call`, in one of two forms:

  - resident (`device_table()` was uploaded): `{'idx': idx_KxB}`, the table
    rows of each batch; the jitted call gathers them from the device-resident
    table. A call then moves K x B int32 to the devices instead of K x B rows.
  - streamed: `{'x': x_KxBxF, 'y': y_KxBxT}`, the rows themselves, for tables
    too large to hold on every device.

  Arrays are global, sharded as `chunk_sharding` (over 'data' along the
  batch dimension), except that the indices of a single process are numpy
  arrays for a jitted call with that in_sharding to place. `position` is the
  number of stream entries consumed by the chunks handed out so far
  (prefetched ones do not count).
  """

  def __init__(self, x_NxF: np.ndarray, y_NxT: np.ndarray, *,
               batch_size: int, seed: int, mesh: Mesh,
               chunk_sizes: Iterable[int], steps_per_call: int,
               resident: bool, position: int = 0, prefetch: int = 2):
    """Prepares chunks (a streamed table's in a background thread).

    Args:
      x_NxF: the training features.
      y_NxT: the training targets.
      batch_size: global batch size.
      seed: seeds the order of every epoch.
      mesh: the device mesh; batches are split over its 'data' axis.
      chunk_sizes: the steps of each call, in order (see `chunk_plan`).
      steps_per_call: the most steps of a call (the chunks' padded length).
      resident: gather batches on device from `device_table()`; else stream
        the rows from the host.
      position: stream entries consumed before the first chunk.
      prefetch: chunks of a streamed table a background thread prepares
        ahead (0: each when asked). A resident table's chunks are always
        made when asked: they are only indices, and handing them between
        threads costs more than making them (~0.2 ms against ~0.1 ms a call
        here), while the devices run the previous call anyway.
    """
    self._sharding = sharding.batch_sharding(mesh)
    check_batch_size(batch_size, self._sharding, 'batch_size')
    self._x, self._y = x_NxF, y_NxT
    self._batch_size = batch_size
    self._seed = seed
    self._k = steps_per_call
    self.resident = resident
    self._rows = process_rows(self._sharding, batch_size)
    self.chunk_sharding = sharding.chunk_sharding(mesh)
    self._replicated = sharding.replicated(mesh)
    self._perms: dict[int, np.ndarray] = {}
    self._sizes = iter(chunk_sizes)
    self.position = position
    self._next_produced = position
    self._prefetcher = (_Prefetcher(self._produce, prefetch)
                        if prefetch and not resident else None)

  @property
  def num_examples(self) -> int:
    return self._x.shape[0]

  def device_table(self) -> dict[str, jax.Array]:
    """The whole table on every device (resident mode): {'x', 'y'}."""
    return {name: jax.make_array_from_process_local_data(
        self._replicated, table, table.shape)
            for name, table in (('x', self._x), ('y', self._y))}

  def indices(self, position: int, num_batches: int = 1) -> np.ndarray:
    """Table rows of this process's part of `num_batches` batches.

    Returns:
      rows_KxB: row k holds this process's entries of the batch that starts
      at stream entry `position + k * batch_size`.
    """
    # The batches are one contiguous stretch of the stream: copy it out of
    # the epochs' permutations slice by slice, then keep this process's
    # columns of each batch.
    n = self.num_examples
    end = position + num_batches * self._batch_size
    pieces = []
    while position < end:
      epoch, offset = divmod(position, n)
      take = min(n - offset, end - position)
      pieces.append(self._permutation(epoch)[offset:offset + take])
      position += take
    stream = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    return stream.reshape(num_batches, self._batch_size)[:, self._rows]

  def _permutation(self, epoch: int) -> np.ndarray:
    if epoch not in self._perms:
      # Keep only the epochs a batch can still reach.
      self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
      self._perms[epoch] = epoch_permutation(
          self._seed, epoch, self.num_examples).astype(np.int32)
    return self._perms[epoch]

  def _produce(self) -> tuple[int, dict[str, jax.Array]]:
    num_steps = next(self._sizes, None)
    if num_steps is None:
      raise StopIteration('the chunk plan is exhausted')
    idx_KxB = np.zeros((self._k, self._rows.stop - self._rows.start),
                       np.int32)
    idx_KxB[:num_steps] = self.indices(self._next_produced, num_steps)
    self._next_produced += num_steps * self._batch_size
    if self.resident and jax.process_count() == 1:
      return num_steps, {'idx': idx_KxB}
    local = ({'idx': idx_KxB} if self.resident else
             {'x': self._x[idx_KxB], 'y': self._y[idx_KxB]})
    return num_steps, {name: jax.make_array_from_process_local_data(
        self.chunk_sharding, a, (self._k, self._batch_size) + a.shape[2:])
                       for name, a in local.items()}

  def __iter__(self) -> Iterator[tuple[int, dict[str, jax.Array]]]:
    return self

  def __next__(self) -> tuple[int, dict[str, jax.Array]]:
    """(steps in the chunk, the chunk)."""
    num_steps, chunk = (self._prefetcher.get() if self._prefetcher
                        else self._produce())
    self.position += num_steps * self._batch_size
    return num_steps, chunk

  def close(self):
    if self._prefetcher:
      self._prefetcher.close()


def eval_batches(x_NxF: np.ndarray, y_NxT: np.ndarray | None, *,
                 batch_size: int,
                 sharding: NamedSharding) -> Iterator[dict[str, jax.Array]]:
  """Every example of a split exactly once, in table order.

  The last batch is padded with copies of row 0 and masked out, so every
  process runs the same number of steps, ceil(N / batch_size), and each
  example counts once whatever the batch size and device count.

  Args:
    x_NxF: features.
    y_NxT: targets, or None for prediction (batches then have no 'y').
    batch_size: global batch size.
    sharding: the batch sharding.

  Yields:
    dicts `{'x': x_BxF, 'y': y_BxT, 'mask': mask_B}` of global arrays.
  """
  check_batch_size(batch_size, sharding, 'eval_batch_size')
  n = x_NxF.shape[0]
  rows = process_rows(sharding, batch_size)
  for start in range(0, n, batch_size):
    entries = start + np.arange(rows.start, rows.stop)
    mask = entries < n
    idx = np.where(mask, entries, 0)
    local = {'x': x_NxF[idx], 'mask': mask}
    if y_NxT is not None:
      local['y'] = y_NxT[idx]
    yield {name: jax.make_array_from_process_local_data(
        sharding, a, (batch_size,) + a.shape[1:]) for name, a in local.items()}
