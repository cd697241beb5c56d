"""The tables benchmark's scores: RMSE, paired intervals and their counts,
error_rows.py's scores with and without rows, and log_target.py's holdout
files and scores.

Apart from benchmarks/tables.py, which defines absl flags, so that tests
(and other scripts) can import them beside another benchmark's flags.
"""

import math
import os

import numpy as np
import pandas as pd

import storage
from bench_common import markdown_table
from meshfit.report import writers

MODELS = ('ridge', 'sklearn_mlp', 'histgbr', 'catboost', 'lightgbm')
MODEL_NAMES = {'ridge': 'ridge', 'sklearn_mlp': 'sklearn MLP',
               'histgbr': 'HistGBR', 'catboost': 'CatBoost',
               'lightgbm': 'LightGBM'}
# The paired bootstrap of `paired_interval`: resamples and coverage.
BOOTSTRAP_ROUNDS, BOOTSTRAP_LEVEL = 4000, 0.95
# log_target.py's holdout: this fraction of a training file, by a
# permutation seeded HOLDOUT_SEED_BASE + the split.
HOLDOUT_FRACTION = 0.2
HOLDOUT_SEED_BASE = 100


def rmse(prediction_N: np.ndarray, target_N: np.ndarray) -> float:
  return float(np.sqrt(np.mean((prediction_N - target_N)**2)))


def four_digits(value: float) -> str:
  """Four significant digits, no exponent: 37207, 548.7, 4.280."""
  if value == 0 or not math.isfinite(value):
    return f'{value:g}'
  return f'{value:.{max(0, 3 - math.floor(math.log10(abs(value))))}f}'


def paired_interval(mine_N: np.ndarray, theirs_N: np.ndarray,
                    target_N: np.ndarray, seed: int = 0) -> dict[str, float]:
  """RMSE(mine) - RMSE(theirs) on the test rows, with a paired bootstrap
  interval: both models scored on the same resampled rows, so what the
  rows share (a hard row is hard for both) cancels.

  Returns:
    {"diff", "low", "high"}: the difference and its BOOTSTRAP_LEVEL
    percentile interval over BOOTSTRAP_ROUNDS resamples.
  """
  mine2_N = (mine_N - target_N)**2
  theirs2_N = (theirs_N - target_N)**2
  n = len(target_N)
  rows_RxN = np.random.default_rng(seed).integers(0, n,
                                                   (BOOTSTRAP_ROUNDS, n))
  diffs_R = (np.sqrt(mine2_N[rows_RxN].mean(axis=1))
             - np.sqrt(theirs2_N[rows_RxN].mean(axis=1)))
  tail = (1 - BOOTSTRAP_LEVEL) / 2 * 100
  low, high = np.percentile(diffs_R, [tail, 100 - tail])
  return {'diff': float(np.sqrt(mine2_N.mean()) - np.sqrt(theirs2_N.mean())),
          'low': float(low), 'high': float(high)}


def verdict(interval: dict[str, float]) -> str:
  """'better', 'worse' (the interval excludes 0) or 'tied'."""
  if interval['high'] < 0:
    return 'better'
  return 'worse' if interval['low'] > 0 else 'tied'


def interval_report(results: dict[str, dict]) -> str:
  """Per table and reference, the splits where meshfit is better / cannot
  be told apart / is worse at BOOTSTRAP_LEVEL; '' if no split has
  intervals (references from refs.json)."""
  header = ['table', *(f'vs {n}' for n in MODEL_NAMES.values())]
  rows, totals = [], {m: [0, 0, 0] for m in MODELS}
  for name, result in results.items():
    counts = {m: [0, 0, 0] for m in MODELS}
    for split in result['splits'].values():
      for m in MODELS:
        if 'meshfit_minus' in split.get(m, {}):
          i = ('better', 'tied', 'worse').index(
              verdict(split[m]['meshfit_minus']))
          counts[m][i] += 1
          totals[m][i] += 1
    if any(sum(c) for c in counts.values()):
      rows.append([name, *(' / '.join(map(str, counts[m])) for m in MODELS)])
  if not rows:
    return ''
  rows.append(['splits in all', *(' / '.join(map(str, totals[m]))
                                  for m in MODELS)])
  return markdown_table(header, rows)


