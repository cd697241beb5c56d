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
from table_scores import MODEL_NAMES

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


def rmse(error: np.ndarray) -> float:
  return float(np.sqrt(np.mean(error**2))) if len(error) else math.nan


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
        scores[c].setdefault(name, []).append(rmse(p[rows] - y[rows]))
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
      row += [tables.four_digits(scores[c][m][i])
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
      listed.append([split, tables.four_digits(y[i]),
                     tables.four_digits(predictions['meshfit'][i]),
                     tables.four_digits(predictions[FLAGS.reference][i]),
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
