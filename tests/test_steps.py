"""Train and eval steps: sharded steps equal the one-device step."""

import jax
import numpy as np
import pytest

import input_pipeline
from input_pipeline import loader
from meshfit import sharding, state as state_lib, steps, train_lib
from meshfit.normalization import Normalizer

MESHES = [(8, 1), (4, 2), (2, 4), (1, 8)]


def _losses(config, splits, mesh, num_steps):
  setup = train_lib.make_setup(config, splits.train.x_NxF.shape[1],
                               splits.train.y_NxT.shape[1], mesh=mesh)
  norm = Normalizer.fit(splits.train.x_NxF, splits.train.y_NxT)
  state = state_lib.create_train_state(setup.spec, setup.tx, mesh,
                                       config.seed, norm)
  step_fn = steps.jit_train_step(setup.graphdef, setup.tx, setup.shardings,
                                 mesh, config.log_every_steps)
  batches = loader.TrainLoader(splits.train.x_NxF, splits.train.y_NxT,
                               batch_size=config.batch_size, seed=config.seed,
                               sharding=sharding.batch_sharding(mesh))
  losses = []
  for _ in range(num_steps):
    state, loss = step_fn(state, next(batches))
    losses.append(float(loss))
  batches.close()
  return np.array(losses), state


@pytest.fixture(scope='module')
def one_device_run(request):
  config = request.getfixturevalue('small_config')
  config.model.hidden_sizes = (64, 64)
  splits = input_pipeline.load_splits(config.dataset)
  mesh = sharding.make_mesh(1, 1, jax.devices()[:1])
  return config, splits, _losses(config, splits, mesh, 40)


@pytest.fixture(scope='module')
def small_config(data_dir):
  from configs import default  # noqa: PLC0415
  config = default.get_config()
  config.dataset.data_dir = data_dir
  config.batch_size = 64
  config.log_every_steps = 10
  config.optimizer.warmup_steps = 10
  config.num_train_steps = 100
  return config


@pytest.mark.parametrize('shape', MESHES)
def test_forty_steps_match_one_device(one_device_run, shape):
  config, splits, (expected, _) = one_device_run
  losses, _ = _losses(config, splits, sharding.make_mesh(*shape), 40)
  np.testing.assert_allclose(losses, expected, rtol=1e-5)
  assert expected[-1] < 0.5 * expected[0]  # and it is actually learning


def test_train_metrics_average_the_logging_window(one_device_run):
  config, splits, (losses, state) = one_device_run
  summary = jax.device_get(state.train_metrics).compute()
  # 40 steps with log_every_steps=10: the window holds steps 31..40.
  np.testing.assert_allclose(summary['loss'], losses[30:].mean(), rtol=1e-6)
  assert int(state.step) == 40


def test_eval_step_matches_numpy(one_device_run):
  config, splits, (_, state) = one_device_run
  setup = train_lib.make_setup(config, 10, 1,
                               mesh=sharding.make_mesh(4, 2))
  state = jax.device_put(state, setup.shardings)
  result = train_lib.evaluate_table(setup, state, splits.eval,
                                    batch_size=24)
  pred = np.asarray(steps.predict(setup.graphdef, state,
                                  splits.eval.x_NxF))
  err = pred[:, 0] - splits.eval.y_NxT[:, 0]
  y = splits.eval.y_NxT[:, 0].astype(np.float64)
  assert result['num_examples'] == splits.eval.num_examples == 10_000
  np.testing.assert_allclose(result['mse'], np.mean(err**2), rtol=1e-5)
  np.testing.assert_allclose(result['mae'], np.mean(np.abs(err)), rtol=1e-5)
  np.testing.assert_allclose(
      result['r2'], 1 - np.sum(err**2) / np.sum((y - y.mean())**2),
      rtol=1e-5)
