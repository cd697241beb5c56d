"""A linear model of the encoded inputs, kept beside the network.

Each member may hold one (`MlpConfig.ridge_blend`): a linear map of the
numbers as the network receives them (scaled, and as they are when the
layout gives them raw), the missing flags, and categories one-hot (a row of
`table` per code). Its parameters are fitted in closed form as a ridge
regression on the member's training rows (`meshfit/model/ridge_fit.py`), not by the
optimizer, and its prediction is blended with the network's by `weight`,
which is chosen on validation rows: where a table is nearly linear, or too
small for a network to beat a linear model, the blend takes the linear
model's share, and where the network is better it takes little or none.

Every parameter starts at zero, so an unfitted ridge part changes nothing.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from meshfit.models.embeddings import (EMBED_AXIS, VOCAB_AXIS, table_lookup,
                               table_offsets, table_rows)

OUT_AXIS = 'out'  # the regression targets (as in models/mlp.py)
# The ridge part takes every number and flag, and the categories one-hot,
# smallest first, while its inputs stay within this many: its closed-form
# fit costs rows x inputs^2, and a category of thousands of codes is the
# embeddings' job.
MAX_INPUTS = 1024


def categories_taken(num_dense: int, category_sizes: tuple[int, ...]
                     ) -> tuple[int, ...]:
  """Positions, among the categories, of those the ridge part takes one-hot
  (in their order): the smallest first while the inputs fit MAX_INPUTS."""
  taken, width = [], num_dense
  for c in sorted(range(len(category_sizes)),
                  key=lambda c: (category_sizes[c], c)):
    if width + category_sizes[c] > MAX_INPUTS:
      break
    taken.append(c)
    width += category_sizes[c]
  return tuple(sorted(taken))


def _zeros(shape: tuple[int, ...], axes: tuple[str, ...]) -> nnx.Param:
  # Zeros need no key: the network's own initialisation keys stay as they
  # are without a ridge part.
  return nnx.Param(nnx.with_partitioning(nnx.initializers.zeros_init(), axes)(
      jax.random.key(0), shape, jnp.float32))


class Ridge(nnx.Module):
  """y_BxT = dense_BxD @ kernel + one row of `table` per category + bias.

  Kept in float32 whatever the network's dtypes: fitted weights rounded to
  bfloat16 would lose what the fit found.
  """

  def __init__(self, num_dense: int, category_sizes: tuple[int, ...],
               out_features: int):
    self.offsets = table_offsets(category_sizes)
    # One unused row where there is no dense input (a table of categories
    # only): Orbax cannot save an empty array.
    self.kernel = _zeros((max(num_dense, 1), out_features),
                         (EMBED_AXIS, OUT_AXIS))
    rows = table_rows(category_sizes)
    self.table = (_zeros((rows, out_features), (VOCAB_AXIS, OUT_AXIS))
                  if category_sizes else None)
    self.bias = _zeros((out_features,), (OUT_AXIS,))
    # The share of the ridge part in the member's prediction, per target.
    self.weight = _zeros((out_features,), (OUT_AXIS,))

  def __call__(self, dense_BxD: jax.Array, codes_BxC: jax.Array | None
               ) -> jax.Array:
    """The linear model's prediction for the dense inputs and the codes of
    the categories it takes."""
    # HIGHEST: a TPU's default float32 matmul rounds its operands to
    # bfloat16, which would undo the fit's precision.
    y_BxT = jnp.matmul(dense_BxD, self.kernel[...][:dense_BxD.shape[1]],
                       precision=jax.lax.Precision.HIGHEST)
    y_BxT = y_BxT + self.bias[...][None]
    if self.table is not None:
      rows_BxC = table_lookup(codes_BxC, self.offsets)
      y_BxT = y_BxT + jnp.take(self.table[...], rows_BxC, axis=0).sum(axis=1)
    return y_BxT

  def blend(self, network_BxT: jax.Array, ridge_BxT: jax.Array) -> jax.Array:
    """The member's prediction: `weight` of the ridge part, the rest the
    network's."""
    return network_BxT + self.weight[...][None] * (ridge_BxT - network_BxT)
