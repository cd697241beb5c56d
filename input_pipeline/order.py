"""The block order of a table streamed from disk, and reading ahead.

A table prepared on disk (input_pipeline/store.py) is read in blocks, in
this order (a table held in memory reads meshfit/data/row_order.py's):

- The table's rows form *blocks* of `block_rows(N)` consecutive rows (a
  power of two, up to BLOCK_ROWS_MAX; only the table's last block may be
  shorter). Validation holds out whole blocks (`hold_out_blocks`).
- The global batch of B entries is split into L *lanes* of B / L
  consecutive entries (`num_lanes`: up to MAX_LANES, a divisor of B). Each
  lane reads its own endless stream, B / L entries per step.
- Epoch e (of member m) shuffles the training blocks (Philox, keyed by seed,
  e and m; a short block goes last) and deals them to the lanes in turn. A
  lane's epoch is its blocks in that order, cut into *windows* of
  WINDOW_ROWS rows, and each window's rows are sorted by a hash of
  (seed, m, e, row): shuffled within the window.

A lane's epoch has the same length every epoch, so the rows at any input
position follow from the position alone, and the whole input position is a
single integer (stream entries consumed by each member), saved in every
checkpoint. Every lane's epoch holds each of its rows once; lanes dealt one
block more than others (when L does not divide the blocks) start their next
epoch a little later, so a row may come twice, or not, in N consecutive
entries of the stream, by at most one block in MIN_LANE_BLOCKS. A batch holds the same examples on any number of processes and
devices. A process whose devices hold a run of whole lanes reads only those
lanes' blocks: with P processes dividing L, their reads are disjoint.

Nothing here knows of devices: `meshfit/data/feeding.py` asks for the entries of
the devices of this process and places them.
"""

import dataclasses
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# Member m's epochs are drawn from Philox keys [seed, epoch + m * this]: far
# apart, so no member ever reads another's epoch.
_MEMBER_STRIDE = 1 << 40
# Blocks: a streamed read is a block, so large enough to read at disk speed;
# small tables have ~MIN_BLOCKS of them, so holding out and dealing blocks
# stays as fine-grained as rows are.
BLOCK_ROWS_MAX = 1 << 12
MIN_BLOCKS = 1024
# A streamed lane holds its current window in memory (and the next while
# reading ahead): WINDOW_ROWS x (inputs + targets) floats per lane and member.
WINDOW_ROWS = 1 << 15
# Up to this many lanes: a pod of up to this many processes (dividing it)
# reads disjoint blocks.
MAX_LANES = 64
# Lanes get at least this many blocks an epoch: a lane dealt one block more
# than another cycles through its epochs at most 1/this slower.
MIN_LANE_BLOCKS = 16
# Keys that shuffle a window keep this many bits of the row's hash, below
# the window's index.
_HASH_BITS = 40


