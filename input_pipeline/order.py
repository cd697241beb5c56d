"""The order in which training examples are read, and reading ahead.

Training examples form one endless stream: epoch e is the permutation of the
table drawn from (seed, e), and the global batch at step s is stream entries
[s * B, (s + 1) * B). Each member of an ensemble reads its own stream, drawn
from (seed, member, e); member 0's is the stream of a single model. A batch therefore holds the same examples whatever the
number of processes and devices, and the whole input position is a single
integer (stream entries consumed), saved in every checkpoint.

Nothing here knows of devices: `meshfit/feeding.py` asks for the rows of
the devices of this process and places them.
"""

import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np


# Member m's epochs are drawn from Philox keys [seed, epoch + m * this]: far
# apart, so no member ever reads another's epoch.
_MEMBER_STRIDE = 1 << 40


def epoch_permutation(seed: int, epoch: int, num_examples: int,
                      member: int = 0) -> np.ndarray:
  """The example order of one epoch; depends on nothing but its arguments."""
  rng = np.random.Generator(np.random.Philox(
      key=[seed, epoch + member * _MEMBER_STRIDE]))
  return rng.permutation(num_examples)


class ExampleOrder:
  """Which table rows the batches at a stream position hold."""

  def __init__(self, num_examples: int, batch_size: int, seed: int,
               member: int = 0):
    """Args:
      num_examples: rows of the training table.
      batch_size: global batch size.
      seed: seeds the order of every epoch.
      member: whose stream (an ensemble's member).
    """
    self.num_examples = num_examples
    self.batch_size = batch_size
    self._seed, self._member = seed, member
    self._perms: dict[int, np.ndarray] = {}

  def rows(self, position: int, num_batches: int,
           columns: slice = slice(None)) -> np.ndarray:
    """Table rows of `num_batches` consecutive batches.

    Args:
      position: the stream entry the first batch starts at.
      num_batches: K, how many batches.
      columns: which entries of each batch (e.g. those of one process's
        devices); default all B.

    Returns:
      rows_KxB, int32: row k holds the chosen entries of the batch that
      starts at stream entry `position + k * batch_size`.
    """
    # The batches are one contiguous stretch of the stream: copy it out of
    # the epochs' permutations slice by slice, then keep the chosen columns.
    n = self.num_examples
    end = position + num_batches * self.batch_size
    pieces = []
    while position < end:
      epoch, offset = divmod(position, n)
      take = min(n - offset, end - position)
      pieces.append(self._permutation(epoch)[offset:offset + take])
      position += take
    stream = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    return stream.reshape(num_batches, self.batch_size)[:, columns]

  def _permutation(self, epoch: int) -> np.ndarray:
    if epoch not in self._perms:
      # Keep only the epochs a batch can still reach.
      self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
      self._perms[epoch] = epoch_permutation(
          self._seed, epoch, self.num_examples, self._member).astype(np.int32)
    return self._perms[epoch]


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
