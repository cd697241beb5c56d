"""The pictures a run leaves in its workdir, drawn with matplotlib (Agg).

`loss_curve.png` (end of training): train/loss (and val/loss) and eval/rmse
(val/rmse for a run without an eval file) against step.
`eval/step_<N>_predictions.png` (--mode=eval): predicted against actual,
and residuals against predicted, one row of panels per target; for a model
that predicts a distribution,
`eval/step_<N>_calibration.png`: observed against nominal coverage of its
central intervals. Each shows what predicting the training mean would score: an RMSE
means something only beside it.

Figures are built with the object-oriented API (`Figure`, no pyplot), so no
global backend or figure state is touched and nothing needs a display.
matplotlib is imported when the first figure is drawn, not with this module:
it is slow to import, and every start of training would pay for it. A
training run imports it in the background while it trains (`preload`).
"""

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from meshfit import storage
from meshfit.report import writers

if TYPE_CHECKING:
  from matplotlib.figure import Figure

# Beyond this many points a scatter is a blot: draw a random subset instead.
MAX_POINTS = 4000
DPI = 110


def preload() -> None:
  """Imports matplotlib in a background thread, so that the loss curve at
  the end of training does not wait for the import (~0.4 s)."""
  threading.Thread(target=_import_figure, name='matplotlib-import',
                   daemon=True).start()


def _import_figure() -> None:
  # What drawing and saving a figure import (see preload).
  from matplotlib.backends import backend_agg  # noqa: PLC0415, F401
  from matplotlib.figure import Figure  # noqa: PLC0415, F401


def _new_figure(**kwargs) -> 'Figure':
  """A `matplotlib.figure.Figure(**kwargs)`."""
  from matplotlib.figure import Figure  # noqa: PLC0415  (see the module doc)
  return Figure(**kwargs)


def _save(fig: 'Figure', path: str) -> None:
  """Writes atomically: a reader never sees half a PNG."""
  with storage.atomic_write(path, 'wb') as f:
    fig.savefig(f, dpi=DPI, format='png')


def _log_scale_helps(values: np.ndarray) -> bool:
  """Positive values spread over more than a factor of 10."""
  values = values[np.isfinite(values)]
  return (values.size > 1 and values.min() > 0
          and values.max() > 10 * values.min())


def write_loss_curve(workdir: str, dataset: str,
                     target_names: Sequence[str],
                     mean_rmse: float | None = None,
                     best_step: int | None = None) -> str | None:
  """Draws workdir/loss_curve.png from workdir/metrics.jsonl.

  Args:
    workdir: the run's workdir.
    dataset: the dataset's name, for the title.
    target_names: the targets, for the eval axis label.
    mean_rmse: eval/rmse (without eval rows: val/rmse) of predicting the
      training mean, drawn as a line.
    best_step: the step eval and predict use (the best by validation),
      marked on both panels.

  Returns:
    The PNG's path, or None when metrics.jsonl holds no losses.
  """
  path = storage.join(workdir, 'metrics.jsonl')
  if not storage.exists(path):
    return None
  records = writers.read_jsonl(path)
  def curve(name):
    return np.array([(r['step'], r[name]) for r in records if name in r],
                    np.float64).reshape(-1, 2)
  train, evals, val = curve('train/loss'), curve('eval/rmse'), curve(
      'val/loss')
  # Without an eval file the validation rows estimate the error: drawn
  # where eval/rmse would be.
  scored = 'eval/rmse' if len(evals) else 'val/rmse'
  if not len(evals):
    evals = curve(scored)
  if not len(train) and not len(evals):
    return None
  fig = _new_figure(figsize=(10, 4), layout='constrained')
  left, right = fig.subplots(1, 2, sharex=True)
  rmse = (f'RMSE of {target_names[0]}' if len(target_names) == 1 else
          f'mean RMSE over {", ".join(target_names)}')
  panels = (
      (left, train, 'train/loss', 'MSE, standardised units', 'tab:blue'),
      (right, evals, scored, f'{rmse}, original units', 'tab:orange'))
  if len(val):  # the loss of the validation rows, in the same units
    left.plot(val[:, 0], val[:, 1], color='tab:green', label='val/loss',
              marker='o' if len(val) <= 50 else None, markersize=3)
  for ax, baseline in ((left, 1.0 if len(val) else None),
                       (right, mean_rmse)):
    if baseline is not None:
      ax.axhline(baseline, color='grey', linestyle='--', linewidth=1,
                 label=f'predicting the mean ({baseline:.4g})')
    if best_step is not None:
      ax.axvline(best_step, color='tab:red', linestyle=':', linewidth=1,
                 label=f'best step by validation ({best_step})')
  for ax, curve, name, unit, color in panels:
    ax.set_xlabel('step')
    ax.set_ylabel(f'{name} ({unit})')
    ax.grid(True, alpha=0.3)
    if not len(curve):
      ax.set_title(name)
      ax.text(0.5, 0.5, f'no {name} recorded', ha='center', va='center',
              transform=ax.transAxes)
      continue
    ax.set_title(f'{name}: {curve[-1, 1]:.4g} at step {curve[-1, 0]:.0f}')
    # Markers only while they can be told apart.
    ax.plot(curve[:, 0], curve[:, 1], color=color, label=name,
            marker='o' if len(curve) <= 50 else None, markersize=3)
    if _log_scale_helps(curve[:, 1]):
      ax.set_yscale('log')
    ax.legend(loc='upper right')
  left.set_xlim(left=0)
  last_step = max(c[-1, 0] for c in (train, evals) if len(c))
  fig.suptitle(f'{storage.basename(storage.absolute(workdir))}: {dataset}, '
               f'{last_step:.0f} steps')
  out = storage.join(workdir, 'loss_curve.png')
  _save(fig, out)
  return out


