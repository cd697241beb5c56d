"""How numbers and categories enter the network, before its hidden layers.

Both carry logical axis names like the dense layers (models/mlp.py), so
`meshfit/parallel/sharding.py` alone places them: a category table's rows are named
VOCAB_AXIS, which may split over the model-parallel axis for a large
vocabulary.
"""

import statistics

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# Logical axis names of the embeddings (see also models/mlp.py).
VOCAB_AXIS = 'vocab'  # rows of a category embedding table
FEATURE_AXIS = 'feature'  # one entry per input number
BIN_AXIS = 'bin'  # the bins of a piecewise-linear encoding
EMBED_AXIS = 'embed'  # an embedding's width, kept whole
# A category table's rows are padded to a multiple of this, so that they
# split evenly over any power-of-two model axis up to it.
VOCAB_ROWS_MULTIPLE = 64


def table_offsets(sizes: tuple[int, ...]) -> tuple[int, ...]:
  """Where each category column's codes start in one table of every
  column's codes (column c's code k is row offsets[c] + k)."""
  return tuple(int(o) for o in np.cumsum((0,) + tuple(sizes[:-1])))


def table_rows(sizes: tuple[int, ...]) -> int:
  """That table's rows, padded to a multiple of VOCAB_ROWS_MULTIPLE."""
  return -(-sum(sizes) // VOCAB_ROWS_MULTIPLE) * VOCAB_ROWS_MULTIPLE


def table_lookup(codes_BxC: jax.Array, offsets: tuple[int, ...]) -> jax.Array:
  """The table rows of a batch's codes."""
  return codes_BxC + jnp.asarray(offsets, codes_BxC.dtype)[None]


def normal_quantile_edges(bins: int) -> np.ndarray:
  """bins + 1 edges: equal-probability bins of a standard normal, the outer
  edges at +-3 (numbers scaled to a normal fall in equal shares)."""
  # The standard library's, not jax.scipy's: constants even while the model
  # is traced (nnx.eval_shape, jit), where a jax op would give a tracer; and
  # not scipy's, whose import cost a small run 0.1-0.2 s (in float32 the
  # same edges as scipy.special.ndtri for every bins up to 1024).
  normal = statistics.NormalDist()
  inner = [normal.inv_cdf(i / bins) for i in range(1, bins)]
  return np.concatenate([[-3.0], inner, [3.0]]).astype(np.float32)


class PiecewiseLinear(nnx.Module):
  """Each number's piecewise-linear encoding, then its own dense + ReLU.

  Gorishniy et al. 2022 ("On Embeddings for Numerical Features in Tabular
  Deep Learning"), PLE followed by a per-feature linear layer and ReLU. The
  bins' edges are fixed normal quantiles: the numbers arrive scaled (to a
  normal by the quantile scaling), so each bin holds about as many training
  values as the others.
  """

  def __init__(self, num_numbers: int, bins: int, dim: int, *,
               param_dtype: jnp.dtype, rngs: nnx.Rngs):
    edges = normal_quantile_edges(bins)
    self.left = tuple(float(e) for e in edges[:-1])
    self.width = tuple(float(w) for w in np.diff(edges))
    init = nnx.initializers.variance_scaling(1.0, 'fan_in', 'normal',
                                             in_axis=1, out_axis=2)
    self.kernel = nnx.Param(nnx.with_partitioning(
        init, (FEATURE_AXIS, BIN_AXIS, EMBED_AXIS))(
            rngs.params(), (num_numbers, bins, dim), param_dtype))
    self.bias = nnx.Param(nnx.with_partitioning(
        nnx.initializers.zeros_init(), (FEATURE_AXIS, EMBED_AXIS))(
            rngs.params(), (num_numbers, dim), param_dtype))

  def __call__(self, z_BxN: jax.Array) -> jax.Array:
    """B x (N * dim) features of the scaled numbers z_BxN."""
    # Numbers first: each number's product is then one of N plain matrix
    # products, with no transposes around it; rows first, XLA:CPU moved
    # every operand and gradient into that order and back, and the layer's
    # gradient step took 1.8x the time (docs/performance.md).
    z_NxB = z_BxN.T
    left_1x1xK = jnp.asarray(self.left)[None, None]
    width_1x1xK = jnp.asarray(self.width)[None, None]
    e_NxBxK = (z_NxB[..., None] - left_1x1xK) / width_1x1xK
    bins = len(self.left)
    # The first bin is open below and the last above; the others saturate.
    lower_1x1xK = jnp.where(jnp.arange(bins) == 0, -jnp.inf, 0.0)[None, None]
    upper_1x1xK = jnp.where(jnp.arange(bins) == bins - 1, jnp.inf,
                            1.0)[None, None]
    e_NxBxK = jnp.clip(e_NxBxK, lower_1x1xK, upper_1x1xK)
    h_NxBxD = jnp.einsum('nbk,nkd->nbd', e_NxBxK,
                         self.kernel[...].astype(jnp.float32))
    h_NxBxD = jax.nn.relu(h_NxBxD
                          + self.bias[...].astype(jnp.float32)[:, None])
    return jnp.transpose(h_NxBxD, (1, 0, 2)).reshape(z_BxN.shape[0], -1)


class CategoryEmbedding(nnx.Module):
  """One learned vector per value of every category column.

  All columns share one table: column c's codes 0..sizes[c]-1 are rows
  offsets[c].. of it, so a batch's lookups are a single gather.
  """

  def __init__(self, sizes: tuple[int, ...], dim: int, *,
               param_dtype: jnp.dtype, rngs: nnx.Rngs):
    self.offsets = table_offsets(sizes)
    rows = table_rows(sizes)
    self.table = nnx.Param(nnx.with_partitioning(
        nnx.initializers.normal(1.0), (VOCAB_AXIS, EMBED_AXIS))(
            rngs.params(), (rows, dim), param_dtype))

  def __call__(self, codes_BxC: jax.Array) -> jax.Array:
    """B x (C * dim) features of the integer codes codes_BxC."""
    rows_BxC = table_lookup(codes_BxC, self.offsets)
    vectors_BxCxD = jnp.take(self.table[...], rows_BxC, axis=0)
    return vectors_BxCxD.astype(jnp.float32).reshape(codes_BxC.shape[0], -1)


class MemberVocabulary(nnx.Module):
  """Which category codes a member uses; the others it reads as unknown.

  Cross-fitted members train on different rows, so a value rare in the
  table may be absent from (or too rare in) one member's training rows: its
  embedding there is the random initialisation, which would then score the
  member's validation rows and move its predictions. `known` (1 or 0 per
  code, all columns in one table as in CategoryEmbedding) is set before the
  first step from the member's own training rows
  (meshfit/model/vocabulary_fit.py) and never trained; a code it does not
  know becomes the column's unknown code, which that member did train on
  its rare values. It starts at 1 everywhere: every code known.
  """

  def __init__(self, sizes: tuple[int, ...]):
    self.offsets = table_offsets(sizes)
    rows = table_rows(sizes)
    # Ones need no key: the network's initialisation stays as it is.
    self.known = nnx.Param(nnx.with_partitioning(
        nnx.initializers.ones_init(), (VOCAB_AXIS,))(
            jax.random.key(0), (rows,), jnp.float32))

  def __call__(self, codes_BxC: jax.Array) -> jax.Array:
    """The codes with those this member does not know replaced by 0, the
    unknown code (column_plan.UNKNOWN_CODE)."""
    rows_BxC = table_lookup(codes_BxC, self.offsets)
    known_V = jax.lax.stop_gradient(self.known[...])
    known_BxC = jnp.take(known_V, rows_BxC) > 0.5
    return jnp.where(known_BxC, codes_BxC, 0)
