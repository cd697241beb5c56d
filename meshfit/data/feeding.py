"""Where a batch becomes a global, sharded `jax.Array`.

Each process prepares only the rows that its own devices hold under the
batch sharding and hands them to `jax.make_array_from_process_local_data`,
which assembles the global array. Which examples a batch holds is decided by
`meshfit.data.row_order` (a table in memory) or `meshfit.input_pipeline.order`
(a table on disk), the same on any number of processes and devices.

Training runs several steps per jitted call, so the feed hands out chunks of
batches. A table held in memory is read in the order of
`meshfit.data.row_order` (each member's epoch a keyed bijection of its
rows). If it also fits on every device it is copied there once (resident),
and a chunk is then only each member's epoch and offset at the call's first
step: the devices compute the batches' rows themselves inside the training
call and gather them, so the host's part of a call does not grow with its
steps, members or batch. A table held in memory but too large for the
devices is streamed in the same order, its rows gathered on the host.

A table too large for memory (prepared on disk) is streamed in the block
order of input_pipeline/order.py, the chunk holding the rows, prepared ahead
by a thread from the windows of rows its lanes read: a process reads only
the blocks of its own lanes, one window per lane and member at a time (and
the next, ahead), so its memory does not grow with the table.
"""

import collections
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from meshfit.data import row_order
from meshfit.input_pipeline.order import Blocks, ExampleOrder, Prefetcher
from meshfit.input_pipeline.tables import Table
from meshfit.parallel import sharding

Chunk = dict[str, jax.Array | np.ndarray]
# Resident tables of up to this many rows share one length on device.
MIN_PADDED_ROWS = 128


class Rows(Protocol):
  """A training table: `meshfit.input_pipeline.tables.Table` (in memory) or
  `meshfit.input_pipeline.store.Store` (prepared on disk)."""
  num_examples: int
  nbytes: int

  def read_rows(self, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop): inputs then targets, float32."""


def process_block(sharding_: NamedSharding,
                  shape: tuple[int, ...]) -> tuple[slice, ...]:
  """The contiguous block of an array of `shape` that this process's
  devices hold under `sharding_`, one slice per dimension.

  Raises:
    ValueError: the sharding gives this process a non-contiguous set of
      entries along some dimension (a mesh whose axes interleave processes).
  """
  index_map = sharding_.addressable_devices_indices_map(shape)
  block = []
  for dim, size in enumerate(shape):
    held = set()
    for index in index_map.values():
      held.update(range(*index[dim].indices(size)))
    start, stop = min(held), max(held) + 1
    if len(held) != stop - start:
      raise ValueError('this process holds non-contiguous batch entries; '
                       'build the mesh so that each process owns a block of '
                       "the 'members' and 'data' axes")
    block.append(slice(start, stop))
  return tuple(block)


def process_rows(batch_sharding: NamedSharding, global_rows: int) -> slice:
  """The contiguous block of batch rows that this process's devices hold."""
  return process_block(batch_sharding, (global_rows,))[0]


