"""Where meshfit's test error comes from, row by row, beside a reference.

    python benchmarks/error_rows.py --workdir=DIR --table=ames [--splits=0,1]
        [--reference=catboost] [--top=5] [--exclude='Gr_Liv_Area > 4000']
        [--show=Gr_Liv_Area,Sale_Condition]

DIR is a `benchmarks/tables.py --workdir` that ran the table: meshfit's
predictions of each split's test file are read from
DIR/runs/<table>/<split>/test_predictions.csv, and the split's files from
DIR/dev_tables/ (the dev suites) or --data_dir (the shared tables). The
references are fitted again on the same files, as tables.py fits them.

Prints, per split, every model's test RMSE over all the scored rows and,
with --exclude (a pandas query on the test file's columns), over the rows it
does not match, with the geometric mean over the splits against
--reference; then the test rows that hold most of meshfit's excess squared
error over the reference (meshfit's squared error minus the reference's)
and their share of the split's total excess. When a few rows hold all of a
gap, the gap is those rows, not the table. It diagnoses; it chooses nothing:
an --exclude filter should come from what is known of the data (its
documentation), never from these scores.
"""

import math
import os

import numpy as np
import pandas as pd
from absl import app, flags

import tables
from bench_common import markdown_table
from table_scores import MODEL_NAMES, excess_rows, four_digits, score_table

flags.DEFINE_string('table', None, 'The table to read.', required=True)
flags.DEFINE_string('reference', 'catboost', 'The reference to compare '
                    f'with: {", ".join(MODEL_NAMES)}.')
flags.DEFINE_integer('top', 5, 'Rows to list per split.')
flags.DEFINE_string('exclude', '', 'A pandas query on the test columns: '
                    'also score without the rows it matches.')
flags.DEFINE_list('show', [], 'Test columns to print beside each listed '
                  'row.')
# --workdir, --splits and --data_dir are tables.py's flags (imported with
# it): the same folder, splits and tables as the run being read.
FLAGS = flags.FLAGS


def split_files(table: str, split: str) -> tuple[str, str, str]:
  """(train path, test path, target) of one split."""
  dev = os.path.join(FLAGS.workdir, 'dev_tables', table, split)
  if os.path.isdir(dev):
    spec = {d.item: d for d in tables.DEV_TABLES + tables.LARGE_TABLES}
    return (os.path.join(dev, 'train.csv'), os.path.join(dev, 'test.csv'),
            spec[table].target)
  (found,) = tables.shared_tables(FLAGS.data_dir, [table], [split])
  return (*found.splits[split], found.target)


def read_split(split: str) -> tuple[dict[str, np.ndarray], np.ndarray,
                                    pd.DataFrame]:
  """({model: predictions of the scored test rows}, their targets, the
  scored test rows)."""
  train_path, test_path, target = split_files(FLAGS.table, split)
  train, test = tables.read_split(train_path, test_path, target)
  scored = pd.read_csv(test_path)[target].notna().to_numpy()
  mine = pd.read_csv(os.path.join(
      FLAGS.workdir, 'runs', FLAGS.table, split, 'test_predictions.csv'))
  predictions = {'meshfit': mine[f'{target}_pred'].to_numpy(float)[scored]}
  for name, fitted in tables.fit_references(train, test, target).items():
    predictions[name] = np.asarray(fitted['prediction'], float)
  return predictions, test[target].to_numpy(float), test


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  if not FLAGS.workdir:
    raise app.UsageError('--workdir: the benchmarks/tables.py --workdir to '
                         'read')
  if FLAGS.reference not in MODEL_NAMES:
    raise app.UsageError(
        f'--reference must be one of {", ".join(MODEL_NAMES)}')
  splits, listed = {}, []
  ref = MODEL_NAMES[FLAGS.reference]
  for split in FLAGS.splits:
    predictions, y, test = read_split(split)
    kept = (~test.eval(FLAGS.exclude).to_numpy(bool) if FLAGS.exclude
            else np.ones(len(y), bool))
    splits[split] = (predictions, y, kept)
    for i, share in excess_rows(predictions, y, FLAGS.reference,
                                FLAGS.top):
      listed.append([split, four_digits(y[i]),
                     four_digits(predictions['meshfit'][i]),
                     four_digits(predictions[FLAGS.reference][i]),
                     '-' if math.isnan(share) else f'{share:.0%}',
                     'no' if kept[i] else 'yes',
                     *(str(test[c].iloc[i]) for c in FLAGS.show)])
  print(f'{FLAGS.table}: test RMSE' + (
      f'; "kept": without the rows where {FLAGS.exclude}' if FLAGS.exclude
      else ''))
  print()
  print(score_table(splits, FLAGS.reference, bool(FLAGS.exclude)))
  print()
  print(f"The test rows with most of meshfit's excess squared error over "
        f"{ref} (share: of the split's total excess):")
  print()
  print(markdown_table(['split', 'target', 'meshfit', ref, 'share',
                        'excluded', *FLAGS.show], listed))


if __name__ == '__main__':
  app.run(main)
