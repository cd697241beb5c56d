"""--mode=predict: a trained run's predictions for the rows of a user's table.

The model's columns come from the run itself: every checkpoint's meta
records the column plan it was trained with (the file's columns and their
kinds for csv_regression; numbers x0, x1, ... and y for the synthetic
datasets), so a prediction needs neither the training file nor its prepared
copy. Every input row gets a prediction: missing values are filled as in
training, and a category too rare in training or never seen is unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import ml_collections
import numpy as np
from absl import logging

from meshfit import storage
from meshfit.input_pipeline import column_plan, table_files
from meshfit import config as config_lib
from meshfit.checkpoints import reading
from meshfit.config import Config
from meshfit.errors import UsageError
from meshfit.serve import outputs as outputs_lib
from meshfit.model import inference
from meshfit.model.setup import Setup
from meshfit.model.state import TrainState

if TYPE_CHECKING:
  import pandas as pd

# Appended to a target's name for its columns in a predictions table: the
# prediction, and for a model that predicts a distribution its std and the
# ends of a central interval.
PREDICTION_SUFFIX = '_pred'
SUFFIXES = {'pred': PREDICTION_SUFFIX, 'std': '_std', 'lower': '_lower',
            'upper': '_upper'}


def predict(config: ml_collections.ConfigDict | Config, workdir: str,
            input_path: str, output_path: str, step: int | None = None,
            keep_columns: Sequence[str] = (),
            interval: float | None = None) -> dict[str, object]:
  """Writes a checkpoint's predictions for every row of `input_path`.

  Args:
    config: the run's saved config (evaluation keys may be overridden).
    workdir: the run's workdir.
    input_path: CSV or Parquet file holding (at least) the model's feature
      columns, found by name; other columns are ignored.
    output_path: CSV or Parquet file to write: the input's rows in order,
      the `keep_columns`, then one `<target>_pred` column per target in the
      targets' original units; for a model trained with a gaussian
      likelihood, `<target>_std` too, and with `interval`
      `<target>_lower` and `<target>_upper`. Only process 0 writes it.
    step: the checkpoint to use; None takes the best by validation (when
      the run validated) or else the newest intact one.
    keep_columns: input columns copied unchanged into the output (ids, ...).
    interval: the probability of the central interval to write (gaussian
      models), e.g. 0.9.

  Returns:
    {"step", "input", "output", "num_examples", "columns"}: what was written.

  Raises:
    UsageError: no such checkpoint, an unwritable output, or an interval
      asked of a model that predicts no distribution.
    DataError: a missing, unreadable or bad input file (a missing feature
      column is named).
  """
  config = config_lib.parse(config)
  config_lib.check_devices(config, jax.device_count())
  if outputs_lib.same_file(input_path, output_path):
    raise UsageError(f'--output {output_path!r} is the --input file; writing '
                     'predictions there would replace the input; name another '
                     'file')
  outputs_lib.check_outside_run(output_path, workdir, '--output')
  outputs_lib.check_output_file(output_path)
  with reading.SavedModel(workdir, step) as saved:
    # The checkpoint's own record of its model decides, not config.json.
    config = saved.model_config(config)
    check_interval(config, interval)
    plan = saved.plan
    target_names = plan.targets
    # The file is checked before the (slower) restore of the arrays.
    frame = table_files.read_frame(input_path, '--input')
    x_NxF = encode(plan, frame, input_path, '--input')
    keep = (table_files.pass_through(frame, keep_columns, input_path,
                                     '--input') if keep_columns else None)
    setup, state = saved.restore(config)
  step = saved.step  # the next one, where rotation deleted the chosen one
  outputs = predict_rows(setup, state, x_NxF, config.eval_batch_size,
                         interval)
  if jax.process_index() == 0:
    write_predictions(output_path, outputs, target_names, keep)
  return {'step': step, 'input': input_path, 'output': output_path,
          'num_examples': int(outputs['pred'].shape[0]),
          'columns': [*keep_columns,
                      *prediction_columns(target_names, tuple(outputs))]}


def check_interval(config: Config, interval: float | None) -> None:
  """Raises UsageError if `interval` is asked of a model that predicts no
  distribution."""
  if interval is not None and config.model.likelihood != 'gaussian':
    raise UsageError(
        f'--interval: this model was trained with model.likelihood='
        f"'{config.model.likelihood}' and predicts no distribution; drop "
        "--interval, or train with --config.model.likelihood=gaussian")


def encode(plan: column_plan.ColumnPlan, frame: pd.DataFrame, path: str,
           source: str) -> np.ndarray:
  """The model's input matrix of `frame`'s rows, warning of category
  values training did not see.

  Raises:
    DataError: a feature column is missing or holds bad cells.
  """
  x_NxF, unseen = plan.encode(frame, path, source)
  if unseen:
    logging.warning('%s', column_plan.unseen_warning(unseen, path,
                                                     plan.min_count))
  return x_NxF


def predict_rows(setup: Setup, state: TrainState, x_NxF: np.ndarray,
                 batch_size: int, interval: float | None = None
                 ) -> dict[str, np.ndarray]:
  """{'pred'[, 'std'][, 'lower', 'upper']: N x T} in the targets' units:
  what a predictions table holds of `x_NxF`'s rows."""
  outputs = inference.predict_table(setup, state, x_NxF, batch_size,
                                    interval)
  if not setup.distribution:
    del outputs['std']  # the members' disagreement alone: not a std of y
  return outputs


