"""--mode=export: a checkpoint as serving artifacts that need no meshfit.

One directory, written whole or not at all:

  model.jax_export  the forward pass, a serialized `jax.export.Exported`
  saved_model/      a TensorFlow SavedModel, signature `serving_default`
  model.json        what both take and return, and where they come from

Both artifacts take raw features, in the units of the training data, and
return predictions in the targets' original units: the standardisation
(`meshfit/normalization.py`) is inside them, its statistics baked in as
constants beside the parameters. A client that had to standardise its own
inputs would, the day it forgot, get wrong predictions and no error.

Both are lowered once, for a symbolic batch size and one device: the
checkpoint is restored onto a one-device mesh whatever mesh trained it, so
nothing of the training mesh is left in the artifacts.

TensorFlow and jax2tf are imported inside the functions that write and check
the SavedModel: training and the other modes never pay for them.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import keyword
import os
import re
import shutil
import uuid
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from input_pipeline import csv_regression
from input_pipeline.errors import DataError
from meshfit import (checkpointing, config as config_lib, data, predict,
                     runtime, sharding, state as state_lib, steps)
from meshfit.config import Config
from meshfit.errors import UsageError
from meshfit.normalization import Normalizer

JAX_EXPORT_FILE = 'model.jax_export'
SAVED_MODEL_DIR = 'saved_model'
MODEL_CARD_FILE = 'model.json'
SIGNATURE = 'serving_default'
# Bumped when model.json or the artifacts' calling convention changes.
FORMAT = 'meshfit.export/1'
# Lowered for every platform a server is likely to run on, not only the one
# exporting: a CPU-exported model then also serves on a GPU or a TPU (the
# artifact picks the platform it runs on).
PLATFORMS = ('cpu', 'cuda', 'tpu')
# Names a signature cannot take as they are: Python's keywords, and 'self',
# which TensorFlow's own signature wrapper takes.
RESERVED_NAMES = frozenset(keyword.kwlist) | {'self'}
# Every column is a number for now; a column plan with categories would add
# kinds (and the artifacts would take their codes).
NUMBER_KIND = 'number'
# Artifact against meshfit's own forward pass on the probe rows, relative to
# the largest prediction: a real defect (a column out of place, the
# standardisation missing) is off by far more than rounding.
CHECK_TOLERANCE = 1e-4


def export(config: ml_collections.ConfigDict | Config, workdir: str,
           output_dir: str, step: int | None = None) -> dict[str, object]:
  """Writes a checkpoint's serving artifacts into `output_dir`.

  The artifacts are written into a temporary directory beside `output_dir`,
  checked against meshfit's own predictions, and renamed into place: a
  failed export leaves nothing behind, and the workdir is only read.

  Args:
    config: the run's saved config (evaluation keys may be overridden).
    workdir: the run's workdir.
    output_dir: a new or empty directory (its parents are created).
    step: the checkpoint to export; None takes the newest intact one.

  Returns:
    {"step", "workdir", "output", "files", "check"}: the files written
    (relative to `output_dir`) and the largest relative difference of each
    artifact from meshfit's predictions on the probe rows.

  Raises:
    UsageError: several processes, an output that is a file or a non-empty
      directory, or no such (or an unreadable) checkpoint.
  """
  config = config_lib.parse(config)
  if jax.process_count() > 1:
    raise UsageError(
        f'--mode=export runs in one process, not {jax.process_count()}; run '
        'it on one host without --coordinator_address (a checkpoint loads '
        'on any mesh)')
  check_output_dir(output_dir)  # before anything slow
  step, feature_names, target_names, setup, state = _restore_on_one_device(
      config, workdir, step)
  scores, missing = eval_metrics(config, workdir, step, setup, state,
                                 feature_names, target_names)
  forward = forward_fn(setup.graphdef, state)
  input_names = signature_names(feature_names)
  output_names = tuple(predict.prediction_columns(target_names))
  tmp = _temporary_dir(output_dir)
  try:
    tf_version, check = write_artifacts(
        tmp, forward, probe_rows(jax.device_get(state.norm)), input_names,
        output_names)
    card = model_card(config, workdir, step, feature_names, target_names,
                      input_names, output_names, tf_version, scores, missing,
                      check)
    with open(os.path.join(tmp, MODEL_CARD_FILE), 'w', encoding='utf-8') as f:
      json.dump(card, f, indent=2)
      f.write('\n')
    files = _files_under(tmp)
    _move_into_place(tmp, output_dir)
  finally:
    if os.path.isdir(tmp):
      shutil.rmtree(tmp)
  logging.info('Exported step %d of %s to %s.', step, workdir, output_dir)
  return {'step': step, 'workdir': workdir, 'output': output_dir,
          'files': files, 'check': check}


def _restore_on_one_device(
    config: Config, workdir: str, step: int | None
) -> tuple[int, tuple[str, ...], tuple[str, ...], runtime.Setup,
           state_lib.TrainState]:
  """(step, feature names, target names, set-up, state) of a checkpoint,
  restored onto a one-device mesh whatever mesh trained it."""
  ckpt = checkpointing.Checkpointer(workdir, read_only=True)
  try:
    step = ckpt.step_to_restore(step)
    meta = runtime.restore_meta(ckpt, step)
    feature_names, target_names = predict.column_names(meta, step,
                                                       ckpt.directory)
    one_device = sharding.make_mesh(1, 1, jax.local_devices()[:1])
    setup = runtime.make_setup(config, len(feature_names), len(target_names),
                               mesh=one_device)
    return (step, feature_names, target_names, setup,
            runtime.restore(ckpt, setup, step))
  finally:
    ckpt.close()


def check_output_dir(path: str) -> None:
  """Refuses an output that is a file or a directory with anything in it.

  Raises:
    UsageError: naming the path and what to do instead.
  """
  if os.path.exists(path) and not os.path.isdir(path):
    raise UsageError(f'--output {path!r} is a file; export writes a '
                     'directory: name a new or an empty one')
  if os.path.isdir(path) and os.listdir(path):
    raise UsageError(f'--output {path!r} is a directory that is not empty; '
                     'export never replaces files: name a new or an empty '
                     'directory, or remove that one first')


def forward_fn(graphdef: nnx.GraphDef, state: state_lib.TrainState
               ) -> Callable[[jax.Array], jax.Array]:
  """`x_BxF -> pred_BxT` in original units, the state's arrays as constants.

  The arrays are copied to the host, so that tracing the function embeds
  them in the program as constants, whatever device they were on.
  """
  host = jax.device_get(state)

  def forward(x_BxF: jax.Array) -> jax.Array:
    return steps.predict(graphdef, host, x_BxF)
  return forward


def export_forward(forward: Callable[[jax.Array], jax.Array],
                   num_features: int) -> jax.export.Exported:
  """`forward` lowered for a float32[b, F] input, b symbolic (any b >= 1)."""
  x_spec = jax.ShapeDtypeStruct(
      jax.export.symbolic_shape(f'b, {num_features}'), jnp.float32)
  return jax.export.export(jax.jit(forward), platforms=PLATFORMS)(x_spec)


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


def probe_rows(norm: Normalizer) -> np.ndarray:
  """probe_3xF: the training mean, and a standard deviation either side.

  Rows where every column matters, in the range the model was trained on.
  """
  offsets_3x1 = np.array([[-1.0], [0.0], [1.0]], np.float32)
  return norm.x_mean_F[None] + offsets_3x1 * norm.x_std_F[None]


def write_artifacts(directory: str, forward: Callable[[jax.Array], jax.Array],
                    probe_PxF: np.ndarray, input_names: Sequence[str],
                    output_names: Sequence[str]
                    ) -> tuple[str, dict[str, float]]:
  """Writes and checks the jax.export artifact and the SavedModel.

  Returns:
    (TensorFlow's version, `check_artifacts`' differences).
  """
  exported = export_forward(forward, len(input_names))
  with open(os.path.join(directory, JAX_EXPORT_FILE), 'wb') as f:
    f.write(exported.serialize())
  tf_version = write_saved_model(
      forward, os.path.join(directory, SAVED_MODEL_DIR), input_names,
      output_names)
  return tf_version, check_artifacts(directory, forward, probe_PxF,
                                     input_names, output_names)


def write_saved_model(forward: Callable[[jax.Array], jax.Array], path: str,
                      input_names: Sequence[str],
                      output_names: Sequence[str]) -> str:
  """Writes `forward` as a SavedModel with one tensor per column.

  The signature takes one float32 [b] tensor per feature (named by
  `input_names`, the columns' order being fixed inside) and returns one per
  target: the columnar form TensorFlow Serving's REST API takes as
  `{"inputs": {"<name>": [...], ...}}`. The model itself is the same
  StableHLO as the jax.export artifact (jax2tf's native serialization), run
  by TensorFlow's XlaCallModule op.

  Returns:
    TensorFlow's version.
  """
  import tensorflow as tf  # noqa: PLC0415  (only export needs TensorFlow)
  from jax.experimental import jax2tf  # noqa: PLC0415  (imports TensorFlow)

  forward_tf = jax2tf.convert(
      forward, polymorphic_shapes=[f'(b, {len(input_names)})'],
      with_gradient=False, native_serialization_platforms=PLATFORMS)
  specs = {n: tf.TensorSpec([None], tf.float32, name=n) for n in input_names}

  @tf.function(input_signature=[specs], autograph=False)
  def serve(columns):
    x_BxF = tf.stack([columns[n] for n in input_names], axis=1)
    pred_BxT = forward_tf(x_BxF)
    return {name: pred_BxT[:, t] for t, name in enumerate(output_names)}

  # Only as a signature: a tf.function also attached to the module would be
  # saved as a second copy of the program, doubling the SavedModel.
  tf.saved_model.save(tf.Module(), path,
                      signatures={SIGNATURE: serve.get_concrete_function()})
  return tf.__version__


def check_artifacts(directory: str, forward: Callable[[jax.Array], jax.Array],
                    probe_PxF: np.ndarray, input_names: Sequence[str],
                    output_names: Sequence[str]) -> dict[str, float]:
  """Loads both artifacts back and compares them with `forward`.

  Catches, at export rather than in serving, an artifact that its own
  runtime cannot load (say, a TensorFlow too old for this StableHLO) or a
  signature whose names TensorFlow changed.

  Returns:
    {artifact: max |artifact - forward| / max |forward|} on the probe rows.

  Raises:
    RuntimeError: an artifact is off by more than CHECK_TOLERANCE, or its
      signature's names are not `input_names` and `output_names`.
  """
  import tensorflow as tf  # noqa: PLC0415  (only export needs TensorFlow)

  expected_PxT = np.asarray(jax.jit(forward)(probe_PxF))
  with open(os.path.join(directory, JAX_EXPORT_FILE), 'rb') as f:
    exported = jax.export.deserialize(bytearray(f.read()))
  served = tf.saved_model.load(os.path.join(directory, SAVED_MODEL_DIR)
                               ).signatures[SIGNATURE]
  inputs = served.structured_input_signature[1]
  outputs = served.structured_outputs
  if set(inputs) != set(input_names) or set(outputs) != set(output_names):
    raise RuntimeError(
        f'the SavedModel signature takes {sorted(inputs)} and returns '
        f'{sorted(outputs)}, not {sorted(input_names)} and '
        f'{sorted(output_names)}')
  columns = served(**{n: tf.constant(probe_PxF[:, f])
                      for f, n in enumerate(input_names)})
  results = {
      JAX_EXPORT_FILE: np.asarray(exported.call(probe_PxF)),
      SAVED_MODEL_DIR: np.stack([columns[n].numpy() for n in output_names],
                                axis=1),
  }
  scale = max(float(np.max(np.abs(expected_PxT))), np.finfo(np.float32).tiny)
  check = {}
  for name, got_PxT in results.items():
    check[name] = float(np.max(np.abs(got_PxT - expected_PxT)) / scale)
    if not check[name] <= CHECK_TOLERANCE:  # NaN fails too
      raise RuntimeError(
          f'{name} predicts {got_PxT.tolist()} for the probe rows, where '
          f'meshfit predicts {expected_PxT.tolist()}')
  return check


def eval_metrics(config: Config, workdir: str, step: int,
                 setup: runtime.Setup, state: state_lib.TrainState,
                 feature_names: Sequence[str], target_names: Sequence[str]
                 ) -> tuple[dict[str, object] | None, str | None]:
  """The checkpoint's metrics on the eval split, for the model card.

  A model card without its model's quality invites serving an untested
  model, so they are always given when they can be had: from
  `eval/step_<N>.json` when --mode=eval wrote it (the numbers the user has
  seen), else computed here as --mode=eval would compute them (nothing is
  written to the workdir). An eval split that cannot be read here (its file
  moved, another machine) does not stop the export: the artifacts do not
  depend on it, and model.json says why the metrics are missing.

  Returns:
    (metrics, None), or (None, the reason there are none).
  """
  path = os.path.join(workdir, 'eval', f'step_{step}.json')
  try:
    with open(path, encoding='utf-8') as f:
      written = json.load(f)
    if isinstance(written, dict):
      return {'source': os.path.join('eval', f'step_{step}.json'),
              **written}, None
  except (OSError, ValueError):
    pass  # none, or unreadable: computed instead
  try:
    table = data.load_eval_split(config.dataset)
  except (DataError, UsageError, OSError) as e:
    reason = (f'the eval split {config.dataset.eval_split!r} could not be '
              f'read: {str(e).splitlines()[0][:300]}')
    logging.warning('Exporting without eval metrics: %s', reason)
    return None, reason
  if (table.feature_names != tuple(feature_names)
      or table.target_names != tuple(target_names)):
    reason = (f'the eval split {config.dataset.eval_split!r} has columns '
              f'{table.feature_names + table.target_names}, not the '
              f'checkpoint\'s {tuple(feature_names) + tuple(target_names)}')
    logging.warning('Exporting without eval metrics: %s', reason)
    return None, reason
  scores = runtime.evaluate_table(setup, state, table, config.eval_batch_size)
  return {'source': 'computed by --mode=export (not written to the workdir)',
          'step': step, 'split': config.dataset.eval_split,
          'num_examples': scores['num_examples'],
          **{k: scores[k] for k in ('mse', 'rmse', 'mae', 'r2')}}, None


def model_card(config: Config, workdir: str, step: int,
               feature_names: Sequence[str], target_names: Sequence[str],
               input_names: Sequence[str], output_names: Sequence[str],
               tf_version: str, scores: dict[str, object] | None,
               missing: str | None, check: dict[str, float]
               ) -> dict[str, object]:
  """The contents of model.json: the artifacts' interface and provenance."""
  units = ('original units of the training file'
           if config.dataset.name == csv_regression.NAME else
           f'original units of the dataset {config.dataset.name!r}')
  return {
      'format': FORMAT,
      'features': [{'name': name, 'signature_input': input_names[i],
                    'kind': NUMBER_KIND, 'dtype': 'float32', 'units': units}
                   for i, name in enumerate(feature_names)],
      'targets': [{'name': name, 'signature_output': output_names[i],
                   'kind': NUMBER_KIND, 'dtype': 'float32', 'units': units}
                  for i, name in enumerate(target_names)],
      'jax_export': {
          'file': JAX_EXPORT_FILE,
          'input': (f'float32[b, {len(feature_names)}]: the features, '
                    'columns in the order of "features", raw (the '
                    'standardisation is inside)'),
          'output': (f'float32[b, {len(target_names)}]: the predictions, '
                     'columns in the order of "targets"'),
          'platforms': list(PLATFORMS)},
      'saved_model': {
          'directory': SAVED_MODEL_DIR, 'signature': SIGNATURE,
          'inputs': ('one float32 [b] tensor per feature, named by its '
                     '"signature_input"'),
          'outputs': ('one float32 [b] tensor per target, named by its '
                      '"signature_output"')},
      'check': {'probe_rows': 3, 'max_relative_difference': check},
      'step': step,
      'workdir': os.path.abspath(workdir),
      'dataset': config.dataset.name,
      'model': dataclasses.asdict(config.model),
      'eval': scores,
      **({'eval_missing_reason': missing} if missing else {}),
      'versions': {'meshfit': _meshfit_version(), 'jax': jax.__version__,
                   'jaxlib': importlib.metadata.version('jaxlib'),
                   'tensorflow': tf_version},
  }


def _meshfit_version() -> str:
  try:
    return importlib.metadata.version('meshfit')
  except importlib.metadata.PackageNotFoundError:  # run from a bare checkout
    return 'unknown'


def _temporary_dir(output_dir: str) -> str:
  """A new directory beside `output_dir` (created with its parents)."""
  output_dir = os.path.abspath(output_dir)
  parent, name = os.path.split(output_dir)
  tmp = os.path.join(parent, f'.{name}.{uuid.uuid4().hex[:8]}.tmp')
  try:
    os.makedirs(tmp)
  except OSError as e:
    raise UsageError(f'cannot create a directory in {parent!r} for '
                     f'--output: {e.strerror}; name another place') from None
  return tmp


def _move_into_place(tmp: str, output_dir: str) -> None:
  """Renames `tmp` to `output_dir`, which must be missing or empty."""
  try:
    # rename(2) replaces an empty directory and refuses a non-empty one,
    # so a file written there since `check_output_dir` is never lost.
    os.rename(tmp, output_dir)
  except OSError:
    check_output_dir(output_dir)  # says why, when it is the user's doing
    raise


def _files_under(directory: str) -> list[str]:
  """Every file under `directory`, relative to it, sorted."""
  return sorted(os.path.relpath(os.path.join(root, f), directory)
                for root, _, files in os.walk(directory) for f in files)
