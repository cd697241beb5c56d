"""The MLP regressor: shapes, mixed precision, and its dtype settings."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import default
from meshfit import config_lib, sharding, state as state_lib, steps, train_lib
from meshfit.errors import UsageError
from meshfit.normalization import Normalizer
from models.mlp import Mlp, MlpConfig


def _model(dtype: str, param_dtype: str = 'float32',
           hidden_sizes=(128, 128)) -> Mlp:
  config = MlpConfig(hidden_sizes=hidden_sizes, dtype=dtype,
                     param_dtype=param_dtype)
  return state_lib.ModelSpec(config, num_features=10, num_targets=2).build(0)


def _x_BxF(batch: int = 512) -> jax.Array:
  return jax.random.normal(jax.random.key(1), (batch, 10))


def _param_dtypes(model: Mlp) -> set[jnp.dtype]:
  return {p.dtype for p in jax.tree.leaves(nnx.state(model, nnx.Param))}


def test_bf16_compute_keeps_f32_params_and_f32_predictions():
  model = _model('bfloat16')
  assert _param_dtypes(model) == {jnp.dtype(jnp.float32)}
  assert model(_x_BxF()).dtype == jnp.float32


def test_bf16_compute_is_close_to_f32_but_not_equal():
  x_BxF = _x_BxF()
  f32_BxT = _model('float32')(x_BxF)
  bf16_BxT = _model('bfloat16')(x_BxF)  # same seed: the same parameters
  rms_err = float(jnp.sqrt(jnp.mean((bf16_BxT - f32_BxT)**2)))
  scale = float(jnp.std(f32_BxT))
  # bfloat16 keeps 8 significant bits (relative rounding 2^-9 ~ 0.2%) and
  # products accumulate in float32: the error is ~0.5% of the outputs' spread
  # here. Accumulating in bfloat16 as well, or a wrong cast, lands far above.
  assert rms_err < 0.02 * scale, (rms_err, scale)
  # Equal outputs would mean the matmuls never ran in bfloat16.
  assert rms_err > 0


def test_param_dtype_sets_how_parameters_are_stored():
  model = _model('bfloat16', param_dtype='bfloat16')
  assert _param_dtypes(model) == {jnp.dtype(jnp.bfloat16)}
  assert model(_x_BxF()).dtype == jnp.float32


def test_unknown_dtype_is_refused():
  with pytest.raises(ValueError, match='float16'):
    _model('float16')


@pytest.mark.parametrize('key', ['model.dtype', 'model.param_dtype'])
def test_validate_refuses_unknown_dtype(key):
  config = default.get_config()
  section, name = key.split('.')
  config[section][name] = 'float64'
  with pytest.raises(UsageError, match=key):
    config_lib.validate(config, num_devices=1)


def _train_losses(dtype: str, num_steps: int) -> tuple[np.ndarray, dict]:
  """Adam on a fixed regression batch; the train step meshfit runs."""
  config = default.get_config()
  config.model.hidden_sizes = (64, 64)
  config.model.dtype = dtype
  config.optimizer.schedule = 'constant'
  mesh = sharding.make_mesh(1, 1, jax.devices()[:1])
  setup = train_lib.make_setup(config, num_features=10, num_targets=1,
                               mesh=mesh)
  rng = np.random.default_rng(0)
  x_BxF = rng.standard_normal((256, 10)).astype(np.float32)
  y_Bx1 = (np.sin(x_BxF[:, :1]) + x_BxF[:, 1:2] ** 2).astype(np.float32)
  norm = Normalizer.fit(x_BxF, y_Bx1, True)
  state = state_lib.create_train_state(setup.spec, setup.tx, mesh, 0, norm)
  train_step = steps.jit_train_step(setup.graphdef, setup.tx, setup.shardings,
                                    mesh, config.log_every_steps)
  batch = {'x': jnp.asarray(x_BxF), 'y': jnp.asarray(y_Bx1)}
  losses = []
  for _ in range(num_steps):
    state, loss = train_step(state, batch)
    losses.append(float(loss))
  return np.array(losses), state.params


def test_bf16_training_follows_f32_training_and_keeps_f32_params():
  f32_losses, _ = _train_losses('float32', 30)
  bf16_losses, bf16_params = _train_losses('bfloat16', 30)
  assert {p.dtype for p in jax.tree.leaves(bf16_params)} == {
      jnp.dtype(jnp.float32)}
  assert bf16_losses[-1] < 0.5 * bf16_losses[0]  # it learns
  np.testing.assert_allclose(bf16_losses, f32_losses, rtol=0.05, atol=1e-3)
