"""The MLP regressor: shapes, mixed precision, and its dtype settings."""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from model_helpers import jit_train_step, mlp_config
from meshfit.configs import default
from meshfit import config as config_lib
from meshfit.data.features import FeatureStats, InputLayout
from meshfit.errors import UsageError
from meshfit.model import optim, state as state_lib
from meshfit.model.setup import make_setup
from meshfit.parallel import sharding
from meshfit.models import low_precision, mlp, ridge as ridge_model
from meshfit.models.mlp import Mlp


def _model(dtype: str, param_dtype: str = 'float32',
           hidden_sizes=(128, 128)) -> Mlp:
  config = mlp_config(hidden_sizes=hidden_sizes, dtype=dtype,
                     param_dtype=param_dtype)
  return state_lib.Architecture(config, InputLayout.numbers(10),
                                num_targets=2).build(0)


def _x_BxF(batch: int = 512) -> jax.Array:
  return jax.random.normal(jax.random.key(1), (batch, 10))


def _param_dtypes(model: Mlp) -> set[jnp.dtype]:
  return {p.dtype for p in jax.tree.leaves(nnx.state(model, nnx.Param))}


@pytest.mark.slow  # trains: jitted steps on the mesh
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


@pytest.mark.parametrize('key', ['model.dtype', 'model.param_dtype'])
def test_validate_refuses_unknown_dtype(key):
  config = default.get_config()
  section, name = key.split('.')
  config[section][name] = 'float64'
  with pytest.raises(UsageError, match=key):
    config_lib.parse(config)


def _train_losses(dtype: str, num_steps: int) -> tuple[np.ndarray, dict]:
  """Adam on a fixed regression batch; the train step meshfit runs."""
  config = default.get_config()
  config.model.hidden_sizes = (64, 64)
  config.model.dtype = dtype
  config.optimizer.schedule = 'constant'
  mesh = sharding.make_mesh(1, 1, jax.devices()[:1])
  setup = make_setup(config_lib.parse(config),
                             InputLayout.numbers(10), num_targets=1,
                             mesh=mesh)
  rng = np.random.default_rng(0)
  x_BxF = rng.standard_normal((256, 10)).astype(np.float32)
  y_Bx1 = (np.sin(x_BxF[:, :1]) + x_BxF[:, 1:2] ** 2).astype(np.float32)
  norm = FeatureStats.fit(setup.arch.layout, x_BxF, y_Bx1)
  state = state_lib.create_train_state(
      setup.arch, setup.tx, mesh, 0, norm,
      optim.Hyperparameters.of(config_lib.parse(config)))
  train_step = jit_train_step(setup.graphdef, setup.arch.layout,
                                    setup.member_tx, setup.shardings, mesh)
  # One member's batch (M x B x ...).
  batch = {'x': jnp.asarray(x_BxF)[None], 'y': jnp.asarray(y_Bx1)[None]}
  losses = []
  for _ in range(num_steps):
    state, loss_M = train_step(state, batch)
    losses.append(float(loss_M[0]))
  return np.array(losses), state.params


@pytest.mark.slow  # trains: jitted steps on the mesh
def test_bf16_training_follows_f32_training_and_keeps_f32_params():
  f32_losses, _ = _train_losses('float32', 30)
  bf16_losses, bf16_params = _train_losses('bfloat16', 30)
  assert {p.dtype for p in jax.tree.leaves(bf16_params)} == {
      jnp.dtype(jnp.float32)}
  assert bf16_losses[-1] < 0.5 * bf16_losses[0]  # it learns
  np.testing.assert_allclose(bf16_losses, f32_losses, rtol=0.05, atol=1e-3)


# The bfloat16 matmul: gradients, the float32 path, kernels, shardings.


def _relative_error(actual: jax.Array, expected: jax.Array) -> float:
  return float(jnp.linalg.norm(actual - expected) / jnp.linalg.norm(expected))


@pytest.mark.parametrize('shape', [(8, 6), (7, 6), (6, 7), (7, 5), (1, 4)])
def test_transposed_copy_is_the_transpose(shape):
  a_NxM = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
  np.testing.assert_array_equal(jax.jit(low_precision.transposed_copy)(a_NxM), a_NxM.T)