def padded_rows(rows: int) -> int:
  """The rows a resident table is padded to: at least MIN_PADDED_ROWS, and
  at most an eighth more than `rows`, so that tables of nearby lengths (the
  folds of a cross-validation, a refit on more rows) share one compiled
  training program instead of compiling one each."""
  if rows <= MIN_PADDED_ROWS:
    return MIN_PADDED_ROWS
  step = 1 << (rows.bit_length() - 4)
  return -(-rows // step) * step


def order_of(table: Rows) -> str:
  """The order a table's batches are read in: 'rows' for a table in memory
  (`row_order`), 'blocks' for one prepared on disk."""
  return 'rows' if isinstance(table, Table) else 'blocks'


def fits_on_device(table: Rows, limit_mb: int, copies: int = 1) -> bool:
  """Whether a training table is small enough to copy to every device:
  `copies` of it (CPU devices share their host's memory) within the
  limit."""
  return table.nbytes * copies <= limit_mb * 2**20


class TrainFeed:
  """Deterministic chunks of training batches, one chunk per jitted call.

  Each chunk holds the next `num_steps` (at most `steps_per_call`) steps'
  batches, one global batch per member from that member's own stream,
  padded to `steps_per_call`, in one of two forms:

  - resident (`device_table()` was uploaded): `{'order': ..., 'epoch_M',
    'offset_M'}`, where each member's stream stands at the call's first
    step; the jitted call computes the batches' rows from them
    (`row_order.device_rows`) and gathers them from the table on device.
    'order' is the same device arrays every call; `epoch_M` and `offset_M`
    are numpy int32s for one process (placed by the call's in_shardings)
    and replicated global arrays for several.
  - streamed: `{'x': x_KxMxBxF, 'y': y_KxMxBxT}`, the rows themselves, for
    tables too large to hold on every device, global arrays sharded as
    `chunk_sharding` (over 'members' and 'data').

  `order` is 'rows' for a table in memory (`row_order`, resident or not)
  and 'blocks' for one prepared on disk (input_pipeline/order.py).
  `position` is the number of stream entries (of each member's stream) in
  the chunks handed out so far (prefetched ones do not count).
  """

  def __init__(self, table: Rows, *, batch_size: int, seed: int,
               mesh: Mesh, steps_per_call: int, resident: bool,
               blocks: Blocks | None = None, position: int = 0,
               prefetch: int = 2, members: int = 1,
               member_blocks: Sequence[Blocks] | None = None):
    """Args:
      table: the training table (a resident one must be a `Table`).
      batch_size: global batch size (of each member).
      seed: seeds the order of every epoch.
      mesh: the device mesh; batches are split over its 'members' and
        'data' axes.
      steps_per_call: the most steps of a call (the chunks' padded length).
      resident: gather batches on device from `device_table()`; else stream
        the rows from the host.
      blocks: the rows to train on (default: every row of `table`).
      position: stream entries consumed before the first chunk.
      prefetch: chunks of a streamed table a thread prepares ahead (0: each
        when asked). A resident table's chunks are made when asked: they are
        two numbers per member.
      members: M, the ensemble's members, each reading its own stream.
      member_blocks: the rows each member trains on (M of them; cross-
        fitted members leave out their folds); default `blocks` for all.
    """
    self._table = table
    blocks = blocks if blocks is not None else Blocks.of_table(
        table.num_examples)
    self._members, self._rows = process_block(
        sharding.member_batch_sharding(mesh), (members, batch_size))
    if member_blocks is None:
      member_blocks = [blocks] * members
    if resident and not isinstance(table, Table):
      raise ValueError('only a table held in memory can be resident')
    self.order = order_of(table)
    if self.order == 'rows':
      self._member_rows = row_order.MemberRows.of(
          member_blocks, seed,
          padded_rows(max(len(blocks) for blocks in member_blocks)))
      self._local_order = {
          name: a[self._members]
          for name, a in self._member_rows.arrays().items()}
    else:
      orders = [ExampleOrder(member_blocks[m], batch_size, seed, m)
                for m in range(self._members.start, self._members.stop)]
      self._windows = [_Windows(order, table, self._rows)
                       for order in orders]
    self._batch_size, self._num_members = batch_size, members
    self._k = steps_per_call
    self.resident = resident
    self.chunk_sharding = sharding.chunk_sharding(mesh)
    self._replicated = sharding.replicated(mesh)
    self._device_order = None
    self.position = position
    self._next_produced = position
    self._prefetch = prefetch if not resident else 0
    self._prefetcher = (Prefetcher(self._produce, prefetch)
                        if self._prefetch else None)

  def device_table(self) -> dict[str, jax.Array]:
    """The whole table on every device (resident mode): {'x', 'y'}, its
    rows padded with zeros to `padded_rows` (batches never gather them)."""
    rows = padded_rows(len(self._table.x_NxF))
    return {name: self._replicate(padded)
            for name, table in (('x', self._table.x_NxF),
                                ('y', self._table.y_NxT))
            for padded in [np.pad(table, ((0, rows - len(table)), (0, 0)))]}

  def _replicate(self, a: np.ndarray) -> jax.Array:
    return jax.make_array_from_process_local_data(self._replicated, a,
                                                  a.shape)

  def _order_on_devices(self) -> dict[str, jax.Array]:
    """What the devices need to compute every member's batches (resident
    mode), uploaded once."""
    if self._device_order is None:
      arrays = self._member_rows.arrays()
      arrays['step_offset_K'] = (np.arange(self._k, dtype=np.int32)
                                 * self._batch_size)
      arrays['entry_B'] = np.arange(self._batch_size, dtype=np.int32)
      self._device_order = {name: self._replicate(a)
                            for name, a in arrays.items()}
    return self._device_order

  def host_rows(self, position: int, num_batches: int) -> np.ndarray:
    """Table rows of this process's part of `num_batches` steps' batches
    from `position` (K x its members x its entries of each batch), in the
    order the devices compute for a resident table."""
    at = self._member_rows.stream_at(position)
    return row_order.host_rows(
        self._local_order, at['epoch_M'][self._members],
        at['offset_M'][self._members], num_batches, self._batch_size,
        self._rows)

  def _produce(self, num_steps: int) -> Chunk:
    position = self._next_produced
    self._next_produced += num_steps * self._batch_size
    if self.resident:
      at = self._member_rows.stream_at(position)
      if jax.process_count() > 1:
        at = {name: self._replicate(a) for name, a in at.items()}
      return {'order': self._order_on_devices(), **at}
    shape = (self._k, self._members.stop - self._members.start,
             self._rows.stop - self._rows.start)
    if self.order == 'rows':  # gathered straight into each array
      idx = self.host_rows(position, num_steps)
      local = {}
      for name, table in (('x', self._table.x_NxF), ('y', self._table.y_NxT)):
        local[name] = np.zeros(shape + table.shape[1:], np.float32)
        local[name][:num_steps] = table[idx]
    else:
      rows_KxMxBxC = np.zeros(shape + (self._table.columns,), np.float32)
      for m, windows in enumerate(self._windows):
        rows_KxMxBxC[:num_steps, m] = windows.rows(position, num_steps)
      f = self._table.num_inputs
      local = {'x': np.ascontiguousarray(rows_KxMxBxC[..., :f]),
               'y': np.ascontiguousarray(rows_KxMxBxC[..., f:])}
    return {name: jax.make_array_from_process_local_data(
        self.chunk_sharding, a,
        (self._k, self._num_members, self._batch_size) + a.shape[3:])
            for name, a in local.items()}

  def chunks(self, sizes: Iterable[int]) -> Iterator[tuple[int, Chunk]]:
    """(steps, chunk) for each call length of `sizes`, in order.

    `sizes` is drawn in the caller's thread, as the calls are taken (up to
    `prefetch` + 1 ahead for a streamed table), so the loop that plans the
    calls decides them itself.
    """
    sizes = iter(sizes)
    planned = collections.deque()
    while True:
      if self._prefetcher is None:
        num_steps = next(sizes, None)
        if num_steps is None:
          return
        chunk = self._produce(num_steps)
      else:
        while len(planned) <= self._prefetch:
          num_steps = next(sizes, None)
          if num_steps is None:
            break
          planned.append(num_steps)
          self._prefetcher.request(num_steps)
        if not planned:
          return
        num_steps, chunk = planned.popleft(), self._prefetcher.get()
      self.position += num_steps * self._batch_size
      yield num_steps, chunk

  def close(self):
    if self._prefetcher:
      self._prefetcher.close()


class _Windows:
  """One member's lanes' windows of rows, read from the table as needed.

  A window is read whole (its blocks, then shuffled) when a batch first
  needs it and dropped once the lane has moved past it, so a process holds
  about one window per lane it reads (two while a batch spans both).
  """

  def __init__(self, order: ExampleOrder, table: Rows, columns: slice):
    self._order, self._table, self._columns = order, table, columns
    self._cache: dict[tuple[int, int, int], np.ndarray] = {}

  def rows(self, position: int, num_batches: int) -> np.ndarray:
    """K x (this process's entries) x columns rows, from `position`."""
    order = self._order
    lanes = order.lanes_of(self._columns)
    per_lane, keep = [], set()
    for lane in lanes:
      pieces = order.lane_pieces(lane, position, num_batches)
      per_lane.append(np.concatenate(
          [self._window(p.epoch, lane, p.window)[p.start:p.stop]
           for p in pieces]).reshape(num_batches, order.lane_entries, -1))
      last = pieces[-1]
      keep.add((last.epoch, lane, last.window))
    # Only the last window of each lane can be read again by the next call.
    self._cache = {k: v for k, v in self._cache.items() if k in keep}
    skip = lanes.start * order.lane_entries
    start, stop, _ = self._columns.indices(order.batch_size)
    return np.concatenate(per_lane, axis=1)[:, start - skip:stop - skip]

  def _window(self, epoch: int, lane: int, window: int) -> np.ndarray:
    key = (epoch, lane, window)
    if key not in self._cache:
      order = self._order
      blocks = order.window_blocks(epoch, lane, window)
      rows = np.concatenate([
          self._table.read_rows(int(order.blocks.start[b]),
                                int(order.blocks.stop[b])) for b in blocks])
      self._cache[key] = rows[order.shuffle_windows(epoch, [blocks])[0]]
    return self._cache[key]


def eval_batches(x_NxF: np.ndarray, y_NxT: np.ndarray | None, *,
                 batch_size: int,
                 batch_sharding: NamedSharding
                 ) -> Iterator[dict[str, jax.Array]]:
  """Every example of a split exactly once, in table order.

  The last batch is padded with copies of row 0 and masked out, so every
  process runs the same number of steps, ceil(N / batch_size), and each
  example counts once whatever the batch size and device count.

  Args:
    x_NxF: features.
    y_NxT: targets, or None for prediction (batches then have no 'y').
    batch_size: global batch size.
    batch_sharding: how a batch is laid out over the mesh.

  Yields:
    dicts `{'x': x_BxF, 'y': y_BxT, 'mask': mask_B}` of global arrays.
  """
  n = x_NxF.shape[0]
  rows = process_rows(batch_sharding, batch_size)
  for start in range(0, n, batch_size):
    entries = start + np.arange(rows.start, rows.stop)
    mask = entries < n
    idx = np.where(mask, entries, 0)
    local = {'x': x_NxF[idx], 'mask': mask}
    if y_NxT is not None:
      local['y'] = y_NxT[idx]
    yield {name: jax.make_array_from_process_local_data(
        batch_sharding, a, (batch_size,) + a.shape[1:])
           for name, a in local.items()}
