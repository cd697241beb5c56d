"""meshfit.feeding: batches on the mesh, resumable, every example once."""

import itertools
import threading

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from meshfit.input_pipeline import order, tables
from meshfit.data import feeding, row_order
from meshfit.parallel import sharding

N, F = 100, 3


@pytest.fixture
def table():
  x = np.arange(N * F, dtype=np.float32).reshape(N, F)
  y = np.arange(N, dtype=np.float32)[:, None]
  return x, y


def _feed(table, mesh, *, steps_per_call=1, resident=False, batch_size=16,
          seed=3, **kwargs):
  x, y = table
  return feeding.TrainFeed(
      tables.Table(x, y, tables.generated_plan(F, 1)), batch_size=batch_size, seed=seed, mesh=mesh,
      steps_per_call=steps_per_call, resident=resident, **kwargs)


def _chunks(feed, chunk_sizes=None, steps_per_call=1):
  return feed.chunks(itertools.repeat(steps_per_call) if chunk_sizes is None
                     else chunk_sizes)


def _batches(table, mesh, num, member=0, **kwargs):
  """`num` streamed batches of a member, one per chunk, as host arrays."""
  feed = _feed(table, mesh, **kwargs)
  try:
    chunks, out = _chunks(feed), []
    for _ in range(num):
      num_steps, chunk = next(chunks)
      assert num_steps == 1 and set(chunk) == {'x', 'y'}
      out.append({k: np.asarray(chunk[k])[0, member] for k in ('x', 'y')})
    return out, feed.position
  finally:
    feed.close()


def test_each_epoch_visits_every_example_once(table):
  """A table in memory: each epoch is N consecutive entries of the stream,
  every row once, in an order of its own."""
  batches, _ = _batches(table, sharding.make_mesh(8, 1), 25)  # 4 epochs
  stream = np.concatenate([b['y'][:, 0] for b in batches]).astype(int)
  for epoch in range(4):
    assert sorted(stream[epoch * N:(epoch + 1) * N]) == list(range(N))
  assert not np.array_equal(stream[:N], stream[N:2 * N])  # reshuffled


def test_rows_stay_paired(table):
  batches, _ = _batches(table, sharding.make_mesh(4, 2), 3)
  for b in batches:
    np.testing.assert_array_equal(b['x'][:, 0], b['y'][:, 0] * F)


@pytest.mark.parametrize('shape', [(4, 2), (2, 4), (1, 8)])
def test_global_batch_is_the_same_on_every_mesh(table, shape):
  reference, _ = _batches(table, sharding.make_mesh(8, 1), 10)
  other, _ = _batches(table, sharding.make_mesh(*shape), 10)
  for a, b in zip(reference, other):
    np.testing.assert_array_equal(a['x'], b['x'])


def test_global_batch_is_the_same_on_one_device(table):
  reference, _ = _batches(table, sharding.make_mesh(8, 1), 10)
  one, _ = _batches(table, sharding.make_mesh(1, 1, jax.devices()[:1]), 10)
  for a, b in zip(reference, one):
    np.testing.assert_array_equal(a['y'], b['y'])


def test_position_counts_consumed_batches_not_prefetched_ones(table):
  _, position = _batches(table, sharding.make_mesh(8, 1), 5, prefetch=4)
  assert position == 5 * 16


def test_restarting_at_a_position_continues_the_stream(table):
  mesh = sharding.make_mesh(8, 1)
  whole, _ = _batches(table, mesh, 12)
  _, position = _batches(table, mesh, 7)
  rest, _ = _batches(table, mesh, 5, position=position)
  for a, b in zip(whole[7:], rest):
    np.testing.assert_array_equal(a['x'], b['x'])


def _device_rows(feed, chunk):
  """The rows the training call computes on the devices from a resident
  chunk (K x M x B)."""
  mesh = feed.chunk_sharding.mesh
  return np.asarray(jax.jit(row_order.device_rows, static_argnums=1)(
      chunk, mesh))


def test_chunks_are_sharded_over_data_along_the_batch(table):
  mesh = sharding.make_mesh(4, 2)
  feed = _feed(table, mesh, steps_per_call=3)
  _, chunk = next(_chunks(feed, steps_per_call=3))
  feed.close()
  assert feed.chunk_sharding.spec == P(None, 'members', 'data')
  assert chunk['x'].sharding == feed.chunk_sharding
  assert {s.data.shape for s in chunk['x'].addressable_shards} == {
      (3, 1, 4, F)}
  feed = _feed(table, mesh, steps_per_call=3, resident=True)
  _, chunk = next(_chunks(feed, steps_per_call=3))
  feed.close()
  # One process: where each member stands, as numpy int32s for the jitted
  # call to place (several processes get global arrays); the rest is on the
  # devices already, and the rows the devices make are split like a batch.
  assert {k: (type(v), v.dtype, v.shape) for k, v in chunk.items()
          if k != 'order'} == {'epoch_M': (np.ndarray, np.int32, (1,)),
                               'offset_M': (np.ndarray, np.int32, (1,))}
  assert all(isinstance(a, jax.Array) for a in chunk['order'].values())
  rows = jax.jit(row_order.device_rows, static_argnums=1)(chunk, mesh)
  assert rows.shape == (3, 1, 16)
  assert rows.sharding.is_equivalent_to(feed.chunk_sharding, 3)
  assert {s.data.shape for s in rows.addressable_shards} == {(3, 1, 4)}


