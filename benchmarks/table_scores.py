"""The tables benchmark's scores: RMSE, paired intervals and their counts.

Apart from benchmarks/tables.py, which defines absl flags, so that tests
(and other scripts) can import them beside another benchmark's flags.
"""

import math

import numpy as np

from bench_common import markdown_table

MODELS = ('ridge', 'sklearn_mlp', 'histgbr', 'catboost', 'lightgbm', 'pls')
MODEL_NAMES = {'ridge': 'ridge', 'sklearn_mlp': 'sklearn MLP',
               'histgbr': 'HistGBR', 'catboost': 'CatBoost',
               'lightgbm': 'LightGBM', 'pls': 'PLS'}
# The paired bootstrap of `paired_interval`: resamples and coverage.
BOOTSTRAP_ROUNDS, BOOTSTRAP_LEVEL = 4000, 0.95


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
