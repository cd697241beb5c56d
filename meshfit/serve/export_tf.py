"""The TensorFlow SavedModel of --mode=export: one tensor per column in.

The signature takes each feature column as a user's table holds it: numbers
(and booleans, as 1 or 0) as float32 with NaN for a missing value,
categories as their text (an empty string, or one of the tokens that mean
missing, input_pipeline/cells.py's MISSING_TOKENS, is missing; Unicode
whitespace around a cell is stripped, as predict strips it), dates as text in
the forms input_pipeline/cells.py reads ('2016-07-02',
'2016-07-02T14:30:00+02:00'; without an offset, UTC), a cell that is no
date being missing, as predict reads it. TensorFlow ops
turn them into the model's input columns exactly as the column plan does
(input_pipeline/column_plan.py), and the model itself is the StableHLO of
the jax.export artifact (jax2tf's native serialization), run by
TensorFlow's XlaCallModule op.

TensorFlow is imported inside the functions: only export needs it.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable, Sequence

import jax
import numpy as np

from meshfit.input_pipeline import cells, column_plan
from meshfit.input_pipeline.column_plan import ColumnPlan

SIGNATURE = 'serving_default'
# Names a signature cannot take as they are: Python's keywords, and 'self',
# which TensorFlow's own signature wrapper takes.
RESERVED_NAMES = frozenset(keyword.kwlist) | {'self'}


def signature_names(names: Sequence[str]) -> tuple[str, ...]:
  """Names that a SavedModel signature keeps as they are, one per column.

  TensorFlow rejects some argument names (spaces, '$', a leading '_',
  non-ASCII letters, RESERVED_NAMES) and silently renames others ('x/y'
  becomes 'x_y', '1st' 'arg_1st'); a client could not know which. So a name
  that is a plain identifier stays as it is, and every other one is made
  one: each run of other characters becomes '_' (none at either end), 'f_'
  goes before a leading digit, '_' after a reserved name, 'column_<i>'
  replaces a name with nothing left, and '_<i>' is appended to a name
  already taken (i being the column's position). model.json records the
  mapping.

  Args:
    names: the column names, in order.

  Returns:
    One signature name per column, all different.
  """
  def kept(name: str) -> bool:
    return (re.fullmatch(r'[A-Za-z][A-Za-z0-9_]*', name) is not None
            and name not in RESERVED_NAMES)

  # Reserved first, so that another column's cleaned name cannot take them.
  taken = {name for name in names if kept(name)}
  out = []
  for i, name in enumerate(names):
    if kept(name):
      out.append(name)
      continue
    clean = re.sub(r'[^A-Za-z0-9_]+', '_', name).strip('_')
    if not clean:
      clean = f'column_{i}'
    elif not clean[0].isalpha():
      clean = f'f_{clean}'
    if clean in RESERVED_NAMES:
      clean += '_'
    if clean in taken:
      clean = f'{clean}_{i}'
    while clean in taken:  # only if another column is named like that too
      clean += '_'
    taken.add(clean)
    out.append(clean)
  return tuple(out)


def input_dtype(kind: str) -> str:
  """The dtype a signature takes a column of this kind as."""
  return 'string' if kind in ('category', 'datetime') else 'float32'


def write_saved_model(forward: Callable[[jax.Array], jax.Array], path: str,
                      plan: ColumnPlan, input_names: Sequence[str],
                      output_names: Sequence[str],
                      platforms: Sequence[str]) -> str:
  """Writes `forward` as a SavedModel with one tensor per feature column.

  Args:
    forward: the model, from the plan's input matrix to predictions.
    path: the SavedModel's directory.
    plan: the column plan the model was trained with.
    input_names: each used feature column's signature name.
    output_names: each target's signature name.
    platforms: what the model is lowered for.

  Returns:
    TensorFlow's version.
  """
  import tensorflow as tf  # noqa: PLC0415  (only export needs TensorFlow)
  from jax.experimental import jax2tf  # noqa: PLC0415  (imports TensorFlow)

  width = len(plan.input_names)
  forward_tf = jax2tf.convert(
      forward, polymorphic_shapes=[f'(b, {width})'], with_gradient=False,
      native_serialization_platforms=tuple(platforms))
  specs = {name: tf.TensorSpec([None], getattr(tf, input_dtype(column.kind)),
                               name=name)
           for name, column in zip(input_names, plan.used)}
  encoders = [_tf_encoder(tf, column) for column in plan.used]

  @tf.function(input_signature=[specs], autograph=False)
  def serve(columns):
    parts = [encode(columns[name])
             for name, encode in zip(input_names, encoders)]
    x_BxI = tf.concat(parts, axis=1)
    pred_BxT = forward_tf(x_BxI)
    return {name: pred_BxT[:, t] for t, name in enumerate(output_names)}

  # Only as a signature: a tf.function also attached to the module would be
  # saved as a second copy of the program, doubling the SavedModel. The
  # lookup tables travel with the module.
  module = tf.Module()
  module.tables = [e.table for e in encoders if hasattr(e, 'table')]
  tf.saved_model.save(module, path,
                      signatures={SIGNATURE: serve.get_concrete_function()})
  return tf.__version__


def _tf_encoder(tf, column: column_plan.Column):
  """A TensorFlow function: one column's [b] tensor -> its [b, k] inputs."""
  if column.kind in ('number', 'boolean'):
    return lambda values: tf.cast(values, tf.float32)[:, None]
  if column.kind == 'category':
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(column.vocabulary, tf.string),
            tf.constant(np.arange(len(column.vocabulary), dtype=np.float32)
                        + column_plan.FIRST_VALUE_CODE)),
        default_value=float(column_plan.UNKNOWN_CODE))
    missing = float(column_plan.MISSING_CODE if column.has_missing
                    else column_plan.UNKNOWN_CODE)

    tokens = tf.constant(('',) + cells.MISSING_TOKENS)

    def encode(values):
      text = _tf_strip(tf, values)
      is_missing = tf.reduce_any(text[:, None] == tokens[None, :], axis=1)
      return tf.where(is_missing, missing, table.lookup(text))[:, None]
    encode.table = table
    return encode
  return lambda values: _tf_date_parts(tf, values, column.parts)