# Even and odd batches and widths take the three forms of transposed_copy.
@pytest.mark.parametrize('b, i, o', [(64, 32, 16), (63, 32, 16),
                                     (63, 31, 16), (64, 10, 1)])
@pytest.mark.parametrize('kernel_dtype', ['float32', 'bfloat16'])
def test_low_precision_matmul_gradients_match_float32(b, i, o, kernel_dtype):
  keys = jax.random.split(jax.random.key(0), 3)
  x_BxI = jax.random.normal(keys[0], (b, i))
  kernel_IxO = jax.random.normal(keys[1], (i, o)).astype(kernel_dtype)
  g_BxO = jax.random.normal(keys[2], (b, o))

  def loss(matmul, x_BxI, kernel_IxO):
    return jnp.sum(matmul(x_BxI, kernel_IxO) * g_BxO)

  bf16 = lambda x, k: low_precision.low_precision_matmul(x, k, jnp.bfloat16)  # noqa: E731
  f32 = lambda x, k: x @ k.astype(jnp.float32)  # noqa: E731
  dx, dkernel = jax.jit(jax.grad(functools.partial(loss, bf16),
                                 argnums=(0, 1)))(x_BxI, kernel_IxO)
  dx_ref, dkernel_ref = jax.grad(functools.partial(loss, f32),
                                 argnums=(0, 1))(x_BxI, kernel_IxO)
  # Gradients come back in the primal dtypes: float32 ones unrounded.
  assert dx.dtype == x_BxI.dtype and dkernel.dtype == kernel_IxO.dtype
  # Operands rounded to bfloat16 (relative 2^-9), products summed in
  # float32: ~0.3% here. No error would mean nothing ran in bfloat16;
  # bfloat16 accumulation or a wrong transpose lands far above.
  for actual, expected in ((dx, dx_ref), (dkernel, dkernel_ref)):
    err = _relative_error(actual.astype(jnp.float32),
                          expected.astype(jnp.float32))
    assert 1e-4 < err < 0.01, err


def _grads(model: Mlp, x_BxF: jax.Array) -> dict:
  graphdef, params = nnx.split(model, nnx.Param)

  def loss(params):
    return jnp.mean(nnx.merge(graphdef, params)(x_BxF) ** 2)
  return nnx.to_pure_dict(jax.jit(jax.grad(loss))(params))


def test_bf16_gradients_are_close_to_float32_gradients():
  x_BxF = _x_BxF()
  f32 = _grads(_model('float32'), x_BxF)
  bf16 = _grads(_model('bfloat16'), x_BxF)
  assert jax.tree.structure(bf16) == jax.tree.structure(f32)
  for path, g_f32 in jax.tree_util.tree_leaves_with_path(f32):
    g_bf16 = functools.reduce(lambda d, k: d[k.key], path, bf16)
    assert g_bf16.dtype == jnp.float32
    err = _relative_error(g_bf16, g_f32)
    assert 0 < err < 0.02, (jax.tree_util.keystr(path), err)


def _reference_mlp(params: dict, x_BxF: jax.Array) -> jax.Array:
  """The float32 model written out: relu hidden layers, a linear head."""
  h = x_BxF
  for layer in params['hidden'].values():
    h = jax.nn.relu(jax.lax.dot(h, layer['kernel'],
                                preferred_element_type=jnp.float32)
                    + layer['bias'].reshape(1, -1))
  head = params['head']
  return jax.lax.dot(h, head['kernel'],
                     preferred_element_type=jnp.float32) + head['bias'].reshape(
                         1, -1)


def test_float32_path_is_the_plain_dot_bit_for_bit():
  x_BxF = _x_BxF()
  model = _model('float32')
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  np.testing.assert_array_equal(jax.jit(model)(x_BxF),
                                jax.jit(_reference_mlp)(params, x_BxF))
  grads_ref = jax.jit(jax.grad(
      lambda p: jnp.mean(_reference_mlp(p, x_BxF) ** 2)))(params)
  jax.tree.map(np.testing.assert_array_equal, _grads(model, x_BxF),
               grads_ref)