def block_rows(num_rows: int) -> int:
  """R, the rows of a block of a table of `num_rows` (a power of two)."""
  r = 1
  while r * 2 <= min(BLOCK_ROWS_MAX, num_rows // MIN_BLOCKS):
    r *= 2
  return r


def num_lanes(batch_size: int, num_blocks: int) -> int:
  """L: the largest divisor of the batch size up to MAX_LANES with at least
  MIN_LANE_BLOCKS training blocks per lane (1 for a tiny table)."""
  limit = max(1, min(MAX_LANES, num_blocks // MIN_LANE_BLOCKS))
  return max(d for d in range(1, limit + 1) if batch_size % d == 0)


@dataclasses.dataclass(frozen=True)
class Blocks:
  """Blocks of a table's rows: block i is rows [start[i], stop[i])."""
  start: np.ndarray
  stop: np.ndarray

  @classmethod
  def of_table(cls, num_rows: int, rows: int | None = None) -> 'Blocks':
    """The table's blocks of `rows` rows (default `block_rows(num_rows)`)."""
    r = block_rows(num_rows) if rows is None else rows
    start = np.arange(0, num_rows, r, dtype=np.int64)
    return cls(start, np.minimum(start + r, num_rows))

  @classmethod
  def union(cls, parts: Sequence['Blocks']) -> 'Blocks':
    """The blocks of every part, in table order."""
    start = np.concatenate([p.start for p in parts])
    order = np.argsort(start, kind='stable')
    return cls(start[order], np.concatenate([p.stop for p in parts])[order])

  def __len__(self) -> int:
    return len(self.start)

  def take(self, index: np.ndarray) -> 'Blocks':
    return Blocks(self.start[index], self.stop[index])

  @property
  def num_rows(self) -> int:
    return int((self.stop - self.start).sum())

  def rows(self) -> np.ndarray:
    """Every row of the blocks, in block order (int64)."""
    return _ranges(self.start, self.stop)


def _ranges(start: np.ndarray, stop: np.ndarray) -> np.ndarray:
  """The concatenation of aranges [start[i], stop[i])."""
  sizes = stop - start
  total = int(sizes.sum())
  if not total:
    return np.zeros(0, np.int64)
  # Each row is its block's start plus its position within the block.
  offsets = np.arange(total, dtype=np.int64) - np.repeat(
      np.cumsum(sizes) - sizes, sizes)
  return np.repeat(start, sizes) + offsets


def hold_out_blocks(num_rows: int, fraction: float, seed: int, stream: int
                    ) -> tuple[Blocks, Blocks] | None:
  """(training blocks, held-out blocks): `fraction` of the table's blocks,
  drawn from (seed, stream), each list in table order; None if that leaves
  none to hold out or none to train on."""
  blocks = Blocks.of_table(num_rows)
  n = len(blocks)
  held = int(round(fraction * n))
  if held < 1 or held >= n:
    return None
  rng = np.random.Generator(np.random.Philox(key=[seed, stream]))
  chosen = np.zeros(n, bool)
  chosen[rng.permutation(n)[:held]] = True
  return blocks.take(np.flatnonzero(~chosen)), blocks.take(
      np.flatnonzero(chosen))


def fold_blocks(num_rows: int, folds: int, seed: int, stream: int,
                rows: int | None = None) -> list[Blocks] | None:
  """The table's blocks (of `rows` rows; default `block_rows`) dealt into
  `folds` folds of as equal a size as the blocks allow, drawn from (seed,
  stream), each fold's blocks in table order; None if some fold would be
  empty."""
  blocks = Blocks.of_table(num_rows, rows)
  n = len(blocks)
  if n < folds:
    return None
  rng = np.random.Generator(np.random.Philox(key=[seed, stream]))
  fold_of_block = np.empty(n, np.int64)
  fold_of_block[rng.permutation(n)] = np.arange(n) % folds
  return [blocks.take(np.flatnonzero(fold_of_block == f))
          for f in range(folds)]


def epoch_permutation(seed: int, epoch: int, num_examples: int,
                      member: int = 0) -> np.ndarray:
  """A permutation of range(num_examples) that depends on nothing but its
  arguments (an epoch's order of blocks)."""
  rng = np.random.Generator(np.random.Philox(
      key=[seed, epoch + member * _MEMBER_STRIDE]))
  return rng.permutation(num_examples)


def _mix(z: np.ndarray) -> np.ndarray:
  """splitmix64's finaliser: a bijective hash of uint64s."""
  with np.errstate(over='ignore'):
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return z ^ (z >> np.uint64(31))


@dataclasses.dataclass(frozen=True)
class Piece:
  """Entries [start, stop) of window `window` of a lane's epoch `epoch`."""
  epoch: int
  lane: int
  window: int
  start: int
  stop: int


class ExampleOrder:
  """Which rows the batches at a stream position hold (one member's)."""

  def __init__(self, blocks: Blocks | int, batch_size: int, seed: int,
               member: int = 0):
    """Args:
      blocks: the training blocks (`Blocks`), or the number of rows of a
        table trained on whole.
      batch_size: B, the global batch size.
      seed: seeds the order of every epoch.
      member: whose stream (an ensemble's member).
    """
    if isinstance(blocks, (int, np.integer)):
      blocks = Blocks.of_table(int(blocks))
    sizes = blocks.stop - blocks.start
    if not len(blocks) or (sizes[:-1] != sizes.max()).any():
      raise ValueError('training blocks must be of one size but the last')
    self.blocks = blocks
    self.num_examples = blocks.num_rows
    self.batch_size = batch_size
    self._seed, self._member = seed, member
    self._block_rows = int(sizes.max())
    # A last block shorter than the rest is dealt last in every epoch, so
    # that each lane's epoch has the same length every epoch.
    self._short = bool(sizes[-1] < self._block_rows)
    nb = len(blocks)
    self.lanes = num_lanes(batch_size, nb)
    self.lane_entries = batch_size // self.lanes
    self._window_blocks = max(1, WINDOW_ROWS // self._block_rows)
    counts = np.array([len(range(lane, nb, self.lanes))
                       for lane in range(self.lanes)])
    self._lane_rows = counts * self._block_rows
    if self._short:
      self._lane_rows[(nb - 1) % self.lanes] -= (self._block_rows
                                                  - int(sizes[-1]))
    self._block_orders: dict[int, np.ndarray] = {}
    self._epochs: dict[int, np.ndarray] = {}
    with np.errstate(over='ignore'):
      self._hash_base = _mix(np.array([seed], np.uint64))[0] ^ _mix(
          np.array([member], np.uint64) + np.uint64(1 << 32))[0]

  def lane_pieces(self, lane: int, position: int, num_batches: int
                  ) -> list[Piece]:
    """The windows' entries that lane `lane` reads for `num_batches` steps
    from stream position `position` (a multiple of the batch size)."""
    if position % self.batch_size:
      raise ValueError(f'position {position} is not a multiple of the '
                       f'batch size {self.batch_size}')
    n = int(self._lane_rows[lane])
    at = position // self.batch_size * self.lane_entries
    end = at + num_batches * self.lane_entries
    pieces = []
    while at < end:
      epoch, offset = divmod(at, n)
      window, within = divmod(offset, self._window_blocks * self._block_rows)
      window_end = min(n - offset + within,
                       self._window_blocks * self._block_rows)
      take = min(window_end - within, end - at)
      pieces.append(Piece(epoch, lane, window, within, within + take))
      at += take
    return pieces

  def lanes_of(self, columns: slice) -> range:
    """The lanes holding batch entries `columns`."""
    start, stop, _ = columns.indices(self.batch_size)
    return range(start // self.lane_entries,
                 (stop - 1) // self.lane_entries + 1)

  def rows(self, position: int, num_batches: int,
           columns: slice = slice(None)) -> np.ndarray:
    """Table rows of `num_batches` consecutive batches, each lane's epoch
    computed whole: the definition the tests hold the streamed feed's
    windows (`lane_pieces`, `shuffle_windows`) to.

    Args:
      position: the stream entry the first batch starts at (a multiple of
        the batch size).
      num_batches: K, how many batches.
      columns: which entries of each batch (e.g. those of one process's
        devices); default all B.

    Returns:
      rows_KxB, int64: row k holds the chosen entries of the batch that
      starts at stream entry `position + k * batch_size`.
    """
    if position % self.batch_size:
      raise ValueError(f'position {position} is not a multiple of the '
                       f'batch size {self.batch_size}')
    start, stop, _ = columns.indices(self.batch_size)
    lanes = np.arange(self.lanes_of(columns).start,
                      self.lanes_of(columns).stop)
    # Lane l's entries q of its stream: epoch q // n_l, offset q % n_l.
    first = position // self.batch_size * self.lane_entries
    q = first + np.arange(num_batches * self.lane_entries)
    n = self._lane_rows[lanes][:, None]
    epoch, offset = q[None] // n, q[None] % n
    epochs = range(int(epoch.min()), int(epoch.max()) + 1)
    arranged = [self._epoch_rows(e) for e in epochs]
    self._epochs = {e: self._epochs[e] for e in epochs}
    lane_start = np.cumsum(self._lane_rows) - self._lane_rows
    if len(arranged) == 1:  # most calls: no copy of a large table's epoch
      ids = arranged[0][lane_start[lanes][:, None] + offset]
    else:
      base = np.cumsum([0] + [len(a) for a in arranged])[:-1]
      ids = np.concatenate(arranged)[
          base[epoch - epochs.start] + lane_start[lanes][:, None] + offset]
    # ids: lanes x (K * B / L)
    ids = ids.reshape(len(lanes), num_batches, self.lane_entries)
    ids = ids.transpose(1, 0, 2).reshape(num_batches, -1)
    skip = lanes[0] * self.lane_entries
    return ids[:, start - skip:stop - skip]

  def block_order(self, epoch: int) -> np.ndarray:
    """The training blocks (indices into `blocks`) in epoch `epoch`'s order;
    block j of it goes to lane j % L."""
    if epoch not in self._block_orders:
      self._block_orders = {e: o for e, o in self._block_orders.items()
                            if e >= epoch - 1}
      nb = len(self.blocks)
      full = nb - 1 if self._short else nb
      order = epoch_permutation(self._seed, epoch, full, self._member)
      if self._short:
        order = np.append(order, nb - 1)
      self._block_orders[epoch] = order
    return self._block_orders[epoch]

  def window_blocks(self, epoch: int, lane: int, window: int) -> np.ndarray:
    """The blocks (indices into `blocks`) of a window, in lane order."""
    order = self.block_order(epoch)
    first = lane + self.lanes * self._window_blocks * window
    return order[first:first + self.lanes * self._window_blocks:self.lanes]

  def shuffle_windows(self, epoch: int, blocks_of_windows: Sequence[
      np.ndarray]) -> list[np.ndarray]:
    """Each window's rows (the rows of its blocks, in order) as positions
    into them in shuffled order; vectorised over the windows given.

    A row's place within its window is set by a hash of (seed, member,
    epoch, row), so any process computes any window alike.
    """
    sizes = [int((self.blocks.stop[b] - self.blocks.start[b]).sum())
             for b in blocks_of_windows]
    blocks = np.concatenate(blocks_of_windows)
    rows = _ranges(self.blocks.start[blocks], self.blocks.stop[blocks])
    keys = self._keys(epoch, rows)
    window_of_row = np.repeat(np.arange(len(sizes), dtype=np.uint64), sizes)
    keys |= window_of_row << np.uint64(_HASH_BITS)
    order = np.argsort(keys, kind='stable')
    bounds = np.cumsum([0] + sizes)
    return [order[a:b] - a for a, b in zip(bounds[:-1], bounds[1:])]

  def _epoch_rows(self, epoch: int) -> np.ndarray:
    """Every lane's epoch `epoch`, lane after lane, each its windows in
    order, shuffled (`shuffle_windows`, vectorised over the whole epoch: a
    small table's epochs are many and short)."""
    if epoch not in self._epochs:
      order = self.block_order(epoch)
      nb, lanes = len(order), self.lanes
      # Positions j of the epoch's blocks, lane-major (lane j % L, then j).
      grid = np.arange(-(-nb // lanes) * lanes).reshape(-1, lanes).T
      by_lane = grid[grid < nb]
      blocks = order[by_lane]
      window = ((by_lane % lanes) * nb + by_lane // lanes
                // self._window_blocks).astype(np.uint64)
      if self._block_rows == 1:
        rows, window_of_row = self.blocks.start[blocks], window
      else:
        rows = _ranges(self.blocks.start[blocks], self.blocks.stop[blocks])
        window_of_row = np.repeat(
            window, self.blocks.stop[blocks] - self.blocks.start[blocks])
      keys = self._keys(epoch, rows) | (window_of_row
                                        << np.uint64(_HASH_BITS))
      self._epochs[epoch] = rows[np.argsort(keys, kind='stable')]
    return self._epochs[epoch]

  def _keys(self, epoch: int, rows: np.ndarray) -> np.ndarray:
    """Each row's shuffling key in `epoch`, _HASH_BITS wide."""
    with np.errstate(over='ignore'):
      epoch_key = _mix(np.array([epoch], np.uint64) ^ self._hash_base)
      return _mix(rows.astype(np.uint64) ^ epoch_key) >> np.uint64(
          64 - _HASH_BITS)


class Prefetcher:
  """Runs `produce(request)` in a thread for each request, in order.

  Results are kept up to `size` ahead of the consumer. An exception raised
  by `produce` is handed to the consumer and raised by its `get`; the thread
  then stops.
  """

  def __init__(self, produce: Callable[[Any], Any], size: int):
    self._produce = produce
    self._requests = queue.Queue()
    self._results = queue.Queue(maxsize=max(size, 1))
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name='meshfit-prefetch')
    self._thread.start()

  def request(self, argument: Any) -> None:
    """Asks for `produce(argument)`; `get` returns results in request order."""
    self._requests.put(argument)

  def _run(self):
    while not self._stop.is_set():
      try:
        argument = self._requests.get(timeout=0.1)
      except queue.Empty:
        continue
      try:
        item = (self._produce(argument), None)
      except Exception as e:  # handed to the consumer, raised there
        item = (None, e)
      while not self._stop.is_set():
        try:
          self._results.put(item, timeout=0.1)
          break
        except queue.Full:
          continue
      if item[1] is not None:
        return

  def get(self) -> Any:
    """The next result; blocks until it is produced."""
    item, error = self._results.get()
    if error is not None:
      raise error
    return item

  def close(self):
    self._stop.set()
    self._thread.join()
