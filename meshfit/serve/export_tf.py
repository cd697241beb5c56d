"""The TensorFlow SavedModel of --mode=export: one tensor per column in.

The signature takes each feature column as a user's table holds it: numbers
(and booleans, as 1 or 0) as float32 with NaN for a missing value,
categories as their text (an empty string is missing), dates as ISO-8601
text ('2016-07-02' or '2016-07-02T14:30:00', read as UTC). TensorFlow ops
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

from input_pipeline import column_plan
from input_pipeline.column_plan import ColumnPlan

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

    def encode(values):
      text = tf.strings.strip(values)
      return tf.where(text == '', missing, table.lookup(text))[:, None]
    encode.table = table
    return encode
  return lambda values: _tf_date_parts(tf, values, column.parts)


def _tf_date_parts(tf, text, parts: Sequence[str]):
  """[b, len(parts)] numbers of ISO-8601 dates (NaN where empty)."""
  text = tf.strings.strip(text)
  # Padded, so that every field's position exists (an empty or date-only
  # text reads a time of 00:00:00; masked by the text's length below).
  padded = tf.strings.join([text, tf.fill(tf.shape(text),
                                          '0000-01-01T00:00:00')])

  def number(start, length):
    return tf.strings.to_number(tf.strings.substr(padded, start, length),
                                tf.float64)
  year, month, day = number(0, 4), number(5, 2), number(8, 2)
  timed = tf.strings.length(text) >= 13
  hour = tf.where(timed, number(11, 2), 0.0)
  minute = tf.where(tf.strings.length(text) >= 16, number(14, 2), 0.0)
  second = tf.where(tf.strings.length(text) >= 19, number(17, 2), 0.0)

  def days_from_civil(y, m, d):
    # Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant).
    y = y - tf.cast(m <= 2, tf.float64)
    era = tf.math.floor(y / 400.0)
    yoe = y - era * 400.0
    mp = tf.math.floormod(m + 9.0, 12.0)
    doy = tf.math.floor((153.0 * mp + 2.0) / 5.0) + d - 1.0
    doe = (yoe * 365.0 + tf.math.floor(yoe / 4.0)
           - tf.math.floor(yoe / 100.0) + doy)
    return era * 146097.0 + doe - 719468.0
  days = days_from_civil(year, month, day)
  values = {
      'days': days + (hour * 3600.0 + minute * 60.0 + second) / 86400.0,
      'year': year, 'month': month, 'day': day,
      'weekday': tf.math.floormod(days + 3.0, 7.0),  # 1970-01-01: Thursday
      'dayofyear': days - days_from_civil(year, tf.ones_like(year),
                                          tf.ones_like(year)) + 1.0,
      'hour': hour,
  }
  out = tf.stack([values[p] for p in parts], axis=1)
  empty = tf.repeat((text == '')[:, None], len(parts), axis=1)
  out = tf.where(empty, tf.constant(np.nan, tf.float64), out)
  return tf.cast(out, tf.float32)


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