def test_only_bf16_compute_uses_the_custom_matmul():
  x_BxF = _x_BxF()
  for dtype, expected in (('float32', False), ('bfloat16', True)):
    graphdef, params = nnx.split(_model(dtype), nnx.Param)
    jaxpr = jax.make_jaxpr(jax.grad(
        lambda p: jnp.sum(nnx.merge(graphdef, p)(x_BxF))))(params)
    assert ('custom_vjp_call' in str(jaxpr)) == expected, dtype


def test_bf16_model_has_the_float32_checkpoint_structure():
  def layout(model):
    return jax.tree.map(lambda a: (a.shape, a.dtype), nnx.to_pure_dict(
        nnx.state(model, nnx.Param)))
  assert layout(_model('bfloat16')) == layout(_model('float32'))


def _dot_operand_dtypes(hlo_text: str) -> list[str]:
  """The left operand's dtype of every dot in a compiled module."""
  dtypes = dict(re.findall(r'%([\w.\-]+) = (\w+)\[', hlo_text))
  return [dtypes[name] for name in re.findall(r' dot\(%([\w.\-]+),',
                                               hlo_text)]


def _has_avx512_bf16() -> bool:
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      return 'avx512_bf16' in f.read()
  except OSError:
    return False


@pytest.mark.slow  # trains: jitted steps on the mesh
@pytest.mark.skipif(not _has_avx512_bf16(),
                    reason='XLA:CPU upcasts bfloat16 dots without avx512_bf16')
def test_every_bf16_training_matmul_runs_in_bfloat16():
  """No dot of the backward pass is upcast to float32 (the slow path)."""
  # XLA:CPU keeps dots over 2 targets in float32 on its own accord (tiny).
  config = mlp_config(hidden_sizes=(64, 64), dtype='bfloat16')
  model = state_lib.Architecture(config, InputLayout.numbers(10),
                                 num_targets=16).build(0)
  graphdef, params = nnx.split(model, nnx.Param)
  x_BxF = _x_BxF(256)

  def loss(params):
    return jnp.mean(nnx.merge(graphdef, params)(x_BxF) ** 2)
  hlo = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
  # 3 forward, 3 weight-gradient and 2 input-gradient matmuls (the features
  # get none). jax.grad's own derivative upcasts at least the 3 x^T @ g.
  dtypes = _dot_operand_dtypes(hlo)
  assert dtypes == ['bf16'] * 8, dtypes


def _train_on_mesh(mesh, dtype: str, num_steps: int) -> tuple[np.ndarray,
                                                                 str]:
  """Adam on a fixed batch on `mesh`: the losses and the step's compiled HLO."""
  config = default.get_config()
  config.model.hidden_sizes = (64, 64, 64)
  config.model.dtype = dtype
  config.optimizer.schedule = 'constant'
  setup = make_setup(config_lib.parse(config),
                             InputLayout.numbers(10), num_targets=2,
                             mesh=mesh)
  rng = np.random.default_rng(0)
  x_BxF = rng.standard_normal((64, 10)).astype(np.float32)
  y_BxT = np.concatenate([np.sin(x_BxF[:, :1]), x_BxF[:, 1:2] ** 2],
                         axis=1).astype(np.float32)
  norm = FeatureStats.fit(setup.arch.layout, x_BxF, y_BxT)
  state = state_lib.create_train_state(
      setup.arch, setup.tx, mesh, 0, norm,
      optim.Hyperparameters.of(config_lib.parse(config)))
  train_step = jit_train_step(setup.graphdef, setup.arch.layout,
                                    setup.member_tx, setup.shardings, mesh)
  batch_sharding = sharding.member_batch_sharding(mesh)
  batch = {'x': jax.device_put(x_BxF[None], batch_sharding),
           'y': jax.device_put(y_BxT[None], batch_sharding)}
  hlo = train_step.lower(state, batch).compile().as_text()
  losses = []
  for _ in range(num_steps):
    state, loss_M = train_step(state, batch)
    losses.append(float(loss_M[0]))
  return np.array(losses), hlo


def _collectives(hlo_text: str) -> list[str]:
  return sorted(re.findall(
      r'= [^=]*? (all-reduce|all-gather|reduce-scatter|all-to-all|'
      r'collective-permute)(?:-start)?\(', hlo_text))


