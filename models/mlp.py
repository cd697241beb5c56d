"""A multilayer perceptron regressor whose parameters carry logical axis names.

The names say what each dimension *is*; `meshfit/parallel/sharding.py` alone decides
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

from meshfit.models import embeddings, ridge
from meshfit.models.low_precision import bf16_dot_general

# Logical axis names, mapped to mesh axes in meshfit/parallel/sharding.py (more in
# models/embeddings.py).
EMBED_AXIS = embeddings.EMBED_AXIS  # a feature dimension kept whole
HIDDEN_AXIS = 'mlp'  # a hidden dimension split over the model-parallel axis
OUT_AXIS = ridge.OUT_AXIS  # the regression targets
# The fitted ridge part's name among a member's parameters (`Mlp.ridge`):
# the optimizer leaves it out (meshfit/model/optim.py), as it does the
# member's vocabulary (`Mlp.vocabulary`), set before training too.
FITTED = 'ridge'
VOCABULARY = 'vocabulary'

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
  """The model section of the config, typed: each field is the config key
  `model.<field>`, whose default, meaning and accepted values
  configs/default.py declares (tests/test_config.py holds these fields to
  the declarations; a model knows nothing of configs).

  How the network reads some of them: `dtype` is what the matmuls' inputs
  are cast to, their products accumulated in float32 (with bfloat16 the
  backward pass's matmuls run in bfloat16 too, `low_precision_matmul`;
  biases, activations and gradients stay float32); `ensemble_size` members
  are stacked by the train state, one Mlp being one member; `gaussian`
  makes the head predict a mean and a raw variance (2 T outputs).
  """
  hidden_sizes: tuple[int, ...]
  activation: str
  dropout_rate: float
  dtype: str
  param_dtype: str
  numeric_embedding: str
  raw_numbers: bool
  ple_bins: int
  numeric_embedding_dim: int
  category_embedding_dim: int
  category_onehot_max: int
  category_member_min_count: int
  ridge_blend: bool
  ensemble_size: int
  likelihood: str
  nll_beta: float

  def __post_init__(self):
    # ml_collections hands tuples over as lists after JSON round trips.
    object.__setattr__(self, 'hidden_sizes', tuple(self.hidden_sizes))


@dataclasses.dataclass(frozen=True)
class InputShape:
  """What the network reads: the widths of its three kinds of input.

  Attributes:
    num_numbers: scaled numbers (N).
    num_missing: 0/1 missing indicators (M).
    category_sizes: the number of codes of each category column (C of them).
    num_raw: numbers also given as they are (standardised), beside their
      embedding: a linear path to the first layer (R).
  """
  num_numbers: int
  num_missing: int = 0
  category_sizes: tuple[int, ...] = ()
  num_raw: int = 0

  def width(self, config: MlpConfig) -> int:
    """The width of the first hidden layer's input."""
    numbers = self.num_numbers
    if config.numeric_embedding == 'ple':
      numbers *= config.numeric_embedding_dim
    onehot, embedded = self.split_categories(config)
    return (numbers + self.num_raw + self.num_missing
            + sum(self.category_sizes[c] for c in onehot)
            + len(embedded) * config.category_embedding_dim)

  @property
  def ridge_dense(self) -> int:
    """The ridge part's dense inputs: numbers, raw numbers, flags."""
    return self.num_numbers + self.num_raw + self.num_missing

  def ridge_categories(self) -> tuple[int, ...]:
    """Positions of the categories the ridge part takes one-hot."""
    return ridge.categories_taken(self.ridge_dense, self.category_sizes)

  def split_categories(self, config: MlpConfig
                       ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Positions, among the categories, of those entering one-hot and of
    those entering through an embedding."""
    onehot = tuple(c for c, n in enumerate(self.category_sizes)
                   if n <= config.category_onehot_max)
    return onehot, tuple(c for c in range(len(self.category_sizes))
                         if c not in onehot)


def hidden_axes(layer: int) -> tuple[str, str]:
  """Logical names of hidden layer `layer`'s kernel (in, out).

  Even layers split their output features (column-split), odd layers their
  input features (row-split), so activations alternate between split and whole.
  """
  return ((EMBED_AXIS, HIDDEN_AXIS) if layer % 2 == 0 else
          (HIDDEN_AXIS, EMBED_AXIS))


def output_axes(num_hidden: int) -> tuple[str, str]:
  """Logical names of the output kernel, which consumes the last hidden layer."""
  if num_hidden == 0:
    return (EMBED_AXIS, OUT_AXIS)
  return (hidden_axes(num_hidden - 1)[1], OUT_AXIS)


def num_params(layer_sizes: tuple[int, ...]) -> int:
  """Weights and biases of dense layers features -> hidden... -> targets."""
  return sum(a * b + b for a, b in zip(layer_sizes[:-1], layer_sizes[1:]))


def _dense(in_features: int, out_features: int, axes: tuple[str, str],
           config: MlpConfig, rngs: nnx.Rngs) -> nnx.Linear:
  compute = {'dtype': DTYPES[config.dtype]}
  if DTYPES[config.dtype] == jnp.bfloat16:
    # The matmul casts its operands itself; the bias and the sum stay float32.
    compute = {'dtype': None, 'dot_general': bf16_dot_general}
  return nnx.Linear(
      in_features, out_features,
      param_dtype=DTYPES[config.param_dtype],
      # A bfloat16 dot that also *outputs* bfloat16 rounds every partial sum
      # and on CPU runs slower than float32; accumulating in float32 keeps the
      # precision and is the fast path (on CPU and TPU alike).
      preferred_element_type=jnp.float32,
      **compute,
      kernel_init=nnx.with_partitioning(
          nnx.initializers.lecun_normal(), axes),
      bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), axes[1:]),
      rngs=rngs)


class Mlp(nnx.Module):
  """Numbers, missing flags and categories -> y_BxT: their embeddings,
  hidden layers with an activation, then a linear head."""

  def __init__(self, config: MlpConfig, inputs: InputShape | int,
               out_features: int, *, rngs: nnx.Rngs):
    """Builds the layers; `config` names keys of ACTIVATIONS and DTYPES.

    Args:
      config: the model section of the config.
      inputs: the input's shape; an int is that many numbers alone.
      out_features: T, the targets.
      rngs: initialisation keys.
    """
    if isinstance(inputs, int):
      inputs = InputShape(inputs)
    self.activation = ACTIVATIONS[config.activation]
    self.dropout_rate = config.dropout_rate
    self.likelihood, self.nll_beta = config.likelihood, config.nll_beta
    if config.likelihood == 'gaussian':
      out_features *= 2  # a mean and a raw variance per target
    param_dtype = DTYPES[config.param_dtype]
    self.numbers = (embeddings.PiecewiseLinear(
        inputs.num_numbers, config.ple_bins, config.numeric_embedding_dim,
        param_dtype=param_dtype, rngs=rngs)
                    if config.numeric_embedding == 'ple'
                    and inputs.num_numbers else None)
    # A category of few values is as expressive one-hot as embedded (the
    # first layer's weights then are its embedding); which trains better is
    # measured in docs/tables.md.
    self.onehot, self.embedded = inputs.split_categories(config)
    self.onehot_sizes = tuple(inputs.category_sizes[c] for c in self.onehot)
    self.vocabulary = (embeddings.MemberVocabulary(inputs.category_sizes)
                       if config.category_member_min_count
                       and inputs.category_sizes else None)
    self.categories = (embeddings.CategoryEmbedding(
        tuple(inputs.category_sizes[c] for c in self.embedded),
        config.category_embedding_dim, param_dtype=param_dtype, rngs=rngs)
                       if self.embedded else None)
    sizes = (inputs.width(config),) + config.hidden_sizes
    self.hidden = nnx.List([
        _dense(sizes[i], sizes[i + 1], hidden_axes(i), config, rngs)
        for i in range(len(config.hidden_sizes))])
    self.head = _dense(sizes[-1], out_features,
                       output_axes(len(config.hidden_sizes)), config, rngs)
    # Built last and from no key: the network's parameters are the same
    # with or without it.
    self.ridge_categories = inputs.ridge_categories()
    self.ridge = (ridge.Ridge(
        inputs.ridge_dense, tuple(inputs.category_sizes[c]
                                  for c in self.ridge_categories),
        out_features) if config.ridge_blend else None)

  def __call__(self, numbers_BxN: jax.Array,
               missing_BxM: jax.Array | None = None,
               codes_BxC: jax.Array | None = None,
               raw_BxR: jax.Array | None = None,
               dropout_key: jax.Array | None = None,
               dropout_rate: jax.Array | float | None = None,
               blended: bool = False) -> jax.Array:
    """Predicts targets.

    Args:
      numbers_BxN: a batch of scaled numbers.
      missing_BxM: 0/1 flags of the numbers that were missing (those that
        had missing values in training), or None.
      codes_BxC: int32 category codes, or None.
      raw_BxR: numbers as they are (standardised), or None.
      dropout_key: a PRNG key; dropout is applied only when one is given
        (i.e. in training) and the rate is positive.
      dropout_rate: the rate (a member's own, maybe traced); default the
        config's.
      blended: with a ridge part, the member's prediction (the network's
        and the ridge part's, blended); else the network's alone, what
        training fits.

    Returns:
      y_BxT, the predictions (y_Bx2T for a gaussian likelihood: the means,
      then the raw variances), in float32 whatever the compute dtype (so the
      loss is computed in float32).
    """
    out = self.network(numbers_BxN, missing_BxM, codes_BxC, raw_BxR,
                       dropout_key, dropout_rate)
    if not blended or self.ridge is None:
      return out
    return self.ridge.blend(out, self.ridge_part(numbers_BxN, missing_BxM,
                                                 codes_BxC, raw_BxR))

  def network(self, numbers_BxN: jax.Array,
              missing_BxM: jax.Array | None = None,
              codes_BxC: jax.Array | None = None,
              raw_BxR: jax.Array | None = None,
              dropout_key: jax.Array | None = None,
              dropout_rate: jax.Array | float | None = None) -> jax.Array:
    """The network's own prediction (`__call__`'s arguments)."""
    if dropout_rate is None:
      dropout_rate = self.dropout_rate
    # The named scopes name each part's ops in the compiled program (and so
    # in a profile of a run: config.profile_start_step); they change no op.
    with jax.named_scope('number_embedding'):
      parts = [numbers_BxN if self.numbers is None
               else self.numbers(numbers_BxN)]
    if raw_BxR is not None and raw_BxR.shape[1]:
      parts.append(raw_BxR)
    if missing_BxM is not None and missing_BxM.shape[1]:
      parts.append(missing_BxM)
    if self.vocabulary is not None:
      codes_BxC = self.vocabulary(codes_BxC)
    parts.extend(jax.nn.one_hot(codes_BxC[:, c], n, dtype=jnp.float32)
                 for c, n in zip(self.onehot, self.onehot_sizes))
    if self.categories is not None:
      with jax.named_scope('category_embedding'):
        parts.append(self.categories(codes_BxC[:, list(self.embedded)]))
    h = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)
    for i, layer in enumerate(self.hidden):
      with jax.named_scope(f'hidden_{i}'):
        h = self.activation(layer(h))
        if dropout_key is not None:
          keep = 1.0 - dropout_rate
          mask = jax.random.bernoulli(
              jax.random.fold_in(dropout_key, i), keep, h.shape)
          h = jnp.where(mask, h / keep, 0.0)
    with jax.named_scope('head'):
      return self.head(h)

  def ridge_part(self, numbers_BxN: jax.Array,
                 missing_BxM: jax.Array | None = None,
                 codes_BxC: jax.Array | None = None,
                 raw_BxR: jax.Array | None = None) -> jax.Array:
    """The ridge part's prediction, y_BxT (the model must have one)."""
    dense_BxD = ridge_inputs(numbers_BxN, missing_BxM, raw_BxR)
    codes = (codes_BxC[:, list(self.ridge_categories)]
             if self.ridge_categories else None)
    return self.ridge(dense_BxD, codes)


def ridge_inputs(numbers_BxN: jax.Array, missing_BxM: jax.Array | None,
                 raw_BxR: jax.Array | None) -> jax.Array:
  """The ridge part's dense inputs: the scaled numbers, the raw ones and
  the missing flags, side by side (meshfit/model/ridge_fit.py fits on the same)."""
  parts = [numbers_BxN]
  for extra in (raw_BxR, missing_BxM):
    if extra is not None and extra.shape[1]:
      parts.append(extra)
  return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)
