"""What early stopping would cost and save, read from runs that did not stop.

    python benchmarks/early_stopping.py --runs=DIR [--patiences=5,10,20]
    python benchmarks/early_stopping.py --runs=DIR --lengths

Early stopping changes nothing before it stops: a run stopped after
`patience` evaluations without a better validation loss keeps the best step
it had seen, which the full run logged too. So from the metrics.jsonl of
full runs that scored the eval split at every evaluation (benchmarks/
tables.py --workdir=DIR with `eval_during_training` on), every patience can
be read off: the step it would stop at, the best step it would keep, and
that step's eval RMSE. The eval RMSE is read only to report the cost; the
patience is chosen on the validation loss and the steps saved.

`--lengths` reads any runs (stopped early or not) for where each found its
best step: the step cap sizing gave it, the step it stopped at, its best
step and that as a fraction of the cap (a best step near the cap says the
run might have gone on improving; one far below it, that it overfits).

DIR is tables.py's scratch folder: DIR/runs/<table>/<split>/workdir/.
"""

import glob
import json
import os

import numpy as np
from absl import app, flags

from bench_common import markdown_table

flags.DEFINE_string('runs', None, 'benchmarks/tables.py --workdir folder.',
                    required=True)
flags.DEFINE_list('patiences', ['3', '5', '8', '10', '15', '20', '30'],
                  'Patiences to read off, in evaluations.')
flags.DEFINE_bool('lengths', False, "Print each run's cap, stop and best "
                  'step instead of the patience table.')
FLAGS = flags.FLAGS


def read_run(path: str) -> tuple[list[int], list[float], dict[int, float]]:
  """(evaluated steps, their val/loss, {step: eval/rmse}) of one run."""
  steps, losses, rmse = [], [], {}
  with open(path, encoding='utf-8') as f:
    for line in f:
      record = json.loads(line)
      if 'val/loss' in record:
        steps.append(record['step'])
        losses.append(record['val/loss'])
      if 'eval/rmse' in record:
        rmse[record['step']] = record['eval/rmse']
  return steps, losses, rmse


def stopped(losses: list[float], patience: int) -> tuple[int, int]:
  """(index of the evaluation it stops after, index of the best kept), as
  meshfit/train/validation.py's BestTracker decides them."""
  best, since = 0, 0
  for i, loss in enumerate(losses):
    if loss < losses[best] or i == 0:
      best, since = i, 0
    else:
      since += 1
      if since >= patience:
        return i, best
  return len(losses) - 1, best


def lengths(paths: list[str]) -> None:
  """Each run's step cap, last evaluated step and best step."""
  rows = []
  for path in paths:
    steps, losses, _ = read_run(path)
    if not losses:
      continue
    with open(os.path.join(os.path.dirname(path), 'config.json'),
              encoding='utf-8') as f:
      cap = json.load(f)['num_train_steps']
    best = steps[int(np.argmin(losses))]
    rows.append(['/'.join(path.split(os.sep)[-4:-2]), cap, steps[-1], best,
                 f'{best / cap:.2f}'])
  print(markdown_table(['run', 'step cap', 'stopped at', 'best step',
                        'best / cap'], rows))


def main(argv: list[str]) -> None:
  del argv
  if FLAGS.lengths:
    lengths(sorted(glob.glob(os.path.join(FLAGS.runs, 'runs', '*', '*',
                                          'workdir', 'metrics.jsonl'))))
    return
  runs = sorted(glob.glob(os.path.join(FLAGS.runs, 'runs', '*', '*',
                                       'workdir', 'metrics.jsonl')))
  patiences = [int(p) for p in FLAGS.patiences]
  ratios = {p: [] for p in patiences}
  val_ratios = {p: [] for p in patiences}
  steps_kept = {p: [] for p in patiences}
  changed = {p: [] for p in patiences}
  for path in runs:
    steps, losses, rmse = read_run(path)
    if not losses:
      continue
    _, full_best = stopped(losses, len(losses) + 1)
    name = '/'.join(path.split(os.sep)[-4:-2])
    for p in patiences:
      stop, best = stopped(losses, p)
      ratios[p].append(rmse[steps[best]] / rmse[steps[full_best]])
      val_ratios[p].append(losses[best] / losses[full_best])
      steps_kept[p].append(steps[stop] / steps[-1])
      if best != full_best:
        changed[p].append(f'{name} ({steps[best]} for {steps[full_best]}: '
                          f'{ratios[p][-1]:.3f}x)')
  rows = [[p, f'{np.exp(np.mean(np.log(val_ratios[p]))):.4f}',
           f'{max(val_ratios[p]):.3f}',
           f'{np.exp(np.mean(np.log(ratios[p]))):.4f}',
           f'{max(ratios[p]):.3f}', f'{min(ratios[p]):.3f}',
           f'{np.mean(steps_kept[p]):.2f}', len(changed[p])]
          for p in patiences]
  print(f'{len(ratios[patiences[0]])} runs read from {FLAGS.runs}')
  print(markdown_table(
      ['patience (evaluations)', 'val loss, geometric mean x', 'worst x',
       'eval RMSE, geometric mean x',
       'worst x', 'best x', 'steps trained (fraction)',
       'runs whose best step changes'], rows))
  for p in patiences:
    if changed[p]:
      print(f'patience {p}: ' + '; '.join(changed[p]))


if __name__ == '__main__':
  app.run(main)
