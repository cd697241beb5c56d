"""A multilayer perceptron regressor whose parameters carry logical axis names.

The names say what each dimension *is*; `meshfit/sharding.py` alone decides
which mesh axis (if any) it is split over. Hidden layers alternate between
column-split kernels (`('embed', 'mlp')`: the output features are split) and
row-split kernels (`('mlp', 'embed')`: the input features are split), so a
pair of layers needs a single all-reduce, as in the JAX sharding tutorial's
4 x 2 data x model example.
"""

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

# Logical axis names, mapped to mesh axes in meshfit/sharding.py.
EMBED = 'embed'  # a feature dimension kept whole on every device
MLP = 'mlp'  # a hidden dimension split over the model-parallel axis
OUT = 'out'  # the regression targets

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    'relu': jax.nn.relu,
    'gelu': jax.nn.gelu,
    'tanh': jnp.tanh,
    'silu': jax.nn.silu,
    'elu': jax.nn.elu,
    'sigmoid': jax.nn.sigmoid,
    'identity': lambda x: x,
}

# Names accepted by `MlpConfig.dtype` and `MlpConfig.param_dtype`.
DTYPES: dict[str, jnp.dtype] = {
    'float32': jnp.dtype(jnp.float32),
    'bfloat16': jnp.dtype(jnp.bfloat16),
}


@dataclasses.dataclass(frozen=True)
class MlpConfig:
  """The model section of the config, typed.

  Attributes:
    hidden_sizes: widths of the hidden layers; `()` is a linear model.
    activation: a key of `ACTIVATIONS`.
    dropout_rate: dropout probability after each hidden activation.
    dtype: a key of `DTYPES`: what the matmuls' inputs are cast to. Their
      products are accumulated and returned in float32 whatever it is.
    param_dtype: a key of `DTYPES`: how parameters are stored (and so the
      optimizer's moments and the checkpoints).
  """
  hidden_sizes: tuple[int, ...] = (128, 128)
  activation: str = 'relu'
  dropout_rate: float = 0.0
  dtype: str = 'float32'
  param_dtype: str = 'float32'

  def __post_init__(self):
    # ml_collections hands tuples over as lists after JSON round trips.
    object.__setattr__(self, 'hidden_sizes', tuple(self.hidden_sizes))


def hidden_axes(layer: int) -> tuple[str, str]:
  """Logical names of hidden layer `layer`'s kernel (in, out).

  Even layers split their output features (column-split), odd layers their
  input features (row-split), so activations alternate between split and whole.
  """
  return (EMBED, MLP) if layer % 2 == 0 else (MLP, EMBED)


def output_axes(num_hidden: int) -> tuple[str, str]:
  """Logical names of the output kernel, which consumes the last hidden layer."""
  if num_hidden == 0:
    return (EMBED, OUT)
  return (hidden_axes(num_hidden - 1)[1], OUT)


def _dense(in_features: int, out_features: int, axes: tuple[str, str],
           config: MlpConfig, rngs: nnx.Rngs) -> nnx.Linear:
  return nnx.Linear(
      in_features, out_features,
      dtype=DTYPES[config.dtype],
      param_dtype=DTYPES[config.param_dtype],
      # A bfloat16 dot that also *outputs* bfloat16 rounds every partial sum
      # and on CPU runs slower than float32; accumulating in float32 keeps the
      # precision and is the fast path (on CPU and TPU alike).
      preferred_element_type=jnp.float32,
      kernel_init=nnx.with_partitioning(
          nnx.initializers.lecun_normal(), axes),
      bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), axes[1:]),
      rngs=rngs)


class Mlp(nnx.Module):
  """`x_BxF -> y_BxT`: hidden layers with an activation, then a linear head."""

  def __init__(self, config: MlpConfig, in_features: int, out_features: int,
               *, rngs: nnx.Rngs):
    if config.activation not in ACTIVATIONS:
      raise ValueError(f'unknown activation {config.activation!r}; '
                       f'choose one of {sorted(ACTIVATIONS)}')
    for name in (config.dtype, config.param_dtype):
      if name not in DTYPES:
        raise ValueError(f'unknown dtype {name!r}; choose one of '
                         f'{sorted(DTYPES)}')
    self.activation = ACTIVATIONS[config.activation]
    self.dropout_rate = config.dropout_rate
    sizes = (in_features,) + config.hidden_sizes
    self.hidden = nnx.List([
        _dense(sizes[i], sizes[i + 1], hidden_axes(i), config, rngs)
        for i in range(len(config.hidden_sizes))])
    self.head = _dense(sizes[-1], out_features,
                       output_axes(len(config.hidden_sizes)), config, rngs)

  def __call__(self, x_BxF: jax.Array,
               dropout_key: jax.Array | None = None) -> jax.Array:
    """Predicts targets.

    Args:
      x_BxF: a batch of (standardised) features.
      dropout_key: a PRNG key; dropout is applied only when one is given
        and the rate is positive (i.e. in training).

    Returns:
      y_BxT, the predictions, in float32 whatever the compute dtype (so the
      loss is computed in float32).
    """
    h = x_BxF
    for i, layer in enumerate(self.hidden):
      h = self.activation(layer(h))
      if dropout_key is not None and self.dropout_rate > 0:
        keep = 1.0 - self.dropout_rate
        mask = jax.random.bernoulli(
            jax.random.fold_in(dropout_key, i), keep, h.shape)
        h = jnp.where(mask, h / keep, 0.0)
    return self.head(h)