def prediction_columns(target_names: Sequence[str],
                       outputs: Sequence[str] = ('pred',)) -> list[str]:
  """`<target>_pred` (then `_std`, `_lower`, `_upper` where asked) of each
  target in turn."""
  return [f'{t}{SUFFIXES[o]}' for t in target_names for o in outputs]


def predictions_frame(outputs: dict[str, np.ndarray],
                      target_names: Sequence[str]) -> pd.DataFrame:
  """The prediction columns of a predictions table (`prediction_columns`)
  of `predict_rows`' outputs."""
  import pandas as pd  # noqa: PLC0415  (see write_predictions)
  names = prediction_columns(target_names, tuple(outputs))
  return pd.DataFrame(dict(zip(names, (
      a[:, t] for t in range(len(target_names)) for a in outputs.values()))))


def write_predictions(path: str, outputs: dict[str, np.ndarray] | np.ndarray,
                      target_names: Sequence[str],
                      keep: pd.DataFrame | None = None) -> None:
  """Writes one row per input row: kept columns, then `<target>_pred` (and
  the other outputs').

  Written to a temporary file and renamed, so `path` never holds half a
  table. Floats are written at full precision: reading the file back gives
  the same float32 values. pandas is imported here, not with the module.

  Args:
    path: output file; Parquet for `.parquet` / `.pq`, else CSV.
    outputs: {'pred': N x T, ...} (`SUFFIXES`' keys) in the targets'
      original units, rows in input order; an array is {'pred': it}.
    target_names: the T target names.
    keep: pass-through columns (`table_files.pass_through`), N rows, or None.

  Raises:
    UsageError: a kept column has the name of a prediction column, or the
      output directory does not exist.
    ValueError: the shapes of `pred_NxT`, `target_names` and `keep` disagree.
  """
  import pandas as pd  # noqa: PLC0415  (see the docstring)
  if not isinstance(outputs, dict):
    outputs = {'pred': outputs}
  pred_NxT = outputs['pred']
  for name, a in outputs.items():
    if a.ndim != 2 or a.shape != (pred_NxT.shape[0], len(target_names)):
      raise ValueError(f'{name} has shape {a.shape} for '
                       f'{len(target_names)} targets')
  keep = pd.DataFrame() if keep is None else keep
  if len(keep.columns) and len(keep) != pred_NxT.shape[0]:
    raise ValueError(f'{len(keep)} kept rows for {pred_NxT.shape[0]} '
                     'predictions')
  names = prediction_columns(target_names, tuple(outputs))
  clash = sorted(set(names) & set(keep.columns))
  if clash:
    raise UsageError(f'cannot keep column(s) {", ".join(clash)}: the '
                     'predictions table writes its own column of that name; '
                     'keep other columns')
  outputs_lib.check_output_file(path)
  table = pd.concat([keep.reset_index(drop=True),
                     predictions_frame(outputs, target_names)], axis=1)
  with storage.atomic_write(path, 'wb') as f:
    if table_files.is_parquet(path):
      table.to_parquet(f, index=False, engine='pyarrow')
    else:
      table.to_csv(f, index=False)