def test_the_devices_make_the_rows_the_host_streams(table):
  mesh = sharding.make_mesh(4, 2)
  sizes = [5, 2, 5, 1, 5, 5, 5]  # past an epoch of 100 rows
  streamed = _feed(table, mesh, steps_per_call=5, members=2)
  resident = _feed(table, mesh, steps_per_call=5, resident=True, members=2)
  streamed_chunks, resident_chunks = streamed.chunks(sizes), resident.chunks(
      sizes)
  try:
    x = np.asarray(resident.device_table()['x'])
    # The table's rows, then zeros up to a length shared with its neighbours.
    assert x.shape == (feeding.padded_rows(N), F)
    np.testing.assert_array_equal(x[:N], table[0])
    assert not x[N:].any()
    for size in sizes:
      (n, rows), (m, chunk) = next(streamed_chunks), next(resident_chunks)
      assert n == m == size
      idx = _device_rows(resident, chunk)
      np.testing.assert_array_equal(x[idx[:n]], np.asarray(rows['x'])[:n])
      # Padding past num_steps (never read by the step): zeros.
      assert not np.asarray(rows['x'])[n:].any()
    assert streamed.position == resident.position == sum(sizes) * 16
    with pytest.raises(StopIteration):
      next(resident_chunks)
  finally:
    streamed.close()
    resident.close()


def test_resident_tables_of_nearby_lengths_share_a_padded_length():
  lengths = [feeding.padded_rows(n) for n in range(1, 5000)]
  assert all(p >= n and p <= max(feeding.MIN_PADDED_ROWS, n * 9 / 8)
             for n, p in zip(range(1, 5000), lengths))
  # Five folds' training rows of 1,000, 1,003 and 1,010 rows: one length.
  assert len({feeding.padded_rows(n) for n in (800, 802, 808)}) == 1
  assert len(set(lengths)) < 60


def test_folds_of_nearby_lengths_give_the_training_call_one_shape():
  """A cross-validation's folds train on a few rows more or fewer: the
  arrays their resident chunks hand the training call have one shape."""
  mesh = sharding.make_mesh(8, 1)
  shapes = set()
  for n in (800, 802, 808):
    x, y = np.zeros((n, F), np.float32), np.zeros((n, 1), np.float32)
    feed = _feed((x, y), mesh, members=5, resident=True, steps_per_call=4)
    _, chunk = next(feed.chunks([4]))
    feed.close()
    shapes.add(tuple(sorted((k, v.shape) for k, v in chunk['order'].items())))
  assert len(shapes) == 1


def test_chunks_of_several_steps_hold_the_stream_in_order(table):
  mesh = sharding.make_mesh(8, 1)
  single, _ = _batches(table, mesh, 9)
  feed = _feed(table, mesh, steps_per_call=4)
  chunks = list(feed.chunks([4, 4, 1]))
  feed.close()
  joined = np.concatenate([np.asarray(c['y'])[:n, 0] for n, c in chunks])
  np.testing.assert_array_equal(joined, np.stack([b['y'] for b in single]))


def test_each_member_reads_its_own_stream(table):
  """Member 0 reads the single model's stream; the others their own, each
  an epoch of every example, whatever the number of members."""
  mesh = sharding.make_mesh(8, 1)
  single, _ = _batches(table, mesh, 25)
  members = [_batches(table, mesh, 25, member=m, members=3)[0]
             for m in range(3)]
  ys = [np.concatenate([b['y'][:, 0] for b in batches]).astype(int)
        for batches in [single, *members]]
  np.testing.assert_array_equal(ys[1], ys[0])
  assert not np.array_equal(ys[2], ys[1])
  assert not np.array_equal(ys[3], ys[2])
  for epoch in range(4):
    assert sorted(ys[3][epoch * N:(epoch + 1) * N]) == list(range(N))
  five, _ = _batches(table, mesh, 25, member=2, members=5)
  np.testing.assert_array_equal(
      np.concatenate([b['y'][:, 0] for b in five]).astype(int), ys[3])