def score_table(splits: dict[str, tuple[dict[str, np.ndarray], np.ndarray,
                                         np.ndarray]],
                reference: str, excluding: bool) -> str:
  """Every model's test RMSE per split, over all the scored rows and (with
  `excluding`) over the kept ones, and the geometric mean over the splits
  over `reference`'s.

  Args:
    splits: {split: ({model: predictions}, targets, kept rows as bools)}.
    reference: the model the ratios are over.
    excluding: whether to add the kept rows' columns.
  """
  columns = ('all', 'kept') if excluding else ('all',)
  scores = {c: {} for c in columns}  # column -> model -> [per split]
  for predictions, y, kept in splits.values():
    for name, p in predictions.items():
      for c in columns:
        rows = kept if c == 'kept' else np.ones(len(y), bool)
        scores[c].setdefault(name, []).append(
            rmse(p[rows], y[rows]) if rows.any() else math.nan)
  mean = {c: {m: math.exp(np.mean(np.log(v))) for m, v in by.items()}
          for c, by in scores.items()}
  header, rows = ['model'], []
  for split in splits:
    header += [f'split {split}'] + ([f'split {split} kept'] if excluding
                                    else [])
  name = MODEL_NAMES.get(reference, reference)
  header += [f'x {name}'] + ([f'x {name}, kept'] if excluding else [])
  for m in scores['all']:
    row = [MODEL_NAMES.get(m, m)]
    for i in range(len(splits)):
      row += [four_digits(scores[c][m][i])
              for c in columns]
    row += [f'{mean[c][m] / mean[c][reference]:.3f}' for c in columns]
    rows.append(row)
  return markdown_table(header, rows)


def excess_rows(predictions: dict[str, np.ndarray], y: np.ndarray,
                reference: str, top: int) -> list[tuple[int, float]]:
  """The `top` rows with most of meshfit's squared error over
  `reference`'s: (row, its share of the split's total excess; NaN when
  meshfit has no excess in all)."""
  excess = (predictions['meshfit'] - y)**2 - (predictions[reference] - y)**2
  total = excess.sum()
  return [(int(i), excess[i] / total if total > 0 else math.nan)
          for i in np.argsort(-excess, kind='stable')[:top]]


def carve_holdout(train_path: str, target: str, split: str, folder: str
                  ) -> dict[str, str] | None:
  """Writes fit/holdout files, each also with a log target, into `folder`.

  Returns:
    {'fit', 'holdout', 'fit_log', 'holdout_log'} paths, or None when the
    target is not positive on every row that has one.
  """
  frame = pd.read_csv(train_path)
  frame = frame[frame[target].notna()].reset_index(drop=True)
  y = frame[target].astype(float)
  if not (y > 0).all():
    return None
  order = np.random.default_rng(
      HOLDOUT_SEED_BASE + int(split)).permutation(len(frame))
  num_fit = int((1 - HOLDOUT_FRACTION) * len(frame))
  parts = {'fit': frame.iloc[np.sort(order[:num_fit])],
           'holdout': frame.iloc[np.sort(order[num_fit:])]}
  os.makedirs(folder, exist_ok=True)
  paths = {}
  for name, part in parts.items():
    paths[name] = os.path.join(folder, f'{name}.csv')
    part.to_csv(paths[name], index=False)
    logged = part.assign(**{target: np.log(part[target].astype(float))})
    paths[f'{name}_log'] = os.path.join(folder, f'{name}_log.csv')
    logged.to_csv(paths[f'{name}_log'], index=False)
  return paths


def best_validation_mse(workdir: str) -> float:
  """The validation MSE (target units) at the step of least validation
  loss, from a run's metrics.jsonl."""
  return min((r['val/loss'], r['val/mse']) for r in writers.read_jsonl(
      storage.join(workdir, 'metrics.jsonl')) if 'val/loss' in r)[1]


def log_scores(truth: np.ndarray, raw: np.ndarray, logged: np.ndarray,
               log_mse: float) -> dict[str, float]:
  """Holdout RMSE of the raw run and of the log run read back as median
  and as mean."""
  return {'raw': rmse(raw, truth), 'log_median': rmse(np.exp(logged), truth),
          'log_mean': rmse(np.exp(logged + 0.5 * log_mse), truth)}