def _tf_strip(tf, text):
  """`text` stripped of cells.WHITESPACE, as predict strips a cell."""
  space = ''.join(f'\\x{{{ord(c):x}}}' for c in cells.WHITESPACE)
  return tf.strings.regex_replace(text, f'^[{space}]+|[{space}]+$', '')


def _tf_date_parts(tf, text, parts: Sequence[str]):
  """[b, len(parts)] numbers of date texts, NaN where missing or no date.

  The rules are input_pipeline/cells.py's, which predict applies: its
  regular expressions (RE2 reads them as Python does) and its arithmetic,
  run here on float64 tensors.
  """
  text = _tf_strip(tf, text)
  for pattern, rewrite in cells.DATE_REWRITES:
    text = tf.strings.regex_replace(text, pattern, rewrite)
  matched = tf.strings.regex_full_match(text, cells.DATE_PATTERN)
  # Every row split into DATE_GROUPS fields: one that is no date is read
  # as a stand-in date, then masked by `matched`.
  fields = tf.strings.regex_replace(
      tf.where(matched, text, '1970-01-01'), cells.DATE_PATTERN,
      ';'.join(f'\\{g + 1}' for g in range(cells.DATE_GROUPS)))
  fields = tf.strings.split(fields, ';').to_tensor(
      '', shape=[None, cells.DATE_GROUPS])

  def number(g):
    field = fields[:, g]
    return tf.strings.to_number(tf.where(field == '', '0', field),
                                tf.float64)
  sign = tf.where(fields[:, 6] == '-', -1.0, tf.where(fields[:, 6] == '+',
                                                      1.0, 0.0))
  values = [tf.cast(sign if g == 6 else number(g), tf.float64)
            for g in range(cells.DATE_GROUPS)]
  math = _TfMath(tf)
  seconds = cells.date_seconds_of_fields(math, values, matched)
  computed = cells.date_parts(math, seconds)
  return tf.cast(tf.stack([computed[p] for p in parts], axis=1), tf.float32)


class _TfMath:
  """What cells.py's date arithmetic takes of numpy, in TensorFlow."""

  nan = float('nan')

  def __init__(self, tf):
    self.floor = tf.math.floor
    self.ones_like = tf.ones_like

    def where(condition, a, b):
      a = tf.convert_to_tensor(a, tf.float64)
      b = tf.convert_to_tensor(b, tf.float64)
      shape = tf.shape(condition)
      return tf.where(condition, tf.broadcast_to(a, shape),
                      tf.broadcast_to(b, shape))
    self.where = where


def serve_saved_model(path: str, columns: dict[str, np.ndarray],
                      output_names: Sequence[str]) -> np.ndarray:
  """The SavedModel's predictions (pred_NxT) for one array per column."""
  import tensorflow as tf  # noqa: PLC0415  (only export needs TensorFlow)
  served = tf.saved_model.load(path).signatures[SIGNATURE]
  got = served(**{n: tf.constant(v) for n, v in columns.items()})
  return np.stack([got[n].numpy() for n in output_names], axis=1)


def signature_of(path: str) -> tuple[set[str], set[str]]:
  """(input names, output names) of a SavedModel's serving signature."""
  import tensorflow as tf  # noqa: PLC0415  (only export needs TensorFlow)
  served = tf.saved_model.load(path).signatures[SIGNATURE]
  return (set(served.structured_input_signature[1]),
          set(served.structured_outputs))