@pytest.mark.slow  # trains: jitted steps on the mesh
def test_bf16_training_on_a_sharded_mesh_matches_one_device():
  one_device, _ = _train_on_mesh(sharding.make_mesh(1, 1, jax.devices()[:1]),
                                 'bfloat16', 20)
  mesh = sharding.make_mesh(4, 2)
  losses, hlo = _train_on_mesh(mesh, 'bfloat16', 20)
  # Sharded dots add their partial products in another order, and the
  # float32 sums then round to a different bfloat16 now and then.
  np.testing.assert_allclose(losses, one_device, rtol=2e-3)
  assert losses[-1] < 0.5 * losses[0]
  # The transposed copies of x add no communication: the same collectives
  # as the float32 step.
  _, f32_hlo = _train_on_mesh(mesh, 'float32', 0)
  assert _collectives(hlo) == _collectives(f32_hlo)
  assert _collectives(hlo)  # the mesh does split the model


@pytest.mark.slow  # trains: jitted steps on the mesh
def test_raw_numbers_are_standardised_clipped_and_read_by_the_first_layer():
  from meshfit.data import features  # noqa: PLC0415
  x_NxF = np.array([[0.0, 1.0], [1.0, 2.0], [2.0, 30.0], [np.nan, 3.0],
                    [3.0, 4.0]], np.float32)
  layout = InputLayout.of((0, 0), (True, False), 'quantile', raw_numbers=True)
  stats = FeatureStats.fit(layout, x_NxF, np.zeros((5, 1), np.float32))
  inputs = features.model_inputs(stats, layout, jnp.asarray(x_NxF))
  raw = np.asarray(inputs['raw'])
  filled = np.where(np.isnan(x_NxF), np.asarray(stats.fill_N), x_NxF)
  want = (filled - np.asarray(stats.mean_N)) / np.asarray(stats.std_N)
  np.testing.assert_allclose(raw, np.clip(want, -5, 5), rtol=1e-6)
  # The quantile-scaled numbers are another thing: ranks, not distances.
  assert not np.allclose(np.asarray(inputs['numbers']), raw)
  plain = InputLayout.of((0, 0), (True, False), 'quantile')
  assert features.model_inputs(stats, plain, jnp.asarray(x_NxF))[
      'raw'].shape == (5, 0)
  config = mlp_config(hidden_sizes=(8,), numeric_embedding='ple')
  assert layout.shape.width(config) == plain.shape.width(config) + 2
  model = state_lib.Architecture(config, layout, num_targets=1).build(0)
  out = model(inputs['numbers'], inputs['missing'], inputs['codes'],
              inputs['raw'])
  moved = model(inputs['numbers'], inputs['missing'], inputs['codes'],
                inputs['raw'] + 1.0)
  assert out.shape == (5, 1) and not np.allclose(out, moved)
  # A checkpoint's layout from before the key existed reads as without.
  old = {k: v for k, v in dataclasses.asdict(plain).items()
         if k != 'raw_numbers'}
  assert InputLayout(**old) == plain


def test_categories_of_few_codes_enter_one_hot_the_others_embedded():
  # Column 0 is a number, 1 a category of 4 codes, 2 one of 40 codes.
  layout = InputLayout.of((0, 4, 40), (False, False, False), 'standardize')
  config = mlp_config(hidden_sizes=(8,), category_onehot_max=5,
                         category_embedding_dim=3)
  assert layout.shape.split_categories(config) == ((0,), (1,))
  assert layout.shape.width(config) == 1 + 4 + 3
  model = state_lib.Architecture(config, layout, num_targets=1).build(0)
  # Only the large category has embedding rows: 40 padded to 64.
  assert model.categories.table.shape == (64, 3)
  assert model.hidden[0].kernel.shape == (8, 8)
  numbers = jnp.zeros((4, 1))
  codes = jnp.array([[0, 5], [1, 5], [2, 5], [3, 5]], jnp.int32)
  out = np.asarray(model(numbers, None, codes))
  # Each code of the one-hot category reads its own row of the first
  # layer's kernel: the rows after the number's.
  kernel = np.asarray(model.hidden[0].kernel[...])
  h = jnp.asarray(kernel[1:5] + np.asarray(
      model.categories.table[...])[5] @ kernel[5:8] + np.asarray(
          model.hidden[0].bias[...]))
  want = np.asarray(model.head(jax.nn.relu(h)))
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
  assert len(set(np.round(out[:, 0], 6))) == 4
  # Without the key every category is embedded, as before it existed.
  embedded = mlp_config(hidden_sizes=(8,), category_embedding_dim=3)
  assert layout.shape.width(embedded) == 1 + 2 * 3