@pytest.mark.parametrize('resident', [False, True])
def test_cross_fitted_members_read_only_their_own_rows(table, resident):
  """Member m reads every fold but fold m % 2, each row once an epoch."""
  folds = order.fold_blocks(N, 2, seed=1, stream=5)
  own = [order.Blocks.union([folds[1]]), order.Blocks.union([folds[0]])]
  feed = _feed(table, sharding.make_mesh(8, 1), members=4, resident=resident,
               member_blocks=[own[m % 2] for m in range(4)])
  try:
    chunks = _chunks(feed)
    rows = [[] for _ in range(4)]
    for _ in range(2 * N // 16):  # about four epochs of 50 rows
      _, chunk = next(chunks)
      for m in range(4):
        if resident:
          rows[m].extend(_device_rows(feed, chunk)[0, m].tolist())
        else:
          rows[m].extend(np.asarray(chunk['y'])[0, m, :, 0].astype(int))
  finally:
    feed.close()
  for m in range(4):
    allowed = set(own[m % 2].rows().tolist())
    assert set(rows[m]) == allowed, m  # all of them, nothing else
  assert rows[0] != rows[2]  # the two bags' orders differ


@pytest.mark.parametrize('members_axis, data', [(4, 2), (2, 2)])
def test_member_batches_are_the_same_over_the_members_axis(table,
                                                           members_axis,
                                                           data):
  reference = _feed(table, sharding.make_mesh(8, 1), members=4,
                    steps_per_call=2)
  mesh = sharding.make_mesh(data, 8 // (members_axis * data),
                            members=members_axis)
  feed = _feed(table, mesh, members=4, steps_per_call=2)
  try:
    (_, a), (_, b) = next(reference.chunks([2])), next(feed.chunks([2]))
    np.testing.assert_array_equal(np.asarray(a['x']), np.asarray(b['x']))
    assert {s.data.shape[1] for s in b['x'].addressable_shards} == {
        4 // members_axis}
  finally:
    reference.close()
    feed.close()


@pytest.mark.parametrize('batch_size', [8, 24, 96, 104, 200])
def test_eval_batches_cover_every_example_once(table, batch_size):
  x, y = table
  mesh = sharding.make_mesh(4, 2)
  seen = []
  steps = 0
  for batch in feeding.eval_batches(
      x, y, batch_size=batch_size,
      batch_sharding=sharding.batch_sharding(mesh)):
    mask = np.asarray(batch['mask'])
    seen.extend(np.asarray(batch['y'])[mask, 0].astype(int))
    steps += 1
  assert sorted(seen) == list(range(N))
  assert steps == -(-N // batch_size)


def test_call_lengths_are_drawn_in_the_callers_thread(table):
  """The plan may ask the loop's checkpoint policy: never from the
  prefetch thread, and never further ahead than the prefetch."""
  drawn = []

  def sizes():
    for _ in range(6):
      drawn.append(threading.current_thread())
      yield 1
  feed = _feed(table, sharding.make_mesh(8, 1), prefetch=3)
  try:
    chunks = feed.chunks(sizes())
    next(chunks)
    assert len(drawn) == 4  # the call taken and the 3 prefetched
    list(chunks)
  finally:
    feed.close()
  assert drawn == [threading.main_thread()] * 6


class _RecordingTable:
  """A table that records the row ranges read from it."""

  def __init__(self, n: int, f: int = 2):
    self.x = np.arange(n * f, dtype=np.float32).reshape(n, f)
    self.y = np.arange(n, dtype=np.float32)[:, None]
    self.num_examples, self.num_inputs, self.columns = n, f, f + 1
    self.nbytes = self.x.nbytes + self.y.nbytes
    self.reads = []

  def read_rows(self, start, stop):
    self.reads.append((start, stop))
    return np.concatenate([self.x[start:stop], self.y[start:stop]], axis=1)


def test_processes_read_disjoint_blocks_that_cover_their_batches():
  """Two processes, each holding half of every batch (32 of 64 lanes):
  each reads only blocks of its lanes, and together exactly the rows the
  batches hold, each block once."""
  n, batch, steps = 200_000, 256, 400
  reference = order.ExampleOrder(n, batch, seed=7)
  rows_KxB = reference.rows(0, steps)
  read = []
  for half in (slice(0, 128), slice(128, 256)):
    table = _RecordingTable(n)
    windows = feeding._Windows(order.ExampleOrder(n, batch, seed=7), table,
                               half)
    got = np.concatenate([windows.rows(p, 100)
                          for p in range(0, steps * batch, 100 * batch)])
    np.testing.assert_array_equal(got[..., -1], rows_KxB[:, half])
    blocks = {start // order.block_rows(n) for start, _ in table.reads}
    assert all(stop - start <= order.block_rows(n)
               for start, stop in table.reads)
    assert len(blocks) == len(table.reads)  # each block once (one epoch)
    batch_blocks = set(np.unique(rows_KxB[:, half] // order.block_rows(n)))
    assert batch_blocks <= blocks
    read.append(blocks)
  assert not read[0] & read[1]


def test_a_streamed_lane_holds_one_window_or_two():
  n = 10**6
  table = _RecordingTable(n)
  examples = order.ExampleOrder(n, 64, seed=0)
  windows = feeding._Windows(examples, table, slice(0, 64))
  most = 0
  for position in range(0, 3000 * 64, 100 * 64):
    windows.rows(position, 100)
    most = max(most, len(windows._cache))
  assert most <= 2 * examples.lanes
  assert len(table.reads) > 10 * examples.lanes  # windows were replaced
