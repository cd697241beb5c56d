"""Train and eval steps: sharded steps equal the one-device step."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model_helpers import dataset_config, jit_train_step, shrunk_config
from meshfit import config as config_lib
from meshfit.data import feeding, splits as splits_lib
from meshfit.data.features import FeatureStats, InputLayout
from meshfit.model import inference, optim, state as state_lib, forward, steps
from meshfit.model.setup import make_setup
from meshfit.parallel import sharding
from meshfit.train import call_plan

# Jitted train steps on several meshes, each compiled anew: left out of
# `make test-fast`.
pytestmark = pytest.mark.slow

MESHES = [(8, 1), (4, 2), (2, 4), (1, 8)]


def _losses(config, splits, mesh, num_steps, chunk_sizes=None,
            resident=True, steps_per_call=8):
  """Losses of `num_steps` steps run in calls of `chunk_sizes` steps: steps
  x members, or steps alone for a single model."""
  config = config_lib.parse(config)
  layout = InputLayout.numbers(splits.train.x_NxF.shape[1])
  setup = make_setup(config, layout, splits.train.y_NxT.shape[1],
                             mesh=mesh)
  norm = FeatureStats.fit(layout, splits.train.x_NxF, splits.train.y_NxT)
  state = state_lib.create_train_state(setup.arch, setup.tx, mesh,
                                       config.seed, norm,
                                       optim.Hyperparameters.of(config))
  step_fn = steps.jit_train_call(setup.graphdef, layout, setup.member_tx,
                                 setup.shardings, mesh, config.log_every_steps,
                                 setup.dropout)
  if chunk_sizes is None:
    chunk_sizes = list(call_plan.plan_calls(0, num_steps, steps_per_call))
  assert sum(chunk_sizes) == num_steps
  feed = feeding.TrainFeed(
      splits.train, batch_size=config.batch_size,
      seed=config.seed, mesh=mesh, steps_per_call=steps_per_call,
      resident=resident, members=config.model.ensemble_size)
  table_z = (steps.jit_encode(mesh, layout)(state.stats, feed.device_table())
             if resident else {})
  losses = []
  for n, chunk in feed.chunks(chunk_sizes):
    state, losses_KxM, _ = step_fn(state, table_z, chunk, np.int32(n))
    losses.extend(np.asarray(losses_KxM)[:n])
  feed.close()
  losses = np.array(losses)
  return (losses[:, 0] if losses.shape[1] == 1 else losses), state


@pytest.fixture(scope='module')
def one_device_run(data_dir):
  config = shrunk_config(data_dir, {'model.hidden_sizes': (64, 64),
                                    'num_train_steps': 100})
  splits = splits_lib.load_splits(dataset_config(config.dataset),
                            config.seed)
  mesh = sharding.make_mesh(1, 1, jax.devices()[:1])
  return config, splits, _losses(config, splits, mesh, 40)


@pytest.mark.parametrize('shape', MESHES)
def test_forty_steps_match_one_device(one_device_run, shape):
  config, splits, (expected, _) = one_device_run
  losses, _ = _losses(config, splits, sharding.make_mesh(*shape), 40)
  np.testing.assert_allclose(losses, expected, rtol=1e-5)
  assert expected[-1] < 0.5 * expected[0]  # and it is actually learning


@pytest.mark.parametrize('chunk_sizes, steps_per_call', [
    ([3, 5, 1, 8, 8, 7, 8], 8),
    ([1] * 40, 1),  # calls of one step run without the loop
])
def test_grouping_steps_into_calls_changes_no_bit(one_device_run, chunk_sizes,
                                                  steps_per_call):
  config, splits, (expected, state) = one_device_run
  mesh = sharding.make_mesh(1, 1, jax.devices()[:1])
  losses, other = _losses(config, splits, mesh, 40, chunk_sizes=chunk_sizes,
                          steps_per_call=steps_per_call)
  np.testing.assert_array_equal(losses, expected)
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(other)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_streamed_batches_train_like_resident_ones(one_device_run):
  config, splits, (expected, _) = one_device_run
  mesh = sharding.make_mesh(1, 1, jax.devices()[:1])
  losses, _ = _losses(config, splits, mesh, 40, resident=False)
  np.testing.assert_allclose(losses, expected, rtol=1e-6)


def test_one_step_per_call_matches_the_single_step(one_device_run):
  config, splits, (expected, _) = one_device_run
  mesh = sharding.make_mesh(1, 1, jax.devices()[:1])
  setup = make_setup(config_lib.parse(config),
                             InputLayout.numbers(10), 1, mesh=mesh)
  state = state_lib.create_train_state(
      setup.arch, setup.tx, mesh, config.seed,
      FeatureStats.fit(setup.arch.layout, splits.train.x_NxF,
                       splits.train.y_NxT),
      optim.Hyperparameters.of(config_lib.parse(config)))
  step_fn = jit_train_step(setup.graphdef, setup.arch.layout,
                                 setup.member_tx, setup.shardings, mesh)
  feed = feeding.TrainFeed(
      splits.train, batch_size=config.batch_size,
      seed=config.seed, mesh=mesh, steps_per_call=1, resident=False)
  losses = []
  for _, chunk in feed.chunks([1] * 10):
    state, loss_M = step_fn(state, {k: chunk[k][0] for k in ('x', 'y')})
    losses.append(float(loss_M[0]))
  feed.close()
  np.testing.assert_allclose(losses, expected[:10], rtol=1e-6)


def test_train_metrics_average_the_logging_window(one_device_run):
  config, splits, (losses, state) = one_device_run
  summary = jax.device_get(state.train_metrics).compute()
  # 40 steps with log_every_steps=10: the window holds steps 31..40.
  np.testing.assert_allclose(summary['loss'], losses[30:].mean(), rtol=1e-6)
  assert int(state.step) == 40


def test_eval_step_matches_numpy(one_device_run):
  config, splits, (_, state) = one_device_run
  setup = make_setup(config_lib.parse(config),
                             InputLayout.numbers(10), 1,
                             mesh=sharding.make_mesh(4, 2))
  state = jax.device_put(state, setup.shardings)
  result = inference.evaluate_table(setup, state, splits.eval, batch_size=24)
  pred = np.asarray(forward.predict(setup.graphdef, setup.arch.layout, state,
                                  splits.eval.x_NxF)[0])
  err = pred[:, 0] - splits.eval.y_NxT[:, 0]
  y = splits.eval.y_NxT[:, 0].astype(np.float64)
  assert result['num_examples'] == splits.eval.num_examples == 10_000
  np.testing.assert_allclose(result['mse'], np.mean(err**2), rtol=1e-5)
  np.testing.assert_allclose(result['mae'], np.mean(np.abs(err)), rtol=1e-5)
  np.testing.assert_allclose(
      result['r2'], 1 - np.sum(err**2) / np.sum((y - y.mean())**2),
      rtol=1e-5)


@pytest.mark.parametrize('partitioned', [False, True])
def test_global_norm_is_the_norm_of_all_leaves(partitioned):
  tree = {'w': jnp.arange(12.0).reshape(3, 4), 'b': [jnp.ones(5), -2.0]}
  flat = np.concatenate([np.arange(12.0), np.ones(5), [-2.0]])
  got = jax.jit(lambda t: steps.global_norm(t, partitioned))(tree)
  np.testing.assert_allclose(got, np.linalg.norm(flat), rtol=1e-6)


# An ensemble: members trained as one program.


@pytest.fixture(scope='module')
def ensemble_run(one_device_run):
  config, splits, _ = one_device_run
  config = config.copy_and_resolve_references()
  config.model.ensemble_size = 4
  mesh = sharding.make_mesh(1, 1, jax.devices()[:1])
  return config, splits, _losses(config, splits, mesh, 40)


def test_members_differ_and_each_learns(ensemble_run):
  _, _, (losses_KxM, state) = ensemble_run
  assert losses_KxM.shape == (40, 4)
  kernels = np.asarray(state.params['hidden'][0]['kernel'])
  assert len({k.tobytes() for k in kernels}) == 4  # own initialisations
  assert len({tuple(column) for column in losses_KxM.T}) == 4  # own data
  # Batch losses are noisy: the last steps' mean against the first step.
  assert (losses_KxM[-5:].mean(axis=0) < 0.5 * losses_KxM[0]).all()


def test_a_member_does_not_depend_on_the_others(one_device_run,
                                                ensemble_run):
  """Member 0 of four is the single model; member 1 of two is member 1 of
  four: a member's result depends on (seed, member) alone."""
  config, splits, (single, _) = one_device_run
  _, _, (four, _) = ensemble_run
  two_config = config.copy_and_resolve_references()
  two_config.model.ensemble_size = 2
  two, _ = _losses(two_config, splits,
                   sharding.make_mesh(1, 1, jax.devices()[:1]), 40)
  np.testing.assert_allclose(four[:, 0], single, rtol=1e-5)
  np.testing.assert_allclose(four[:, :2], two, rtol=1e-5)


