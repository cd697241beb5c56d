"""The input pipeline: order, placement, resumable position, evaluation."""

import jax
import numpy as np
import pytest

from input_pipeline import loader
from meshfit import sharding
from meshfit.errors import UsageError

N, F = 100, 3


@pytest.fixture
def table():
  x = np.arange(N * F, dtype=np.float32).reshape(N, F)
  y = np.arange(N, dtype=np.float32)[:, None]
  return x, y


def _batches(table, mesh, num, **kwargs):
  x, y = table
  it = loader.TrainLoader(x, y, batch_size=16, seed=3,
                          sharding=sharding.batch_sharding(mesh), **kwargs)
  try:
    return [{k: np.asarray(v) for k, v in next(it).items()}
            for _ in range(num)], it.position
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


def test_batches_are_sharded_over_data(table):
  mesh = sharding.make_mesh(4, 2)
  it = loader.TrainLoader(*table, batch_size=16, seed=0,
                          sharding=sharding.batch_sharding(mesh))
  batch = next(it)
  it.close()
  assert batch['x'].sharding == sharding.batch_sharding(mesh)
  assert {s.data.shape for s in batch['x'].addressable_shards} == {(4, F)}


def test_indivisible_batch_size_is_a_usage_error(table):
  with pytest.raises(UsageError, match="batch_size 12 is not divisible by "
                     "the 8 devices of mesh axis 'data'"):
    loader.TrainLoader(*table, batch_size=12, seed=0,
                       sharding=sharding.batch_sharding(
                           sharding.make_mesh(8, 1)))


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
