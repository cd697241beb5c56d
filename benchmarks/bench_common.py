"""What the benchmarks share: the benchmark MLP's loss and markdown tables.

Imported by the scripts beside it (`python benchmarks/speed.py` puts this
folder first on the module path).
"""

import re
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

Matmul = Callable[[jax.Array, jax.Array], jax.Array]


def mlp_loss(params: Sequence[tuple[jax.Array, jax.Array]], x_BxF: jax.Array,
             y_BxT: jax.Array, matmul: Matmul) -> jax.Array:
  """The benchmark MLP: `matmul` dense layers with ReLU between them, then
  the mean squared error. `params` is [(kernel_IxO, bias_O), ...]."""
  h = x_BxF
  for i, (w, b) in enumerate(params):
    h = matmul(h, w) + b
    if i < len(params) - 1:
      h = jax.nn.relu(h)
  return jnp.mean((h - y_BxT)**2)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]],
                   text_columns: int = 1) -> str:
  """A markdown table whose columns line up in plain text too.

  The first `text_columns` columns are left-aligned; after them numbers are
  right-aligned (with a `:` rule) and other text left-aligned.
  """
  rows = [[str(c) for c in r] + [''] * (len(header) - len(r)) for r in rows]
  widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
  numeric = [i >= text_columns and any(re.match(r'-?[0-9]', r[i])
                                        for r in rows)
             for i in range(len(header))]

  def line(cells):
    return '| ' + ' | '.join(
        c.rjust(w) if numeric[i] and re.match(r'-?[0-9]', c) else c.ljust(w)
        for i, (c, w) in enumerate(zip(map(str, cells), widths))) + ' |'
  sep = '|' + '|'.join('-' * (w + 1) + ':' if numeric[i] else '-' * (w + 2)
                       for i, w in enumerate(widths)) + '|'
  return '\n'.join([line(header), sep] + [line(r) for r in rows])