def test_a_ridge_part_is_a_linear_map_blended_into_the_prediction():
  # Numbers 2 (one with missing values), raw numbers, categories of 6 and 3.
  layout = InputLayout.of((0, 0, 6, 3), (True, False, False, False),
                          'standardize', raw_numbers=True)
  plain_config = mlp_config(hidden_sizes=(8, 8), category_embedding_dim=3)
  config = dataclasses.replace(plain_config, ridge_blend=True)
  plain = state_lib.Architecture(plain_config, layout, num_targets=2).build(0)
  model = state_lib.Architecture(config, layout, num_targets=2).build(0)
  assert plain.ridge is None
  # Dense inputs: 2 numbers, 2 raw, 1 flag; both categories one-hot (9
  # codes, padded to 64 rows).
  assert model.ridge.kernel.shape == (5, 2)
  assert model.ridge.table.shape == (64, 2)
  assert model.ridge_categories == (0, 1)
  # The optimizer leaves the ridge part out by this name.
  assert mlp.FITTED in nnx.to_pure_dict(nnx.state(model, nnx.Param))
  numbers = jax.random.normal(jax.random.key(3), (5, 2))
  raw = jax.random.normal(jax.random.key(4), (5, 2))
  missing = jnp.array([[0.], [1.], [0.], [0.], [1.]])
  codes = jnp.array([[0, 2], [1, 0], [2, 1], [5, 2], [4, 1]], jnp.int32)
  args = (numbers, missing, codes, raw)
  # Built from no key and zero: the network is the one without it, and an
  # unfitted ridge part changes no prediction.
  np.testing.assert_array_equal(model(*args), plain(*args))
  np.testing.assert_array_equal(model(*args, blended=True), plain(*args))
  kernel = np.asarray(jax.random.normal(jax.random.key(5), (5, 2)))
  table = np.asarray(jax.random.normal(jax.random.key(6), (64, 2)))
  model.ridge.kernel[...] = kernel
  model.ridge.table[...] = table
  model.ridge.bias[...] = jnp.array([0.5, -1.0])
  dense = np.concatenate([np.asarray(numbers), np.asarray(raw),
                          np.asarray(missing)], axis=1)
  codes_np = np.asarray(codes)
  want = (dense @ kernel + table[codes_np[:, 0]] + table[6 + codes_np[:, 1]]
          + np.array([0.5, -1.0]))
  np.testing.assert_allclose(model.ridge_part(*args), want, rtol=1e-5,
                             atol=1e-5)
  # Training fits the network alone; the prediction blends by the weight.
  network = np.asarray(model(*args))
  np.testing.assert_array_equal(network, plain(*args))
  model.ridge.weight[...] = jnp.array([0.25, 1.0])
  np.testing.assert_allclose(
      model(*args, blended=True),
      network + np.array([0.25, 1.0]) * (want - network), rtol=1e-5,
      atol=1e-5)
  # Named like the embeddings: its table may split over 'model'.
  mesh = sharding.make_mesh(4, 2)
  arch = state_lib.Architecture(config, layout, 2)
  tx = optim.make_optimizer(
      config_lib.parse(default.get_config()).optimizer, 100, fitted=True)
  specs = state_lib.state_shardings(arch, tx, mesh).params[mlp.FITTED]
  P = jax.sharding.PartitionSpec
  assert specs['table'].spec == P('members', 'model', None)
  assert specs['kernel'].spec == P('members', None, None)


def test_the_ridge_part_takes_the_smallest_categories_that_fit():
  dense = ridge_model.MAX_INPUTS - 30
  # Room for 30 codes: 5 and 15 fit (20), then 20 would not (40).
  assert ridge_model.categories_taken(dense, (900, 20, 15, 5)) == (2, 3)
  assert ridge_model.categories_taken(dense, (900, 10, 15, 5)) == (1, 2, 3)
  assert ridge_model.categories_taken(0, (3, 4)) == (0, 1)
  assert ridge_model.categories_taken(ridge_model.MAX_INPUTS, (3,)) == ()


