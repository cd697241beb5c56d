"""model.json of --mode=export: what the artifacts take and return, and
where they come from (the checkpoint's step, its eval metrics, versions)."""

import dataclasses
import importlib.metadata
import json
from collections.abc import Sequence

import jax
from absl import logging

from meshfit import storage
from meshfit.input_pipeline import cells, column_plan, csv_regression
from meshfit.input_pipeline.column_plan import ColumnPlan
from meshfit.input_pipeline.errors import DataError
from meshfit.checkpoints import reading
from meshfit.config import Config
from meshfit.data import splits as splits_lib
from meshfit.errors import UsageError
from meshfit.model import state as state_lib
from meshfit.model.setup import Setup
from meshfit.serve import evaluate, export_tf, predict

# Names inside the export directory (export.py writes them).
JAX_EXPORT_FILE = 'model.jax_export'
SAVED_MODEL_DIR = 'saved_model'
# Bumped when model.json or the artifacts' calling convention changes.
FORMAT = 'meshfit.export/3'
# Lowered for every platform a server is likely to run on, not only the one
# exporting: a CPU-exported model then also serves on a GPU or a TPU (the
# artifact picks the platform it runs on).
PLATFORMS = ('cpu', 'cuda', 'tpu')


def eval_metrics(config: Config, workdir: str, step: int,
                 setup: Setup, state: state_lib.TrainState,
                 plan: ColumnPlan
                 ) -> tuple[dict[str, object] | None, str | None]:
  """The checkpoint's metrics on the eval split, for the model card.

  A model card without its model's quality invites serving an untested
  model, so they are always given when they can be had: from
  `eval/step_<N>.json` when --mode=eval wrote it (the numbers the user has
  seen), else computed here as --mode=eval would compute them (nothing is
  written to the workdir). An eval split that cannot be read here (its file
  moved, another machine) does not stop the export: the artifacts do not
  depend on it, and model.json says why the metrics are missing. A run
  without an eval file gives the estimate of its error that its checkpoint
  recorded on validation rows, marked as such ("split", "note").

  Returns:
    (metrics, None), or (None, the reason there are none).
  """
  path = storage.join(workdir, 'eval', f'step_{step}.json')
  try:
    written = json.loads(storage.read_text(path))
    if isinstance(written, dict):
      return {'source': f'eval/step_{step}.json', **written}, None
  except (OSError, ValueError, storage.StorageError):
    pass  # none, or unreadable: computed instead
  if not splits_lib.has_eval_split(config.dataset):
    with reading.SavedModel(workdir, step) as saved:
      if saved.estimate is not None:
        return {'source': f'the estimate the checkpoint of step {step} '
                'recorded (the run has no eval file)', **saved.estimate}, None
    reason = (f'the run has no eval file and the checkpoint of step {step} '
              'recorded no estimate of its error (only validated steps do)')
    logging.warning('Exporting without eval metrics: %s', reason)
    return None, reason
  try:
    table = splits_lib.load_eval_split(config.dataset, plan)
  except (DataError, UsageError, OSError) as e:
    reason = (f'the eval split {config.dataset.eval_split!r} could not be '
              f'read: {str(e).splitlines()[0][:300]}')
    logging.warning('Exporting without eval metrics: %s', reason)
    return None, reason
  return {'source': 'computed by --mode=export (not written to the workdir)',
          **evaluate.score(config, setup, state, table, step)}, None


def model_card(config: Config, workdir: str, step: int, plan: ColumnPlan,
               input_names: Sequence[str], output_names: Sequence[str],
               tf_version: str, scores: dict[str, object] | None,
               missing: str | None, check: dict[str, float]
               ) -> dict[str, object]:
  """The contents of model.json: the artifacts' interface and provenance."""
  units = ('original units of the training file'
           if config.dataset.name == csv_regression.NAME else
           f'original units of the dataset {config.dataset.name!r}')

  def feature(column: column_plan.Column, name: str) -> dict:
    entry = {'name': column.name, 'signature_input': name,
             'kind': column.kind,
             'dtype': export_tf.input_dtype(column.kind),
             'inputs': list(column.input_names)}
    if column.kind == 'category':
      entry['vocabulary'] = list(column.vocabulary)
    if column.kind in ('number', 'boolean'):
      entry['units'] = units
    return entry

  def target(name: str) -> dict:
    pred, std = (predict.prediction_columns([name], (o,))[0]
                 for o in ('pred', 'std'))
    return {'name': name, 'signature_output': pred,
            **({'signature_std_output': std} if std in output_names else {}),
            'kind': 'number', 'dtype': 'float32', 'units': units}
  return {
      'format': FORMAT,
      'features': [feature(c, n) for c, n in zip(plan.used, input_names)],
      'left_out': [{'name': c.name, 'reason': c.reason}
                   for c in plan.left_out],
      'targets': [target(name) for name in plan.targets],
      'jax_export': {
          'file': JAX_EXPORT_FILE,
          'input': (f'float32[b, {len(plan.input_names)}]: the columns of '
                    '"inputs", raw: numbers in their units (NaN where '
                    'missing), a category as its code (0 unknown, 1 '
                    'missing, 2 + its index in "vocabulary"), a date as its '
                    'parts (see "dates"); filling and scaling are inside'),
          'inputs': list(plan.input_names),
          'output': (f'float32[b, {len(output_names)}]: the columns of '
                     '"outputs"'),
          'outputs': list(output_names),
          'platforms': list(PLATFORMS)},
      'saved_model': {
          'directory': SAVED_MODEL_DIR, 'signature': export_tf.SIGNATURE,
          'inputs': ('one [b] tensor per feature, named by its '
                     '"signature_input": float32 numbers (NaN missing), '
                     'booleans as 1/0, categories as text (stripped of '
                     'whitespace; empty or one of "missing_tokens": '
                     'missing), dates as text (see "dates")'),
          'missing_tokens': list(cells.MISSING_TOKENS),
          'outputs': ('one float32 [b] tensor per name of '
                      '"jax_export.outputs": each target\'s prediction '
                      '("signature_output") and, for a gaussian model, its '
                      'std')},
      'dates': {
          'text': (f'{cells.DATE_FORMS}; a time without an offset is UTC. '
                   'A cell of another form, or naming no real date or time '
                   '(2021-13-45), is missing, as predict reads it'),
          'parts': ('of the UTC instant: days (since 1970-01-01, the time '
                    'of day as a fraction), year, month, day, weekday '
                    '(Monday 0), dayofyear (1 for January 1st), hour; all '
                    'NaN where missing')},
      'check': {'probe_rows': 4, 'max_relative_difference': check},
      'step': step,
      'workdir': storage.absolute(workdir),
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