@pytest.mark.parametrize('members, data, model', [(4, 2, 1), (2, 2, 2),
                                                  (1, 8, 1)])
def test_a_sharded_member_axis_equals_one_device(ensemble_run, members,
                                                 data, model):
  config, splits, (expected, _) = ensemble_run
  config = config.copy_and_resolve_references()
  config.mesh.members = members
  mesh = sharding.make_mesh(data, model, members=members)
  losses, state = _losses(config, splits, mesh, 40)
  np.testing.assert_allclose(losses, expected, rtol=1e-5)
  kernel = state.params['hidden'][0]['kernel']
  assert {s.data.shape[0] for s in kernel.addressable_shards} == {
      4 // members}


def test_members_on_their_own_devices_exchange_nothing_while_they_train(
    ensemble_run):
  config, splits, _ = ensemble_run
  config = config.copy_and_resolve_references()
  config.mesh.members, config.mesh.data = 4, 1
  mesh = sharding.make_mesh(1, 1, jax.devices()[:4], members=4)
  parsed = config_lib.parse(config)
  layout = InputLayout.numbers(splits.train.x_NxF.shape[1])
  setup = make_setup(parsed, layout, splits.train.y_NxT.shape[1],
                             mesh=mesh)
  step_fn = steps.jit_train_call(setup.graphdef, layout, setup.member_tx,
                                 setup.shardings, mesh, parsed.log_every_steps,
                                 setup.dropout)
  norm = FeatureStats.fit(layout, splits.train.x_NxF, splits.train.y_NxT)
  state = state_lib.create_train_state(setup.arch, setup.tx, mesh, 0, norm,
                                       optim.Hyperparameters.of(parsed))
  feed = feeding.TrainFeed(
      splits.train, batch_size=parsed.batch_size,
      seed=0, mesh=mesh, steps_per_call=8, resident=True, members=4)
  table = steps.jit_encode(mesh, layout)(state.stats, feed.device_table())
  _, chunk = next(feed.chunks([8]))
  feed.close()
  lowered = step_fn.jitted_resident.lower(state, table, chunk, np.int32(8))
  hlo = lowered.compile().as_text()
  bodies = re.findall(r'while\(.*?body=(%?[\w.\-]+)', hlo)
  assert bodies, 'the steps run in a while loop'
  computations = dict(re.findall(r'\n(%?[\w.\-]+) [^\n]*\{\n(.*?)\n\}', hlo,
                                 flags=re.S))
  collectives = ('all-reduce', 'all-gather', 'collective-permute',
                 'all-to-all', 'reduce-scatter')
  for body in bodies:
    assert not [c for c in collectives if c in computations[body]], body
  # Combining them (the call's metrics and losses) is what crosses devices.
  assert any(c in hlo for c in collectives)
  # Each part of the step names its ops, forward and gradient, in the
  # program given to XLA (whose fusions then carry their root's name), for a
  # profile to be read by (config.profile_start_step's trace).
  names = ' '.join(re.findall(r'loc\("([^"]*)"', lowered.as_text(
      debug_info=True)))
  for part in ('batch', 'hidden_0', 'hidden_1', 'head', 'loss', 'optimizer'):
    assert re.search(rf'jvp\({part}\)|/{part}/|\({part}\)', names), part
  assert 'transpose(jvp(hidden_0))' in names