def test_ridge_blend_must_be_a_bool_and_applies_where_it_is_weighed():
  raw = default.get_config().to_dict()
  raw['model']['ridge_blend'] = 'yes'
  with pytest.raises(UsageError,
                     match=r"model.ridge_blend='yes' must be True or False"):
    config_lib.parse(raw)
  raw['model']['ridge_blend'] = True
  assert not config_lib.parse(raw).model.ridge_blend  # no validation rows
  raw['dataset']['validation'] = 0.2
  assert config_lib.parse(raw).model.ridge_blend
  raw['model']['likelihood'] = 'gaussian'  # distributions, not values
  assert not config_lib.parse(raw).model.ridge_blend


def test_normal_quantile_edges_are_scipys():
  from scipy.special import ndtri  # noqa: PLC0415  (the reference only)
  from meshfit.models.embeddings import normal_quantile_edges  # noqa: PLC0415
  for bins in (2, 8, 16, 64, 1000):
    expected = np.concatenate([[-3.0], ndtri(np.arange(1, bins) / bins),
                               [3.0]]).astype(np.float32)
    np.testing.assert_array_equal(normal_quantile_edges(bins), expected)


def test_piecewise_linear_layer_is_each_numbers_encoding_through_its_layer():
  config = mlp_config(hidden_sizes=(8,), numeric_embedding='ple',
                      ple_bins=4, numeric_embedding_dim=2)
  layer = state_lib.Architecture(config, InputLayout.numbers(3),
                                 num_targets=1).build(0).numbers
  layer.bias[...] = jnp.asarray([[0.1, -0.2], [0.0, 0.3], [-0.1, 0.05]])
  # Below the first edge, inside bins, on an edge and above the last.
  z_BxN = np.array([[-4.0, -0.3, 0.0], [0.2, 3.5, 1.0]], np.float32)
  edges = np.array(layer.left + (layer.left[-1] + layer.width[-1],))
  kernel, bias = np.asarray(layer.kernel[...]), np.asarray(layer.bias[...])
  want = np.zeros((2, 3, 2))
  for b in range(2):
    for n in range(3):
      e = (z_BxN[b, n] - edges[:-1]) / np.diff(edges)
      e[1:] = np.maximum(e[1:], 0.0)  # the first bin is open below
      e[:-1] = np.minimum(e[:-1], 1.0)  # the last above
      want[b, n] = np.maximum(e @ kernel[n] + bias[n], 0.0)
  np.testing.assert_allclose(np.asarray(layer(jnp.asarray(z_BxN))),
                             want.reshape(2, 6), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('rows', [300, 256, 513])
def test_a_resident_table_is_encoded_in_chunks_as_if_whole(monkeypatch, rows):
  # Chunks of 64 rows (the last overlapping the one before unless rows
  # divide): the encoded table equals the table encoded in one piece.
  from meshfit.model import steps  # noqa: PLC0415
  monkeypatch.setattr(steps, 'ENCODE_CHUNK_ROWS', 64)
  rng = np.random.default_rng(0)
  x_NxF = rng.standard_normal((rows, 3)).astype(np.float32)
  x_NxF[rng.random((rows, 3)) < 0.1] = np.nan
  x_NxF[:, 2] = rng.integers(0, 5, rows)  # a category's codes
  y_NxT = rng.standard_normal((rows, 2)).astype(np.float32)
  layout = InputLayout.of((0, 0, 5), (True, True, False), 'quantile',
                          raw_numbers=True)
  stats = FeatureStats.fit(layout, x_NxF, y_NxT)
  mesh = sharding.make_mesh(jax.device_count(), 1)  # replicated on all
  table = {'x': jnp.asarray(x_NxF), 'y': jnp.asarray(y_NxT)}
  chunked = steps.jit_encode(mesh, layout)(stats, table)
  whole = jax.jit(lambda s, t: steps.encode(s, layout, t))(stats, table)
  assert chunked.keys() == whole.keys()
  for name in whole:
    np.testing.assert_array_equal(np.asarray(chunked[name]),
                                  np.asarray(whole[name]), err_msg=name)
