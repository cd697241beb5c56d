"""meshfit.data.row_order: a table in memory read in an order made where it
is, the same rows on the host and on any mesh of devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshfit.data import row_order
from meshfit.input_pipeline.order import Blocks, fold_blocks
from meshfit.parallel import sharding


@pytest.mark.parametrize('n', [1, 2, 3, 17, 137, 4099, 65_537])
def test_every_epoch_is_a_permutation_and_numpy_agrees_with_jax(n):
  a, b = row_order.radices(n)
  assert a * b >= n > a * b - a
  key = row_order.member_key(7, 3)
  orders = []
  for epoch in (0, 1, 2**31 - 2):
    host = row_order.permute(np, np.arange(n), n, a, b, key, epoch)
    assert np.array_equal(np.sort(host), np.arange(n)), epoch
    device = row_order.permute(jnp, jnp.arange(n), n, a, b, key, epoch)
    np.testing.assert_array_equal(np.asarray(device), host)
    orders.append(host)
  if n >= 99:
    assert not np.array_equal(orders[0], orders[1])


def test_orders_look_random():
  """Few fixed points, no correlation with the row index or between
  epochs or members: what SGD asks of a shuffle."""
  n = 10_000
  a, b = row_order.radices(n)
  epochs = [row_order.permute(np, np.arange(n), n, a, b,
                              row_order.member_key(0, m), e)
            for m in range(3) for e in range(3)]
  for p in epochs:
    assert (p == np.arange(n)).mean() < 0.01
    assert abs(np.corrcoef(p, np.arange(n))[0, 1]) < 0.05
    # Neighbouring entries land far apart.
    assert np.median(np.abs(np.diff(p))) > n / 10
  for p, q in zip(epochs, epochs[1:]):
    assert abs(np.corrcoef(p, q)[0, 1]) < 0.05


def test_keys_take_every_bit_of_the_seed_and_the_member():
  keys = {row_order.member_key(seed, m)
          for seed in (0, 1, 2**32, 2**63 + 5) for m in range(4)}
  assert len(keys) == 16


def _member_rows(num_rows=1000, members=4, seed=5):
  folds = fold_blocks(num_rows, members, seed=1, stream=2)
  own = [Blocks.union([f for i, f in enumerate(folds) if i != m])
         for m in range(members)]
  return own, row_order.MemberRows.of(own, seed)


def test_an_epoch_is_each_members_own_rows_once():
  own, order = _member_rows()
  at = order.stream_at(0)
  steps = 3 * 760 // 8  # three epochs of a member's ~750 rows
  rows = row_order.host_rows(order.arrays(), at['epoch_M'], at['offset_M'],
                             steps, 8)
  for m, blocks in enumerate(own):
    n = blocks.num_rows
    stream = rows[:, m].ravel()
    for epoch in range(2):
      assert sorted(stream[epoch * n:(epoch + 1) * n]) == sorted(
          blocks.rows()), (m, epoch)


def test_a_position_past_two_to_the_31_entries():
  _, order = _member_rows()
  position = 3 * 2**31 + 40
  at = order.stream_at(position)
  assert (at['epoch_M'] == position // order.num_rows_M.astype(np.int64)).all()
  before = order.stream_at(position - 16)
  later = row_order.host_rows(order.arrays(), before['epoch_M'],
                              before['offset_M'], 3, 8)
  now = row_order.host_rows(order.arrays(), at['epoch_M'], at['offset_M'],
                            1, 8)
  np.testing.assert_array_equal(later[2], now[0])


@pytest.mark.parametrize('members_axis, data, model', [
    (1, 8, 1), (2, 2, 2), (1, 1, 1)])
def test_the_devices_compute_the_hosts_rows_on_any_mesh(members_axis, data,
                                                        model):
  own, order = _member_rows()
  devices = jax.devices()[:members_axis * data * model]
  mesh = sharding.make_mesh(data, model, devices, members=members_axis)
  replicated = sharding.replicated(mesh)
  on_device = {name: jax.device_put(a, replicated)
               for name, a in order.arrays().items()}
  k, batch = 5, 16
  on_device['step_offset_K'] = jax.device_put(
      np.arange(k, dtype=np.int32) * batch, replicated)
  on_device['entry_B'] = jax.device_put(np.arange(batch, dtype=np.int32),
                                        replicated)
  compute = jax.jit(row_order.device_rows, static_argnums=1)
  for position in (0, 48, 750 * 7 + 16):
    at = order.stream_at(position)
    rows = compute({'order': on_device, **at}, mesh)
    assert rows.sharding.is_equivalent_to(sharding.chunk_sharding(mesh), 3)
    np.testing.assert_array_equal(
        np.asarray(rows), row_order.host_rows(
            order.arrays(), at['epoch_M'], at['offset_M'], k, batch))


def test_member_blocks_must_be_full_but_the_last():
  ragged = Blocks(np.array([0, 4, 6]), np.array([4, 6, 10]))
  with pytest.raises(ValueError, match='one size'):
    row_order.MemberRows.of([ragged], 0)
