"""--mode=export: a checkpoint as serving artifacts that need no meshfit.

One directory, written whole or not at all:

  model.jax_export  the forward pass, a serialized `jax.export.Exported`
  saved_model/      a TensorFlow SavedModel, signature `serving_default`
  model.json        what both take and return, and where they come from

Both artifacts take raw features, in the units of the training data, and
return predictions in the targets' original units: filling missing numbers,
scaling (`meshfit/data/features.py`) and, in the SavedModel, the column plan's
encoding of text and dates (`export_tf.py`) are inside them, their
statistics and vocabularies baked in as constants beside the parameters. A
client that had to scale or encode its own inputs would, the day it got
them wrong, get wrong predictions and no error.

Both are lowered once, for a symbolic batch size and one device: the
checkpoint is restored onto a one-device mesh whatever mesh trained it, so
nothing of the training mesh is left in the artifacts.

TensorFlow and jax2tf are imported inside the functions that write and check
the SavedModel: training and the other modes never pay for them.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from meshfit import storage
from meshfit.input_pipeline.column_plan import ColumnPlan
from meshfit import config as config_lib
from meshfit.checkpoints import reading
from meshfit.config import Config
from meshfit.data.features import FeatureStats, InputLayout
from meshfit.errors import UsageError
from meshfit.model import forward as forward_lib, state as state_lib
from meshfit.model.setup import Setup
from meshfit.parallel import sharding
from meshfit.report import writers
from meshfit.serve import (export_tf, model_card, outputs as outputs_lib,
                           predict)
from meshfit.serve.model_card import (JAX_EXPORT_FILE, PLATFORMS,
                                      SAVED_MODEL_DIR)

if TYPE_CHECKING:
  import pandas as pd

MODEL_CARD_FILE = 'model.json'
SIGNATURE = export_tf.SIGNATURE
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
  outputs_lib.check_outside_run(output_dir, workdir, '--output')
  check_output_dir(output_dir)  # before anything slow
  step, plan, config, setup, state = _restore_on_one_device(config, workdir,
                                                            step)
  scores, missing = model_card.eval_metrics(config, workdir, step, setup,
                                            state, plan)
  forward = forward_fn(setup.graphdef, setup.arch.layout, state,
                       setup.distribution)
  input_names = export_tf.signature_names(plan.feature_names)
  output_names = tuple(predict.prediction_columns(
      plan.targets, ('pred', 'std') if setup.distribution else ('pred',)))
  # Written and checked on local disk, then moved into place: renamed
  # locally, uploaded (model.json last) to gs://.
  tmp = _temporary_dir(output_dir)
  try:
    probe = probe_frame(plan, setup.arch.layout,
                        jax.device_get(state.stats))
    tf_version, check = write_artifacts(tmp, forward, plan, probe,
                                        input_names, output_names)
    card = model_card.model_card(config, workdir, step, plan, input_names,
                      output_names, tf_version, scores, missing, check)
    with storage.open(storage.join(tmp, MODEL_CARD_FILE), 'w') as f:
      json.dump(writers.json_safe(card), f, indent=2)
      f.write('\n')
    files = storage.list_files(tmp)
    _move_into_place(tmp, output_dir)
  except Exception as e:
    error = storage.write_error(output_dir, e, 'the export')
    if error is None:
      raise
    raise error from e
  finally:
    if storage.isdir(tmp):
      storage.rmtree(tmp)
  logging.info('Exported step %d of %s to %s.', step, workdir, output_dir)
  return {'step': step, 'workdir': workdir, 'output': output_dir,
          'files': files, 'check': check}


def _restore_on_one_device(
    config: Config, workdir: str, step: int | None
) -> tuple[int, ColumnPlan, Config, Setup, state_lib.TrainState]:
  """(step, column plan, config, set-up, state) of a checkpoint, restored
  onto a one-device mesh whatever mesh trained it; the config is the
  checkpoint's own record of its model (`SavedModel.model_config`)."""
  with reading.SavedModel(workdir, step) as saved:
    config = saved.model_config(config)
    setup, state = saved.restore(
        config, mesh=sharding.make_mesh(1, 1, jax.local_devices()[:1]))
  return saved.step, saved.plan, config, setup, state


