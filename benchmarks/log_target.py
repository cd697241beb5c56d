"""A log target against the target as it is, on rows no test file holds.

    python benchmarks/log_target.py --suite=dev --tables=a,b --workdir=DIR
        [--splits=0,1] [--data_dir=../shared/datasets/tables]

Practitioners often fit a positive, right-skewed target (prices, salaries,
counts) on its logarithm. This measures whether meshfit should: for each
table and split of a `tables.py` suite, the split's training file is cut
into fit rows (80%) and holdout rows (20%, by a permutation seeded 100 +
the split), and meshfit runs twice exactly as a user runs it (configs/csv.py,
only the target named, the holdout as its eval file): once on the fit rows
as they are, once with the target replaced by its natural log.
`--mode=predict` then predicts the holdout rows. The log run's predictions
come back to the target's units two ways: exp(prediction), the median of a
lognormal, and exp(prediction + s^2 / 2), its mean, where s^2 is the best
step's out-of-fold validation MSE on the log scale.

Prints each run's holdout RMSE (in the target's units) and the ratios
log / raw, per run and as geometric means. The test files are never read.
A table whose target is not positive everywhere is skipped.
"""

import math
import os

import numpy as np
import pandas as pd
from absl import app, flags

import tables
from bench_common import markdown_table
from table_scores import best_validation_mse, carve_holdout, log_scores

# --suite, --tables, --splits, --data_dir, --workdir and --timeout are
# tables.py's flags (imported with it).
FLAGS = flags.FLAGS


def run_split(table: tables.Table, split: str, scratch: str) -> dict | None:
  folder = os.path.join(scratch, table.name, split)
  paths = carve_holdout(table.splits[split][0], table.target, split,
                        os.path.join(folder, 'files'))
  if paths is None:
    return None
  predictions, log_mse = {}, None
  for variant, suffix in (('raw', ''), ('log', '_log')):
    run_dir = os.path.join(folder, variant)
    os.makedirs(run_dir)
    output = os.path.join(run_dir, 'holdout_predictions.csv')
    result = tables.run_meshfit(
        tables.meshfit_command(paths['fit' + suffix],
                               paths['holdout' + suffix], table.target,
                               run_dir, []),
        run_dir, FLAGS.timeout, predict=(paths['holdout'], output))
    if result['rmse'] is None:
      raise RuntimeError(f'{table.name} split {split} ({variant}): '
                         f'{result["error"]}')
    predictions[variant] = pd.read_csv(output)[
        f'{table.target}_pred'].to_numpy(np.float64)
    if variant == 'log':
      log_mse = best_validation_mse(os.path.join(run_dir, 'workdir'))
  truth = pd.read_csv(paths['holdout'])[table.target].to_numpy(np.float64)
  return log_scores(truth, predictions['raw'], predictions['log'], log_mse)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  if not FLAGS.workdir or (os.path.exists(FLAGS.workdir)
                           and os.listdir(FLAGS.workdir)):
    raise app.UsageError('--workdir must name a new or empty folder')
  scratch = FLAGS.workdir
  if FLAGS.suite in ('dev', 'large'):
    suite = tables.DEV_TABLES if FLAGS.suite == 'dev' else tables.LARGE_TABLES
    found = tables.dev_tables(os.path.join(scratch, 'dev_tables'),
                              FLAGS.tables, FLAGS.splits, suite)
  else:
    found = tables.shared_tables(FLAGS.data_dir, FLAGS.tables, FLAGS.splits)
  print(f'{FLAGS.suite} suite, splits {",".join(FLAGS.splits)}, commit '
        f'{tables.commit()}', flush=True)
  rows, ratios = [], {'log_mean': [], 'log_median': []}
  for table in found:
    for split in FLAGS.splits:
      got = run_split(table, split, os.path.join(scratch, 'runs'))
      if got is None:
        print(f'{table.name} split {split}: target not positive, skipped')
        continue
      for key, values in ratios.items():
        values.append(got[key] / got['raw'])
      rows.append([table.name, split, tables.four_digits(got['raw']),
                   tables.four_digits(got['log_mean']),
                   tables.four_digits(got['log_median']),
                   f'{got["log_mean"] / got["raw"]:.4f}',
                   f'{got["log_median"] / got["raw"]:.4f}'])
      print(' '.join(rows[-1]), flush=True)
  if rows:
    rows.append([f'geometric mean ({len(rows)} runs)', '', '', '', '',
                 *(f'{math.exp(np.mean(np.log(ratios[key]))):.4f}'
                   for key in ('log_mean', 'log_median'))])
  print()
  print(markdown_table(['table', 'split', 'raw RMSE', 'log, mean',
                        'log, median', 'mean / raw', 'median / raw'], rows,
                       text_columns=2))


if __name__ == '__main__':
  app.run(main)
