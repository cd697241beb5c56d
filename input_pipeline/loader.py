"""Turns an in-memory table into global, sharded batches.

Regression tables fit in host memory, so each split is held resident and
batches are gathered from it in vectorised blocks (reading and decoding one
record at a time moves only ~16k rows/s here).

Order. Training examples form one endless stream: epoch e is the permutation
of the table drawn from (seed, e), and the global batch at step s is stream
entries [s * B, (s + 1) * B). The batch therefore holds the same examples
whatever the number of processes and devices, and the whole input position
is a single integer (`position`, entries consumed) saved in every checkpoint.

Placement. Each process gathers only the rows that its own devices hold
under the batch sharding and hands them to
`jax.make_array_from_process_local_data`, which assembles the global array.
"""

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

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


class TrainLoader:
  """An endless, deterministic iterator of global training batches.

  Yields dicts `{'x': x_BxF, 'y': y_BxT}` of global `jax.Array`s sharded by
  `sharding`. `position` is the number of stream entries consumed by the
  batches handed out so far (prefetched ones do not count).
  """

  def __init__(self, x_NxF: np.ndarray, y_NxT: np.ndarray, *,
               batch_size: int, seed: int, sharding: NamedSharding,
               position: int = 0, prefetch: int = 2):
    check_batch_size(batch_size, sharding, 'batch_size')
    self._x, self._y = x_NxF, y_NxT
    self._batch_size = batch_size
    self._seed = seed
    self._sharding = sharding
    self._rows = process_rows(sharding, batch_size)
    self._perms: dict[int, np.ndarray] = {}
    self.position = position
    self._next_produced = position
    self._prefetcher = _Prefetcher(self._produce, prefetch)

  @property
  def num_examples(self) -> int:
    return self._x.shape[0]

  def indices(self, position: int) -> np.ndarray:
    """Table rows of this process's part of the batch that starts at `position`."""
    n = self.num_examples
    entries = position + np.arange(self._rows.start, self._rows.stop)
    epochs = entries // n
    out = np.empty(entries.shape, np.int64)
    for epoch in np.unique(epochs):
      if epoch not in self._perms:
        # Keep only the epochs a batch can still reach.
        self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
        self._perms[epoch] = epoch_permutation(self._seed, int(epoch), n)
      sel = epochs == epoch
      out[sel] = self._perms[epoch][entries[sel] % n]
    return out

  def _produce(self) -> dict[str, jax.Array]:
    idx = self.indices(self._next_produced)
    self._next_produced += self._batch_size
    return {name: jax.make_array_from_process_local_data(
        self._sharding, table[idx],
        (self._batch_size,) + table.shape[1:])
            for name, table in (('x', self._x), ('y', self._y))}

  def __iter__(self) -> Iterator[dict[str, jax.Array]]:
    return self

  def __next__(self) -> dict[str, jax.Array]:
    batch = self._prefetcher.get()
    self.position += self._batch_size
    return batch

  def close(self):
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
