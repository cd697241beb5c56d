"""The bound on device work dispatched but not yet finished.

XLA:CPU deadlocks in its collectives when many multi-device executions are
queued at once (in one process with many virtual devices, and across
processes with gloo). Two in flight keep the device busy while the host
prepares the next, and let the host read each result soon after it lands.
Every dispatch loop of meshfit (training calls, evaluation and prediction
batches) goes through this bound.
"""

import collections
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

import jax

MAX_IN_FLIGHT = 2

T = TypeVar('T')


class InFlight(Generic[T]):
  """Dispatched items (whatever identifies a dispatch), oldest first."""

  def __init__(self, limit: int = MAX_IN_FLIGHT):
    self._limit = limit
    self._pending: collections.deque[T] = collections.deque()

  def add(self, item: T) -> None:
    """Records a dispatch."""
    self._pending.append(item)

  @property
  def pending(self) -> int:
    """How many items are in flight."""
    return len(self._pending)

  @property
  def newest(self) -> T:
    """The item added last."""
    return self._pending[-1]

  def excess(self) -> Iterator[T]:
    """Removes and yields the oldest items until at most `limit` remain;
    the caller finishes (reads) each before drawing the next."""
    while len(self._pending) > self._limit:
      yield self._pending.popleft()

  def drain(self) -> Iterator[T]:
    """Removes and yields every item, oldest first."""
    while self._pending:
      yield self._pending.popleft()


def fetched(outputs: Iterable[Any],
            limit: int = MAX_IN_FLIGHT) -> Iterator[Any]:
  """Device outputs brought to the host in order, dispatching lazily.

  `outputs` is drawn one item at a time (drawing dispatches the work) and at
  most `limit` drawn outputs are left unfinished.
  """
  in_flight = InFlight(limit)
  for output in outputs:
    in_flight.add(output)
    for done in in_flight.excess():
      yield jax.device_get(done)
  for done in in_flight.drain():
    yield jax.device_get(done)
