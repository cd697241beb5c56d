"""`Model`: a trained run in a workdir, as a notebook uses it.

Each method does what a train.py mode does with the same workdir
(--mode=predict, eval, export), through the same functions, so the numbers
are the command line's; the restored state is kept for the next call.
"""

from __future__ import annotations

import html
import math
import tempfile
from typing import TYPE_CHECKING, Any

import jax
import ml_collections
import numpy as np

from meshfit import storage
from meshfit.input_pipeline.column_plan import ColumnPlan
from meshfit import config as config_lib
from meshfit.api import console, runs, settings
from meshfit.checkpoints import reading
from meshfit.checkpoints.held import HeldCheckpoints
from meshfit.config import json_files
from meshfit.data import splits as splits_lib
from meshfit.errors import UsageError
from meshfit.model.setup import Setup
from meshfit.model.state import TrainState
from meshfit.report import writers
from meshfit.serve import evaluate as evaluate_lib
from meshfit.serve import export as export_lib
from meshfit.serve import predict as predict_lib

if TYPE_CHECKING:
  import pandas as pd
  from matplotlib.figure import Figure

# The name data given to a Model's methods has in messages.
SOURCE = 'data'


class Model:
  """A trained run: predict, evaluate, export, and what it recorded.

  Attributes:
    workdir: the run's directory (a temporary one for a `fit` without a
      workdir, until `save`).
    step: the checkpoint used: the best by validation, else the newest
      intact one, unless `load` named one.
  """

  def __init__(self, workdir: str, step: int | None = None, *,
               owned: tempfile.TemporaryDirectory | None = None,
               held: HeldCheckpoints | None = None, verbose: int = 1):
    """Opens the run in `workdir` (use `meshfit.load` or `meshfit.fit`).

    Args:
      workdir: the run's directory.
      step: the checkpoint; None as `meshfit.load`.
      owned: the temporary directory `workdir` is, removed with the model.
      held: the run's checkpoints, held in memory until something reads
        the workdir (`_written`).
      verbose: what the methods show (as `fit`'s verbose).

    Raises:
      UsageError: no run in `workdir`, or no such checkpoint.
    """
    self.workdir, self._owned, self._verbose = workdir, owned, verbose
    self._held = held
    self._saved_config = json_files.load_json(
        storage.join(workdir, 'config.json'))
    with console.shown(0), reading.SavedModel(workdir, step, held) as saved:
      self.step, self._plan = saved.step, saved.plan
      # The checkpoint's own record of its model decides, not config.json.
      self._run_config = saved.model_config(
          config_lib.parse(runs.run_config(workdir)))
    self._restored: tuple[Setup, TrainState] | None = None

  # What the run is.

  @property
  def config(self) -> ml_collections.ConfigDict:
    """The resolved config the run was trained with (config.json)."""
    return ml_collections.ConfigDict(self._saved_config.to_dict())

  @property
  def targets(self) -> tuple[str, ...]:
    """The predicted columns."""
    return self._plan.targets

  @property
  def plan(self) -> ColumnPlan:
    """The column plan the model was trained with."""
    return self._plan

  @property
  def history(self) -> pd.DataFrame:
    """The run's metrics.jsonl: a row per step that logged, a column per
    scalar (`train/loss`, `val/loss`, `eval/rmse`, ...)."""
    import pandas as pd  # noqa: PLC0415
    path = storage.join(self.workdir, 'metrics.jsonl')
    records = writers.read_jsonl(path) if storage.exists(path) else []
    if not records:
      return pd.DataFrame(columns=['step']).set_index('step')
    # A step's train and eval scalars are written as separate lines.
    return pd.DataFrame.from_records(records).groupby('step').first()

  @property
  def columns(self) -> pd.DataFrame:
    """The column plan: each feature column's kind, whether training saw
    it missing, the value a missing cell takes (a number's training median;
    a category's missing or unknown code), its levels (a category's values,
    a date's parts), and why a column is left out."""
    import pandas as pd  # noqa: PLC0415
    setup, state = self._restore()
    fill_N = np.asarray(jax.device_get(state.stats.fill_N))
    number_of = {i: k for k, i in enumerate(setup.arch.layout.number_columns)}
    rows, first = [], 0
    for column in self._plan.features:
      width = len(column.input_names)
      fills = [float(fill_N[number_of[i]]) for i in range(first, first + width)
               if i in number_of]
      first += width
      if column.kind == 'category':
        fill, levels = ('missing' if column.has_missing else 'unknown',
                        column.vocabulary)
      elif column.kind == 'datetime':
        fill, levels = tuple(fills), column.parts
      else:
        fill, levels = (fills[0] if fills else None), ()
      rows.append({'column': column.name, 'kind': column.kind,
                   'has_missing': column.has_missing, 'fill': fill,
                   'levels': levels, 'reason': column.reason})
    return pd.DataFrame(rows).set_index('column')

  # What it does.

  def predict(self, data: settings.Data,
              interval: float | None = None) -> pd.DataFrame:
    """Predictions for every row of `data`, as --mode=predict writes them.

    Args:
      data: a DataFrame or CSV/Parquet file(s) with (at least) the model's
        feature columns, found by name.
      interval: for a model trained with model.likelihood=gaussian, also
        the central interval of this probability (e.g. 0.9).

    Returns:
      The input's rows in order: `<target>_pred` per target; a gaussian
      model adds `<target>_std`, and `interval` `<target>_lower` and
      `<target>_upper`. Targets' original units, float32.

    Raises:
      DataError: a missing feature column or bad cells.
      UsageError: an interval asked of a model without a distribution.
    """
    if interval is not None and not (isinstance(interval, (int, float))
                                     and 0 < interval < 1):
      raise UsageError(f'interval={interval!r} is not a probability strictly '
                       'between 0 and 1; use e.g. interval=0.9')
    predict_lib.check_interval(self._run_config, interval)
    with console.shown(min(self._verbose, 1)):
      frame = settings.frame_of(data, SOURCE)
      x_NxF = predict_lib.encode(self._plan, frame, _name(data), SOURCE)
      outputs = self._outputs(x_NxF, interval)
    return predict_lib.predictions_frame(outputs, self._plan.targets)

  def _outputs(self, x_NxF: np.ndarray, interval: float | None = None
               ) -> dict[str, np.ndarray]:
    setup, state = self._restore()
    return predict_lib.predict_rows(setup, state, x_NxF,
                                    self._run_config.eval_batch_size, interval)

  def _predictions_of(self, x_NxF: np.ndarray) -> np.ndarray:
    return self._outputs(x_NxF)['pred']

  def _predictions(self, frame: pd.DataFrame, name: str) -> np.ndarray:
    with console.shown(min(self._verbose, 1)):
      return self._predictions_of(
          predict_lib.encode(self._plan, frame, name, SOURCE))

  def evaluate(self, data: settings.Data | None = None) -> dict[str, Any]:
    """Scores the model on `data`, as --mode=eval does, and keeps the
    result in the workdir's eval/ as it does.

    Args:
      data: a table with the targets; None: the run's own eval file, or,
        without one, the out-of-fold estimate the run recorded.

    Returns:
      What eval/step_<N>.json holds: step, split, num_examples, mse, rmse,
      mae, r2, per-target values (and nll and coverage for gaussian models).
    """
    given, keys = None, ()
    if data is not None:
      given = self.config
      given.dataset.eval_path = settings.path_of(
          data, given.dataset.data_dir, 'dataset.eval_path')
      keys = ('dataset.eval_path',)
    config = runs.run_config(self.workdir, given, keys)
    with console.shown(min(self._verbose, 1)):
      self._written()
      return evaluate_lib.evaluate(config, self.workdir, self.step)

  def export(self, path: str) -> dict[str, Any]:
    """Writes the serving artifacts (a TensorFlow SavedModel, a jax.export
    artifact and model.json) into `path`, a new or empty directory, as
    --mode=export does; returns what it wrote."""
    with console.shown(min(self._verbose, 1)):
      self._written()
      return export_lib.export(self._run_config, self.workdir, str(path),
                               self.step)

  def save(self, path: str) -> 'Model':
    """Copies the run to `path` (a new or empty directory, local or
    gs://), where train.py and `meshfit.load` find it; the model uses that
    copy from now on (a temporary workdir is removed).

    Raises:
      UsageError: `path` holds files already.
    """
    path = str(path)
    try:
      storage.check_scheme(path)
      taken = storage.exists(path) and (not storage.isdir(path)
                                        or storage.listdir(path))
    except storage.StorageError as e:
      raise UsageError(f'save: {e}') from None
    if taken:
      raise UsageError(f'save: {path} is not a new or empty directory; name '
                       'another, or remove what is there')
    self._written()
    storage.copytree(self.workdir, path)
    self.workdir = path
    if self._owned is not None:
      self._owned.cleanup()
      self._owned = None
    return self

  def plot(self, data: settings.Data | None = None) -> Figure:
    """The loss curves, and predicted against actual values.

    Args:
      data: the table whose predictions are drawn (with its targets);
        None: the run's eval file, else its training file.

    Returns:
      A matplotlib Figure (a notebook shows it).
    """
    from matplotlib.figure import Figure  # noqa: PLC0415
    _show_figures_inline()
    dataset = self._run_config.dataset
    if data is not None:
      which = _name(data)
      frame = settings.frame_of(data, SOURCE)
      y_NxT = self._plan.targets_of(frame, which, SOURCE)
      pred_NxT = self._predictions(frame, which)
    elif splits_lib.has_eval_split(dataset):
      which = 'eval split'
      with console.shown(min(self._verbose, 1)):
        table = splits_lib.load_eval_split(dataset, self._plan)
      y_NxT = table.y_NxT
      pred_NxT = self._predictions_of(table.x_NxF)
    else:
      which = 'training file (the rows the members trained on)'
      frame = settings.frame_of(dataset.train_path, 'dataset.train_path')
      y_NxT = self._plan.targets_of(frame, dataset.train_path,
                                    'dataset.train_path')
      pred_NxT = self._predictions(frame, dataset.train_path)
    history = self.history
    targets = self.targets
    fig = Figure(figsize=(5 * (1 + len(targets)), 4), layout='constrained')
    axes = fig.subplots(1, 1 + len(targets), squeeze=False)[0]
    losses = axes[0]
    for name in ('train/loss', 'val/loss'):
      if name in history:
        curve = history[name].dropna()
        losses.plot(curve.index, curve.to_numpy(), label=name)
    losses.axvline(self.step, color='tab:red', linestyle=':', linewidth=1,
                   label=f'step used ({self.step})')
    losses.set_xlabel('step')
    losses.set_ylabel('MSE, standardised units')
    losses.set_title('loss')
    losses.grid(True, alpha=0.3)
    losses.legend(loc='upper right')
    for t, (name, ax) in enumerate(zip(targets, axes[1:])):
      keep = ~np.isnan(y_NxT[:, t])
      y, pred = y_NxT[keep, t], pred_NxT[keep, t]
      rmse = float(np.sqrt(np.mean((pred - y) ** 2))) if len(y) else math.nan
      ax.scatter(y, pred, s=8, alpha=float(np.clip(300 / max(len(y), 1),
                                                   0.15, 0.8)), linewidths=0)
      if len(y):
        low, high = float(min(y.min(), pred.min())), float(max(y.max(),
                                                               pred.max()))
        ax.plot([low, high], [low, high], color='black', linewidth=1)
      ax.set_xlabel(f'actual {name}')
      ax.set_ylabel(f'predicted {name}')
      ax.set_title(f'{name} on the {which}: RMSE {rmse:.4g}')
      ax.grid(True, alpha=0.3)
    return fig

  # How it shows.

  def summary(self) -> dict[str, Any]:
    """The run in a few numbers: workdir, step, targets, columns, the
    score the run recorded last."""
    history = self.history
    score = {}
    for name in ('eval/rmse', 'eval/r2', 'val/rmse', 'val/r2'):
      if name in history and history[name].notna().any():
        score[name] = float(history[name].dropna().iloc[-1])
    config = self._saved_config
    return {'workdir': self.workdir, 'step': self.step,
            'targets': self.targets,
            'features': len(self._plan.used),
            'hidden_sizes': tuple(config.model.hidden_sizes),
            'members': config.model.ensemble_size, **score}

  def __repr__(self) -> str:
    items = ', '.join(f'{k}={v!r}' if isinstance(v, (str, tuple)) else
                      f'{k}={v:.5g}' if isinstance(v, float) else f'{k}={v}'
                      for k, v in self.summary().items())
    return f'meshfit.Model({items})'

  def _repr_html_(self) -> str:
    rows = ''.join(
        f'<tr><th style="text-align:left">{html.escape(k)}</th>'
        f'<td style="text-align:left">'
        f'{html.escape(f"{v:.5g}" if isinstance(v, float) else str(v))}'
        '</td></tr>' for k, v in self.summary().items())
    return f'<b>meshfit.Model</b><table>{rows}</table>'

  def _restore(self) -> tuple[Setup, TrainState]:
    """The checkpoint's (set-up, state), restored once."""
    if self._restored is None:
      with console.shown(0), reading.SavedModel(
          self.workdir, self.step, self._held) as saved:
        self._restored = saved.restore(self._run_config)
    return self._restored

  def _written(self) -> None:
    """Puts checkpoints held in memory into the workdir, where the
    command line's modes (and a copy of the directory) read them."""
    if self._held is not None:
      with console.shown(0):
        self._held.write()
      self._held = None


def _name(data: object) -> str:
  """What `data` is called in messages."""
  return (f'{settings.FRAME_NAME}' if settings.is_frame(data)
          else str(data))


def _show_figures_inline() -> None:
  """Makes IPython show a returned Figure as a PNG (as matplotlib's inline
  backend does once pyplot is imported), when running under IPython."""
  import sys  # noqa: PLC0415
  if 'IPython' not in sys.modules:
    return
  from IPython import get_ipython  # noqa: PLC0415
  shell = get_ipython()
  if shell is None:
    return
  from matplotlib.figure import Figure  # noqa: PLC0415
  formatter = shell.display_formatter.formatters['image/png']
  try:
    formatter.lookup_by_type(Figure)  # matplotlib's inline backend's
  except KeyError:
    formatter.for_type(Figure, _png)


def _png(fig: Figure) -> bytes:
  import io  # noqa: PLC0415
  buffer = io.BytesIO()
  fig.savefig(buffer, format='png', dpi=100, bbox_inches='tight')
  return buffer.getvalue()