def check_output_dir(path: str) -> None:
  """Refuses an output that is a file or a directory with anything in it.

  Raises:
    UsageError: naming the path and what to do instead.
  """
  if storage.isfile(path):
    raise UsageError(f'--output {path!r} is a file; export writes a '
                     'directory: name a new or an empty one')
  if storage.exists(path) and not storage.isdir(path):
    raise UsageError(f'--output {path!r} is not a directory (a device, a '
                     'FIFO or a socket); export writes a directory: name a '
                     'new or an empty one')
  if storage.isdir(path) and storage.listdir(path):
    raise UsageError(f'--output {path!r} is a directory that is not empty; '
                     'export never replaces files: name a new or an empty '
                     'directory, or remove that one first')


def forward_fn(graphdef: nnx.GraphDef, layout: InputLayout,
               state: state_lib.TrainState, distribution: bool = False
               ) -> Callable[[jax.Array], jax.Array]:
  """`x_BxI -> pred_BxT` in original units, the state's arrays as constants;
  with `distribution`, `x_BxI -> out_Bx2T`, each target's prediction then
  its std (the order of `predict.prediction_columns`).

  x_BxI is the column plan's input matrix (numbers with NaN where missing,
  category codes, a date's parts). The arrays are copied to the host, so
  that tracing the function embeds them in the program as constants,
  whatever device they were on. An ensemble is exported whole: its members
  and their weights.
  """
  host = jax.device_get(state)

  def forward(x_BxI: jax.Array) -> jax.Array:
    pred_BxT, std_BxT = forward_lib.predict(graphdef, layout, host, x_BxI)
    if not distribution:
      return pred_BxT
    return jnp.stack([pred_BxT, std_BxT], axis=-1).reshape(
        pred_BxT.shape[0], -1)
  return forward


def export_forward(forward: Callable[[jax.Array], jax.Array],
                   num_features: int) -> jax.export.Exported:
  """`forward` lowered for a float32[b, F] input, b symbolic (any b >= 1)."""
  x_spec = jax.ShapeDtypeStruct(
      jax.export.symbolic_shape(f'b, {num_features}'), jnp.float32)
  return jax.export.export(jax.jit(forward), platforms=PLATFORMS)(x_spec)