def write_predictions_figure(path: str, y_NxT: np.ndarray,
                             pred_NxT: np.ndarray,
                             target_names: Sequence[str], title: str,
                             train_mean_T: np.ndarray | None = None,
                             seed: int = 0) -> str:
  """Draws predicted against actual and residuals, one row per target.

  Args:
    path: the PNG to write.
    y_NxT: actual values (original units).
    pred_NxT: predictions (original units), rows matching `y_NxT`.
    target_names: the T targets, for labels.
    title: what was evaluated (run, step, split), shown on top.
    train_mean_T: the targets' training means: predicting them is the
      baseline drawn (default: the actual values' means).
    seed: picks the subset drawn when there are more than MAX_POINTS rows.

  Returns:
    `path`.
  """
  n, num_targets = y_NxT.shape
  shown = np.arange(n)
  if n > MAX_POINTS:
    shown = np.sort(np.random.default_rng(seed).choice(n, MAX_POINTS,
                                                       replace=False))
  # Dense clouds need transparency to show where most points lie.
  alpha = float(np.clip(300 / len(shown), 0.15, 0.8)) if n else 1.0
  fig = _new_figure(figsize=(10, 4.2 * num_targets), layout='constrained')
  axes = np.asarray(fig.subplots(num_targets, 2, squeeze=False))
  for t, name in enumerate(target_names):
    y, pred = y_NxT[:, t].astype(np.float64), pred_NxT[:, t].astype(np.float64)
    residual = pred - y
    rmse = float(np.sqrt(np.mean(residual**2))) if n else float('nan')
    mean = (float(train_mean_T[t]) if train_mean_T is not None else
            float(y.mean()) if n else 0.0)
    baseline = float(np.sqrt(np.mean((y - mean)**2))) if n else float('nan')
    left, right = axes[t]
    left.scatter(y[shown], pred[shown], s=8, alpha=alpha, linewidths=0)
    low = float(min(y.min(), pred.min())) if n else 0.0
    high = float(max(y.max(), pred.max())) if n else 1.0
    left.plot([low, high], [low, high], color='black', linewidth=1,
              label='identity (perfect prediction)')
    left.axhline(mean, color='grey', linestyle='--', linewidth=1,
                 label=f'predicting the mean (RMSE {baseline:.4g})')
    left.set_xlabel(f'actual {name}')
    left.set_ylabel(f'predicted {name}')
    left.set_title(f'{name}: predicted against actual (RMSE {rmse:.4g})')
    left.legend(loc='upper left')
    right.scatter(pred[shown], residual[shown], s=8, alpha=alpha,
                  linewidths=0)
    right.axhline(0.0, color='black', linewidth=1)
    for sign in (-1, 1):  # the spread of the mean's residuals
      right.axhline(sign * baseline, color='grey', linestyle='--',
                    linewidth=1, label='+-RMSE of predicting the mean'
                    if sign > 0 else None)
    right.legend(loc='upper right')
    right.set_xlabel(f'predicted {name}')
    right.set_ylabel(f'residual: predicted - actual {name}')
    right.set_title(f'{name}: residuals against predicted')
    for ax in (left, right):
      ax.grid(True, alpha=0.3)
  drawn = f', {len(shown):,} drawn at random' if len(shown) < n else ''
  fig.suptitle(f'{title} ({n:,} examples{drawn})')
  _save(fig, path)
  return path


def write_calibration_figure(path: str, levels: Sequence[float],
                             observed_LxT: np.ndarray,
                             target_names: Sequence[str], title: str) -> str:
  """Draws each target's observed coverage of the central intervals
  against their nominal probability: on the diagonal, the intervals mean
  what they say; below it, they are too narrow (over-confident).

  Args:
    path: the PNG to write.
    levels: the nominal probabilities of the intervals (L of them).
    observed_LxT: the fraction of values each interval held, per target.
    target_names: the T targets, for the legend.
    title: what was evaluated, shown on top.

  Returns:
    `path`.
  """
  fig = _new_figure(figsize=(5.5, 5.2), layout='constrained')
  ax = fig.subplots()
  ax.plot([0, 1], [0, 1], color='black', linewidth=1,
          label='calibrated (observed = nominal)')
  for t, name in enumerate(target_names):
    at_90 = observed_LxT[list(levels).index(0.9), t] if 0.9 in levels else None
    label = name + (f' (90% interval holds {at_90:.1%})'
                    if at_90 is not None else '')
    ax.plot(levels, observed_LxT[:, t], marker='o', markersize=3,
            label=label)
  ax.set_xlim(0, 1)
  ax.set_ylim(0, 1)
  ax.set_xlabel('nominal probability of the central interval')
  ax.set_ylabel('fraction of eval values inside it')
  ax.grid(True, alpha=0.3)
  ax.legend(loc='upper left')
  fig.suptitle(title)
  _save(fig, path)
  return path
