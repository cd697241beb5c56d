"""The input pipeline: order, placement, resumable position, evaluation."""

import itertools

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from input_pipeline import loader
from meshfit import sharding
from meshfit.errors import UsageError

N, F = 100, 3


@pytest.fixture
def table():
  x = np.arange(N * F, dtype=np.float32).reshape(N, F)
  y = np.arange(N, dtype=np.float32)[:, None]
  return x, y


def _loader(table, mesh, *, chunk_sizes=None, steps_per_call=1,
            resident=False, batch_size=16, seed=3, **kwargs):
  x, y = table
  return loader.TrainLoader(
      x, y, batch_size=batch_size, seed=seed, mesh=mesh,
      chunk_sizes=(itertools.repeat(steps_per_call) if chunk_sizes is None
                   else chunk_sizes),
      steps_per_call=steps_per_call, resident=resident, **kwargs)


def _batches(table, mesh, num, **kwargs):
  """`num` streamed batches, one per chunk, as host arrays."""
  it = _loader(table, mesh, **kwargs)
  try:
    out = []
    for _ in range(num):
      num_steps, chunk = next(it)
      assert num_steps == 1 and set(chunk) == {'x', 'y'}
      out.append({k: np.asarray(chunk[k])[0] for k in ('x', 'y')})
    return out, it.position
  finally:
    it.close()


def test_permutation_is_keyed_on_seed_and_epoch():
  a = loader.epoch_permutation(0, 0, 50)
  assert np.array_equal(a, loader.epoch_permutation(0, 0, 50))
  assert sorted(a) == list(range(50))
  assert not np.array_equal(a, loader.epoch_permutation(0, 1, 50))
  assert not np.array_equal(a, loader.epoch_permutation(1, 0, 50))


def test_each_epoch_visits_every_example_once(table):
  batches, _ = _batches(table, sharding.make_mesh(8, 1), 25)  # 4 epochs
  ys = np.concatenate([b['y'][:, 0] for b in batches]).astype(int)
  for epoch in range(4):
    assert sorted(ys[epoch * N:(epoch + 1) * N]) == list(range(N))
  assert not np.array_equal(ys[:N], ys[N:2 * N])  # reshuffled


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


def test_chunks_are_sharded_over_data_along_the_batch(table):
  mesh = sharding.make_mesh(4, 2)
  for resident, name, shape in ((False, 'x', (3, 4, F)),
                                (True, 'idx', (3, 4))):
    it = _loader(table, mesh, steps_per_call=3, resident=resident)
    _, chunk = next(it)
    it.close()
    assert it.chunk_sharding.spec == P(None, 'data')
    if resident:
      # One process: numpy indices, for the jitted call to place as
      # chunk_sharding says (several processes get global arrays).
      assert isinstance(chunk[name], np.ndarray)
      assert chunk[name].shape == (3, 16)
      chunk[name] = jax.device_put(chunk[name], it.chunk_sharding)
    assert chunk[name].sharding == it.chunk_sharding
    assert {s.data.shape for s in chunk[name].addressable_shards} == {shape}


def test_resident_indices_name_the_streamed_rows(table):
  mesh = sharding.make_mesh(4, 2)
  sizes = [5, 2, 5, 1]
  streamed = _loader(table, mesh, chunk_sizes=sizes, steps_per_call=5)
  resident = _loader(table, mesh, chunk_sizes=sizes, steps_per_call=5,
                     resident=True)
  try:
    x = np.asarray(resident.device_table()['x'])
    np.testing.assert_array_equal(x, table[0])
    for size in sizes:
      (n, rows), (m, idx) = next(streamed), next(resident)
      assert n == m == size
      np.testing.assert_array_equal(
          x[np.asarray(idx['idx'])[:n]], np.asarray(rows['x'])[:n])
      # Padding past num_steps (never read by the step) repeats row 0.
      assert not np.asarray(idx['idx'])[n:].any()
      assert (np.asarray(rows['x'])[n:] == table[0][0]).all()
    assert streamed.position == resident.position == sum(sizes) * 16
    with pytest.raises(StopIteration):
      next(resident)
  finally:
    streamed.close()
    resident.close()


def test_chunks_of_several_steps_hold_the_stream_in_order(table):
  mesh = sharding.make_mesh(8, 1)
  single, _ = _batches(table, mesh, 9)
  it = _loader(table, mesh, chunk_sizes=[4, 4, 1], steps_per_call=4)
  chunks = [next(it) for _ in range(3)]
  it.close()
  joined = np.concatenate([np.asarray(c['y'])[:n] for n, c in chunks])
  np.testing.assert_array_equal(joined, np.stack([b['y'] for b in single]))


def test_chunk_plan_ends_calls_at_every_event_and_resumes_alike():
  plan = list(loader.chunk_plan(0, 70, 16, periods=(25, 30), stops=(41,)))
  ends = [done + n for done, n in plan]
  assert ends == [16, 25, 30, 32, 41, 48, 50, 60, 64, 70]
  assert all(0 < n <= 16 for _, n in plan)
  assert [d for d, _ in plan] == [0] + ends[:-1]
  # Resumed at any call's end, the rest is grouped as before.
  for end in ends[:-1]:
    assert list(loader.chunk_plan(end, 70, 16, periods=(25, 30),
                                  stops=(41,))) == [
                                      p for p in plan if p[0] >= end]


@pytest.mark.parametrize('num_steps,steps_per_call,periods', [
    (70, 16, (25, 30)), (100, 100, (100, 1000)), (1, 8, (3,)), (0, 4, ()),
    (10_000, 7, (50, 0, 120)), (64, 1, ()), (99, 128, (33,))])
def test_num_calls_counts_the_plans_calls(num_steps, steps_per_call, periods):
  assert loader.num_calls(num_steps, steps_per_call, periods) == len(
      list(loader.chunk_plan(0, num_steps, steps_per_call, periods)))


def test_chunk_plan_ends_calls_at_the_optional_steps_taken():
  asked = []

  def take(step):
    asked.append(step)
    return step in (20, 70)
  plan = list(loader.chunk_plan(0, 100, 32, periods=(50,),
                                optional_period=10, take=take))
  assert [done + n for done, n in plan] == [20, 32, 50, 64, 70, 96, 100]
  # Each due step inside a call is asked about once; those that end a call
  # anyway (50, and 100, the last) are not asked.
  assert asked == [10, 20, 30, 40, 60, 70, 80, 90]


def test_indivisible_batch_size_is_a_usage_error(table):
  with pytest.raises(UsageError, match="batch_size 12 is not divisible by "
                     "the 8 devices of mesh axis 'data'"):
    _loader(table, sharding.make_mesh(8, 1), batch_size=12)


@pytest.mark.parametrize('batch_size', [8, 24, 96, 104, 200])
def test_eval_batches_cover_every_example_once(table, batch_size):
  x, y = table
  mesh = sharding.make_mesh(4, 2)
  seen = []
  steps = 0
  for batch in loader.eval_batches(x, y, batch_size=batch_size,
                                   sharding=sharding.batch_sharding(mesh)):
    mask = np.asarray(batch['mask'])
    seen.extend(np.asarray(batch['y'])[mask, 0].astype(int))
    steps += 1
  assert sorted(seen) == list(range(N))
  assert steps == -(-N // batch_size)
