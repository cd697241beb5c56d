"""Mesh construction, partition specs of params and batches, collectives."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from model_helpers import mlp_config, uniform_hparams
from meshfit.configs import default
from meshfit import config as config_lib
from meshfit.data.features import FeatureStats, InputLayout
from meshfit.errors import UsageError
from meshfit.model import optim, state as state_lib
from meshfit.parallel import sharding



@pytest.mark.parametrize('data, model, expected', [
    (-1, 1, (8, 1)), (-1, 2, (4, 2)), (2, -1, (2, 4)), (1, 8, (1, 8)),
    (8, 1, (8, 1))])
def test_mesh_shape_resolves_minus_one(data, model, expected):
  assert sharding.mesh_shape(data, model, 8) == expected


@pytest.mark.parametrize('data, model, message', [
    (-1, -1, 'both -1'), (3, 1, 'does not divide the 8 devices'),
    (2, 2, '4 devices, but there are 8'), (0, 1, 'mesh.data=0'),
    (1, -3, 'mesh.model=-3')])
def test_bad_mesh_shapes_are_usage_errors(data, model, message):
  with pytest.raises(UsageError, match=message):
    sharding.mesh_shape(data, model, 8)


def _shardings(hidden, mesh):
  config = default.get_config()
  arch = state_lib.Architecture(mlp_config(hidden_sizes=hidden),
                                InputLayout.numbers(10), 1)
  tx = optim.make_optimizer(config_lib.parse(config).optimizer, 100)
  return arch, tx, state_lib.state_shardings(arch, tx, mesh)


def test_param_specs_alternate_column_and_row_split():
  mesh = sharding.make_mesh(4, 2)
  _, _, shardings = _shardings((64, 64, 64), mesh)
  specs = jax.tree.map(lambda s: s.spec, shardings.params)
  # Every leaf leads with the member dimension, over the 'members' axis.
  m = 'members'
  assert specs['hidden'][0] == {'kernel': P(m, None, 'model'),
                                'bias': P(m, 'model')}
  assert specs['hidden'][1] == {'kernel': P(m, 'model', None),
                                'bias': P(m, None)}
  assert specs['hidden'][2] == {'kernel': P(m, None, 'model'),
                                'bias': P(m, 'model')}
  # The head consumes a split layer, so it is row-split.
  assert specs['head'] == {'kernel': P(m, 'model', None), 'bias': P(m, None)}


def test_linear_model_and_even_depth_heads_are_replicated():
  mesh = sharding.make_mesh(4, 2)
  _, _, linear = _shardings((), mesh)
  assert linear.params['head']['kernel'].spec == P('members', None, None)
  _, _, two = _shardings((64, 64), mesh)
  assert two.params['head']['kernel'].spec == P('members', None, None)


def test_optimizer_moments_follow_their_params():
  mesh = sharding.make_mesh(4, 2)
  _, _, shardings = _shardings((64, 64), mesh)
  adam = shardings.opt_state[0]
  assert adam.mu['hidden'][0]['kernel'].spec == P('members', None, 'model')
  assert adam.nu['hidden'][1]['kernel'].spec == P('members', 'model', None)
  # Each member counts its own steps, on its own devices.
  assert adam.count.spec == P('members')
  assert shardings.step.spec == P() and shardings.rng_Mx2.spec == P(
      'members')


def test_state_is_created_in_its_shardings():
  mesh = sharding.make_mesh(4, 2)
  arch, tx, shardings = _shardings((64, 64), mesh)
  state = state_lib.create_train_state(arch, tx, mesh, 0,
                                       FeatureStats.identity(10, 1),
                                       uniform_hparams(1, 1e-3))
  actual = jax.tree.map(lambda a: a.sharding.spec, state)
  expected = jax.tree.map(lambda s: s.spec, shardings)
  assert actual == expected
  kernel = state.params['hidden'][0]['kernel']
  # Each device holds a (10, 32) column block, not the whole (10, 64) kernel.
  assert {s.data.shape for s in kernel.addressable_shards} == {(1, 10, 32)}


def test_members_spread_over_the_members_axis():
  mesh = sharding.make_mesh(2, 1, members=4)
  assert dict(mesh.shape) == {'members': 4, 'data': 2, 'model': 1}
  config = default.get_config()
  arch = state_lib.Architecture(mlp_config(hidden_sizes=(16,),
                                          ensemble_size=8),
                                InputLayout.numbers(10), 1)
  tx = optim.make_optimizer(config_lib.parse(config).optimizer, 100)
  state = state_lib.create_train_state(arch, tx, mesh, 0,
                                       FeatureStats.identity(10, 1),
                                       uniform_hparams(8, 1e-3))
  kernel = state.params['hidden'][0]['kernel']
  # Two members per device: a quarter of the ensemble, never all of it.
  assert {s.data.shape for s in kernel.addressable_shards} == {(2, 10, 16)}
  assert {s.data.shape for s in state.weights_M.addressable_shards} == {(2,)}


def test_batches_are_split_over_data_and_replicated_over_model():
  mesh = sharding.make_mesh(4, 2)
  s = sharding.batch_sharding(mesh)
  assert s.spec == P('data')
  x = jax.device_put(np.arange(16, dtype=np.float32).reshape(8, 2), s)
  assert {sh.data.shape for sh in x.addressable_shards} == {(2, 2)}


def test_a_two_layer_block_needs_one_all_reduce():
  """Column- then row-split layers: one all-reduce in the forward pass."""
  mesh = sharding.make_mesh(4, 2)
  arch, tx, shardings = _shardings((64, 64), mesh)
  state = state_lib.create_train_state(arch, tx, mesh, 0,
                                       FeatureStats.identity(10, 1),
                                       uniform_hparams(1, 1e-3))
  graphdef = state_lib.graphdef(arch)
  from flax import nnx  # noqa: PLC0415

  def forward(params, x):
    return jax.vmap(lambda p: nnx.merge(graphdef, p)(x))(params)

  x = jax.device_put(jnp.ones((32, 10)), sharding.batch_sharding(mesh))
  hlo = jax.jit(forward).lower(state.params, x).compile().as_text()
  assert len(re.findall(r'= [^=]*all-reduce(?:-start)?\(', hlo)) == 1, hlo


class _FakeDevice:
  """Stands in for a device of another process: jax.devices() has one."""
  platform = device_kind = 'cpu'

  def __init__(self, process_index: int, local: int):
    self.process_index, self.local = process_index, local
    self.id = 1000 * process_index + local

  def __repr__(self):
    return f'p{self.process_index}d{self.local}'


def _hosts(num_processes, per_process):
  return [_FakeDevice(p, d) for p in range(num_processes)
          for d in range(per_process)]


@pytest.mark.parametrize('processes, per_process, shape', [
    (2, 4, (1, 4, 2)), (2, 4, (1, 8, 1)), (2, 4, (1, 2, 4)),
    (4, 2, (1, 4, 2)), (4, 2, (1, 8, 1))])
def test_multiprocess_grid_keeps_model_within_a_host(processes, per_process,
                                                     shape):
  grid = sharding.multiprocess_device_grid(shape,
                                           _hosts(processes, per_process))
  owner = np.vectorize(lambda d: d.process_index)(grid)[0]
  assert grid.shape == shape
  assert sorted(d.id for d in grid.flat) == sorted(
      d.id for d in _hosts(processes, per_process))
  # Each row ('model' axis) belongs to one process, and each process owns a
  # contiguous block of rows ('data' spans the hosts in process order).
  assert all(len(set(row)) == 1 for row in owner)
  rows_per_process = shape[1] // processes
  np.testing.assert_array_equal(
      owner[:, 0], np.repeat(np.arange(processes), rows_per_process))


@pytest.mark.parametrize('processes, per_process, shape, member_hosts', [
    (2, 4, (2, 2, 2), 2), (2, 4, (4, 2, 1), 2), (4, 2, (2, 4, 1), 2),
    (4, 2, (8, 1, 1), 4)])
def test_multiprocess_grid_spreads_members_over_hosts(processes, per_process,
                                                      shape, member_hosts):
  """Members go to hosts first: a member's training needs no network."""
  grid = sharding.multiprocess_device_grid(shape,
                                           _hosts(processes, per_process))
  owner = np.vectorize(lambda d: d.process_index)(grid)
  members_per_host = shape[0] // member_hosts
  for m in range(shape[0]):
    hosts = set(owner[m].flat)
    assert len(hosts) == processes // member_hosts, (m, owner)
    # Members of one block of hosts share them; blocks follow process order.
    assert min(hosts) // (processes // member_hosts) == m // members_per_host


def test_multiprocess_grid_refuses_uneven_hosts():
  devices = _hosts(2, 4)[:-1]
  with pytest.raises(UsageError, match='different numbers of devices'):
    sharding.multiprocess_device_grid((1, 7, 1), devices)


def test_members_must_divide_the_devices():
  assert sharding.mesh_shape(-1, 1, 8, members=4) == (2, 1)
  with pytest.raises(UsageError, match='mesh.members=3 does not divide'):
    sharding.mesh_shape(-1, 1, 8, members=3)