def probe_frame(plan: ColumnPlan, layout: InputLayout,
                stats: FeatureStats) -> pd.DataFrame:
  """Four rows of every used column, as a user's table would hold them.

  Numbers at their training quartiles and missing; categories as values of
  the vocabulary, one never seen and missing; dates near their training
  quartiles and missing: rows where every column and every path of the
  encoding matters, in the range the model was trained on.
  """
  import pandas as pd  # noqa: PLC0415  (only export needs it)
  quartiles = stats.quantiles_NxQ[:, [len(stats.quantiles_NxQ[0]) // 4,
                                      len(stats.quantiles_NxQ[0]) * 3 // 4,
                                      len(stats.quantiles_NxQ[0]) // 2]]
  numbers = {layout.number_columns[n]: quartiles[n]
             for n in range(len(layout.number_columns))}
  if layout.scaling == 'none':  # no quantiles: around the fill value
    numbers = {c: stats.fill_N[n] + np.array([-1.0, 1.0, 0.0])
               for n, c in enumerate(layout.number_columns)}
  columns, i = {}, 0
  for column in plan.used:
    if column.kind in ('number', 'boolean'):
      columns[column.name] = [*map(float, numbers[i]), np.nan]
    elif column.kind == 'category':
      seen = list(column.vocabulary[:2]) or ['']
      columns[column.name] = [seen[0], seen[-1], '(never seen)', None]
    else:
      days = numbers[plan.input_names.index(f'{column.name}.days')]
      columns[column.name] = [
          (pd.Timestamp('1970-01-01') + pd.Timedelta(days=float(d))
           ).strftime('%Y-%m-%dT%H:%M:%S') for d in days] + [None]
    i += len(column.input_names)
  return pd.DataFrame(columns)


def signature_columns(plan: ColumnPlan, frame: pd.DataFrame,
                      input_names: Sequence[str]) -> dict[str, np.ndarray]:
  """The SavedModel's inputs for the rows of `frame`, by signature name."""
  out = {}
  for name, column in zip(input_names, plan.used):
    values = frame[column.name]
    if export_tf.input_dtype(column.kind) == 'string':
      out[name] = np.array(['' if v is None or v != v else str(v)
                            for v in values], object)
    else:
      out[name] = values.to_numpy(np.float32)
  return out


def write_artifacts(directory: str, forward: Callable[[jax.Array], jax.Array],
                    plan: ColumnPlan, probe: pd.DataFrame,
                    input_names: Sequence[str], output_names: Sequence[str]
                    ) -> tuple[str, dict[str, float]]:
  """Writes and checks the jax.export artifact and the SavedModel.

  Returns:
    (TensorFlow's version, `check_artifacts`' differences).
  """
  exported = export_forward(forward, len(plan.input_names))
  with storage.open(storage.join(directory, JAX_EXPORT_FILE), 'wb') as f:
    f.write(exported.serialize())
  tf_version = export_tf.write_saved_model(
      forward, storage.join(directory, SAVED_MODEL_DIR), plan, input_names,
      output_names, PLATFORMS)
  return tf_version, check_artifacts(directory, forward, plan, probe,
                                     input_names, output_names)


def check_artifacts(directory: str, forward: Callable[[jax.Array], jax.Array],
                    plan: ColumnPlan, probe: pd.DataFrame,
                    input_names: Sequence[str],
                    output_names: Sequence[str]) -> dict[str, float]:
  """Loads both artifacts back and compares them with `forward`.

  Catches, at export rather than in serving, an artifact that its own
  runtime cannot load (say, a TensorFlow too old for this StableHLO), a
  signature whose names TensorFlow changed, or TensorFlow's encoding of the
  columns differing from the column plan's.

  Returns:
    {artifact: max |artifact - forward| / max |forward|} on the probe rows.

  Raises:
    RuntimeError: an artifact is off by more than CHECK_TOLERANCE, or its
      signature's names are not `input_names` and `output_names`.
  """
  x_PxI, _ = plan.encode(probe, 'probe')
  expected_PxT = np.asarray(jax.jit(forward)(x_PxI))
  exported = jax.export.deserialize(bytearray(storage.read_bytes(
      storage.join(directory, JAX_EXPORT_FILE))))
  saved = storage.join(directory, SAVED_MODEL_DIR)
  inputs, outputs = export_tf.signature_of(saved)
  if inputs != set(input_names) or outputs != set(output_names):
    raise RuntimeError(
        f'the SavedModel signature takes {sorted(inputs)} and returns '
        f'{sorted(outputs)}, not {sorted(input_names)} and '
        f'{sorted(output_names)}')
  results = {
      JAX_EXPORT_FILE: np.asarray(exported.call(x_PxI)),
      SAVED_MODEL_DIR: export_tf.serve_saved_model(
          saved, signature_columns(plan, probe, input_names), output_names),
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


def _temporary_dir(output_dir: str) -> str:
  """A new directory beside `output_dir` (created with its parents), or a
  local temporary one for a gs:// output."""
  if storage.is_remote(output_dir):
    return tempfile.mkdtemp(prefix='meshfit-export-')
  output_dir = storage.resolve(output_dir)
  parent = storage.dirname(output_dir)
  # The name cut short: a name near the file system's limit must fit too.
  tmp = storage.join(
      parent,
      f'.{storage.basename(output_dir)[:200]}.{uuid.uuid4().hex[:8]}.tmp')
  try:
    storage.makedirs(tmp, exist_ok=False)
  except OSError as e:
    raise UsageError(f'cannot create a directory in {parent!r} for '
                     f'--output: {e.strerror}; name another place') from None
  return tmp


def _move_into_place(tmp: str, output_dir: str) -> None:
  """Renames `tmp` to `output_dir`, which must be missing or empty; to a
  gs:// `output_dir`, uploads it, model.json last: a reader that finds
  model.json finds the whole export."""
  if storage.is_remote(output_dir):
    check_output_dir(output_dir)
    storage.copytree(tmp, output_dir, last=MODEL_CARD_FILE)
    return
  try:
    # A local rename replaces an empty directory and refuses a non-empty
    # one, so a file written there since `check_output_dir` is never lost;
    # a symlink to an empty directory is followed, not replaced.
    storage.rename(tmp, storage.resolve(output_dir))
  except OSError:
    check_output_dir(output_dir)  # says why, when it is the user's doing
    raise
