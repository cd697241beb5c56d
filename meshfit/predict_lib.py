"""--mode=predict: a trained run's predictions for the rows of a user's table.

The model's column names come from the run itself: every checkpoint's meta
records the feature and target names it was trained with (the file's header
for csv_regression; x0, x1, ... and y for the synthetic datasets), so a
prediction needs neither the training file nor the TFDS copy of it.
"""

import os
from collections.abc import Sequence

import jax
import ml_collections

from input_pipeline import table_files
from meshfit import checkpointing, config_lib, train_lib
from meshfit.errors import UsageError


def column_names(meta: dict, step: int, directory: str
                 ) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(feature names, target names) recorded in a checkpoint's meta.

  Raises:
    UsageError: the checkpoint predates the recording of names.
  """
  if 'feature_names' not in meta or 'target_names' not in meta:
    raise UsageError(
        f'the checkpoint of step {step} in {directory} does not record the '
        'column names it was trained on (it was written by an older '
        'meshfit); resume training for a step to write a checkpoint that '
        'does, or pick another with --step')
  return tuple(meta['feature_names']), tuple(meta['target_names'])


def predict(config: ml_collections.ConfigDict, workdir: str, input_path: str,
            output_path: str, step: int | None = None,
            keep_columns: Sequence[str] = ()) -> dict[str, object]:
  """Writes a checkpoint's predictions for every row of `input_path`.

  Args:
    config: the run's saved config (evaluation keys may be overridden).
    workdir: the run's workdir.
    input_path: CSV or Parquet file holding (at least) the model's feature
      columns, found by name; other columns are ignored.
    output_path: CSV or Parquet file to write: the input's rows in order,
      the `keep_columns`, then one `<target>_pred` column per target in the
      targets' original units. Only process 0 writes it.
    step: the checkpoint to use; None takes the newest intact one.
    keep_columns: input columns copied unchanged into the output (ids, ...).

  Returns:
    {"step", "input", "output", "num_examples", "columns"}: what was written.

  Raises:
    UsageError: no such checkpoint, or a missing, unreadable or bad input
      file (a missing feature column is named), or an unwritable output.
  """
  config_lib.validate(config, jax.device_count())
  if os.path.abspath(input_path) == os.path.abspath(output_path):
    raise UsageError(f'--output {output_path!r} is the --input file; writing '
                     'predictions there would replace the input; name another '
                     'file')
  ckpt = checkpointing.Checkpointer(workdir, read_only=True)
  try:
    step = ckpt.step_to_restore(step)
    try:
      meta = ckpt.restore_meta(step)
    except checkpointing.DamagedCheckpointError as e:
      raise UsageError(f'the checkpoint of step {step} in {ckpt.directory} '
                       f'cannot be read ({str(e).splitlines()[0][:200]}); '
                       'pick another with --step') from None
    feature_names, target_names = column_names(meta, step, ckpt.directory)
    # The file is checked before the (slower) restore of the arrays.
    frame = table_files.read_frame(input_path, '--input')
    x_NxF = table_files.numeric_matrix(
        frame, feature_names, input_path, '--input',
        role='a feature the model was trained on')
    keep = (table_files.pass_through(frame, keep_columns, input_path,
                                     '--input') if keep_columns else None)
    setup = train_lib.make_setup(config, len(feature_names),
                                 len(target_names))
    state = train_lib.restore(ckpt, setup, step)
  finally:
    ckpt.close()
  pred_NxT = train_lib.predict_table(setup, state, x_NxF,
                                     config.eval_batch_size)
  if jax.process_index() == 0:
    table_files.write_predictions(output_path, pred_NxT, target_names, keep)
  return {'step': step, 'input': input_path, 'output': output_path,
          'num_examples': int(pred_NxT.shape[0]),
          'columns': [*keep_columns,
                      *table_files.prediction_columns(target_names)]}
