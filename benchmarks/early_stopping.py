"""What early stopping would cost and save, read from runs that stopped later.

    python benchmarks/early_stopping.py --runs=DIR [--patiences=5,10,20]
    python benchmarks/early_stopping.py --runs=DIR --lengths

Early stopping changes nothing before it stops: a run stopped after
`patience` evaluations without a better validation loss keeps the best step
it had seen, which a run of a longer patience (or none) logged too. So from
the metrics.jsonl of such runs every shorter patience can be read off: the
step it would stop at, the best step it would keep and its validation loss,
and that step's eval RMSE where the runs scored the eval split at every
evaluation (benchmarks/tables.py --workdir=DIR with `eval_during_training`
on). The eval RMSE is read only to report the cost; the patience is chosen
on the validation loss and the steps saved.

`--lengths` reads any runs (stopped early or not) for where each found its
best step: the step cap sizing gave it, the step it stopped at, its best
step and that as a fraction of the cap (a best step near the cap says the
run might have gone on improving; one far below it, that it overfits).

DIR is tables.py's scratch folder: DIR/runs/<table>/<split>/workdir/.
"""

import json

import numpy as np
from absl import app, flags

import storage
from bench_common import markdown_table
from meshfit.report import writers

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
  for record in writers.read_jsonl(path):
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
    cap = json.loads(storage.read_text(storage.join(
        storage.dirname(path), 'config.json')))['num_train_steps']
    best = steps[int(np.argmin(losses))]
    rows.append([_name(path), cap, steps[-1], best,
                 f'{best / cap:.2f}'])
  print(markdown_table(['run', 'step cap', 'stopped at', 'best step',
                        'best / cap'], rows))


def _runs() -> list[str]:
  """Every run's metrics.jsonl under --runs."""
  return sorted(storage.glob(storage.join(FLAGS.runs, 'runs', '*', '*',
                                          'workdir', 'metrics.jsonl')))


def _name(path: str) -> str:
  """A run's table/split, from its metrics.jsonl path."""
  return '/'.join(path.split('/')[-4:-2])


def main(argv: list[str]) -> None:
  del argv
  if FLAGS.lengths:
    lengths(_runs())
    return
  runs = _runs()
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
    name = _name(path)
    for p in patiences:
      stop, best = stopped(losses, p)
      # A run that scored the eval file once (the default) has no eval
      # RMSE of the other steps: its validation loss is still read.
      known = steps[best] in rmse and steps[full_best] in rmse
      if known:
        ratios[p].append(rmse[steps[best]] / rmse[steps[full_best]])
      val_ratios[p].append(losses[best] / losses[full_best])
      steps_kept[p].append(steps[stop] / steps[-1])
      if best != full_best:
        changed[p].append(
            f'{name} ({steps[best]} for {steps[full_best]}: val '
            f'{val_ratios[p][-1]:.3f}x'
            + (f', eval {ratios[p][-1]:.3f}x)' if known else ')'))
  rows = [[p, f'{np.exp(np.mean(np.log(val_ratios[p]))):.4f}',
           f'{max(val_ratios[p]):.3f}',
           *([f'{np.exp(np.mean(np.log(ratios[p]))):.4f}',
              f'{max(ratios[p]):.3f}', f'{min(ratios[p]):.3f}']
             if ratios[p] else ['', '', '']),
           f'{np.mean(steps_kept[p]):.2f}', len(changed[p])]
          for p in patiences]
  print(f'{len(val_ratios[patiences[0]])} runs read from {FLAGS.runs} '
        f'({len(ratios[patiences[0]])} with the eval RMSE of every '
        'evaluation)')
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
