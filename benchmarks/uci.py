"""The UCI regression benchmark, run through meshfit's own training code.

    python benchmarks/uci.py [--data_dir=../shared/datasets/uci]
        [--datasets=boston,yacht] [--splits=N] [--output=results.json]

The protocol of ../shared/datasets/uci/README.md: the published splits, one
hidden layer of 50 ReLU units (100 for protein), features and target
standardised with the training split's statistics, test RMSE in the target's
original units, mean and standard error over the splits.

Every model is trained the way a user trains one: each split's rows are
written to CSV files and `loop.train_and_evaluate` runs on a config
derived from configs/csv.py (the csv_regression builder, the Normalizer, the
training loop and the evaluation all as in `train.py`), in this process, on
one device.

Hyperparameters are chosen per split, on that split's training rows only: the
last `--holdout` fraction of its training indices is held out for
validation. For each (learning rate, weight decay) of the grid one run of
`--max_steps` steps (AdamW, configs/csv.py's warmup and cosine decay) trains
on the rest and is evaluated on the held-out rows `--evals_per_run` times;
the setting and the number of epochs with the lowest validation RMSE win.
The model is then trained afresh on the whole training split for that many
epochs (its cosine schedule fitted to that length), and evaluated once on the
test split. The test split is never seen before that last evaluation.
"""

import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import time

# Before TensorFlow, TFDS and JAX are imported: one CPU device, quiet logs.
os.environ.setdefault('NO_GCE_CHECK', 'true')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
from meshfit import xla_flags  # noqa: E402  (imports no jax)

xla_flags.apply()  # as train.py does

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from absl import app, flags, logging  # noqa: E402

from configs import csv as csv_config  # noqa: E402
from meshfit import loop, writers  # noqa: E402
from meshfit.loss_watch import NonFiniteLossError  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASETS = ('boston', 'concrete', 'energy', 'kin8nm', 'naval', 'power',
            'protein', 'wine', 'yacht')

FLAGS = flags.FLAGS
flags.DEFINE_string('data_dir', os.path.join(REPO, '..', 'shared', 'datasets',
                                             'uci'),
                    'The UCI folder: one sub-folder per data set.')
flags.DEFINE_list('datasets', list(DATASETS), 'Data sets to run.')
flags.DEFINE_integer('splits', None, 'Run the first N splits of each data set '
                     '(default: all of them).')
flags.DEFINE_string('output', None, 'Write {name: {"rmse_mean", "rmse_se", '
                    '"n_splits"}} to this JSON file.')
flags.DEFINE_list('learning_rates', ['1e-2', '3e-2'],
                  'Peak learning rates of the grid.')
flags.DEFINE_list('weight_decays', ['0', '0.3'],
                  'Decoupled weight decays of the grid (AdamW; per unit of '
                  'learning rate, as optax applies it).')
flags.DEFINE_integer('max_steps', 4000, 'Optimizer steps of each validation '
                     'run; the chosen number of epochs is at most this many '
                     "steps' worth.")
flags.DEFINE_integer('evals_per_run', 20, 'Validation evaluations per run: '
                     'the candidate numbers of epochs.')
flags.DEFINE_float('holdout', 0.2, 'Fraction of each training split (its last '
                   'indices) held out to choose hyperparameters.')
flags.DEFINE_string('workdir', None, 'Scratch directory (default: a new '
                    'temporary one, deleted at the end).')

# Gal & Ghahramani 2016, Table 1, and the repository's 2018 single-network
# re-run and least squares, as quoted in the data's README.
PUBLISHED = {
    #           PBP ± se        MC dropout ± sd   re-run    OLS
    'boston': ((3.01, 0.18), (2.97, 0.85), 3.61, 4.59),
    'concrete': ((5.67, 0.09), (5.23, 0.53), 5.45, 10.31),
    'energy': ((1.80, 0.05), (1.66, 0.19), 0.97, 3.06),
    'kin8nm': ((0.10, 0.00), (0.10, 0.00), 0.0916, 0.202),
    'naval': ((0.01, 0.00), (0.01, 0.00), 0.00173, 0.0059),
    'power': ((4.12, 0.03), (4.02, 0.18), 4.18, 4.61),
    'protein': ((4.73, 0.01), (4.36, 0.04), 4.39, 5.21),
    'wine': ((0.64, 0.01), (0.62, 0.04), 0.657, 0.654),
    'yacht': ((1.02, 0.05), (1.11, 0.38), 1.23, 8.97),
}


@dataclasses.dataclass(frozen=True)
class UciData:
  """One data set in the layout of the Bayesian deep learning literature."""
  name: str
  x_NxF: np.ndarray
  y_N: np.ndarray
  n_hidden: int
  n_splits: int
  directory: str

  def split(self, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(training row numbers, test row numbers) of published split `i`."""
    read = lambda kind: np.loadtxt(  # noqa: E731
        os.path.join(self.directory, f'index_{kind}_{i}.txt'), dtype=np.int64,
        ndmin=1)
    return read('train'), read('test')


def load(data_dir: str, name: str) -> UciData:
  """Reads `data_dir/name` (data.txt, the index and n_* files)."""
  directory = os.path.join(data_dir, name)
  number = lambda f: int(np.loadtxt(os.path.join(directory, f)))  # noqa: E731
  data = np.loadtxt(os.path.join(directory, 'data.txt'), ndmin=2)
  features = np.loadtxt(os.path.join(directory, 'index_features.txt'),
                        dtype=np.int64, ndmin=1)
  return UciData(name, data[:, features],
                 data[:, number('index_target.txt')],
                 number('n_hidden.txt'), number('n_splits.txt'), directory)


def batch_size(num_rows: int) -> int:
  """About a tenth of the rows, a power of two in [32, 512].

  A step of these small networks costs the same for 32 rows as for 512 on a
  CPU, so the step budget buys as many epochs on a large table as on a
  small one.
  """
  return int(np.clip(2**round(math.log2(num_rows / 10)), 32, 512))


def base_config(data: UciData, scratch: str) -> ml_collections.ConfigDict:
  """configs/csv.py with the protocol's model; the caller sets the rest."""
  config = csv_config.get_config()
  config.dataset.data_dir = os.path.join(scratch, 'tfds')
  config.dataset.target_columns = ('y',)
  config.model.hidden_sizes = (data.n_hidden,)
  config.model.activation = 'relu'
  # The protocol's inputs: numbers standardised, fed as they are; the
  # benchmark holds out its own validation rows (not the config's).
  config.dataset.numeric_scaling = 'standardize'
  config.model.numeric_embedding = 'none'
  config.model.dropout_rate = 0.0
  config.dataset.validation_fraction = 0.0
  config.early_stopping_evals = 0
  config.optimizer.name = 'adamw'
  config.max_checkpoints_to_keep = 1
  config.plots = False  # hundreds of runs: pictures would cost minutes
  return config


def write_csv(path: str, x_NxF: np.ndarray, y_N: np.ndarray) -> str:
  frame = pd.DataFrame(x_NxF, columns=[f'x{j}' for j in range(x_NxF.shape[1])])
  frame['y'] = y_N
  frame.to_csv(path, index=False)
  return path


def train(config: ml_collections.ConfigDict, workdir: str, train_path: str,
          eval_path: str, num_steps: int,
          eval_every: int) -> list[tuple[int, float]]:
  """One meshfit run; returns (step, eval RMSE) of every evaluation."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.dataset.train_path, config.dataset.eval_path = train_path, eval_path
  config.num_train_steps = num_steps
  config.eval_every_steps = eval_every
  # Only what the benchmark reads: no intermediate checkpoints or logs.
  config.log_every_steps = config.checkpoint_every_steps = num_steps
  try:
    loop.train_and_evaluate(config, workdir)
  except NonFiniteLossError:
    # Too large a learning rate for this table: a setting the grid loses.
    return [(num_steps, math.inf)]
  records = writers.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  return [(r['step'], r['eval/rmse']) for r in records if 'eval/rmse' in r]


@dataclasses.dataclass(frozen=True)
class Search:
  """How hyperparameters are chosen on a training split.

  Attributes:
    learning_rates: peak learning rates of the grid.
    weight_decays: AdamW decoupled weight decays of the grid.
    max_steps: steps of each validation run.
    evals_per_run: validation evaluations per run: the candidate epochs.
    holdout: fraction of the training split (its last indices) held out.
  """
  learning_rates: tuple[float, ...]
  weight_decays: tuple[float, ...]
  max_steps: int
  evals_per_run: int
  holdout: float


@dataclasses.dataclass(frozen=True)
class SplitResult:
  test_rmse: float
  learning_rate: float
  weight_decay: float
  epochs: float
  validation_rmse: float


def run_split(data: UciData, i: int, search: Search,
              scratch: str) -> SplitResult:
  """Chooses hyperparameters on split `i`'s training rows, then tests once.

  Args:
    data: the data set.
    i: the published split.
    search: the grid and budget.
    scratch: an empty directory for this split's files and runs.

  Returns:
    The test RMSE of the model retrained with the chosen setting.
  """
  train_idx, test_idx = data.split(i)
  num_fit = int(round(len(train_idx) * (1 - search.holdout)))
  fit_idx, val_idx = train_idx[:num_fit], train_idx[num_fit:]
  csv = lambda name, idx: write_csv(  # noqa: E731
      os.path.join(scratch, f'{name}.csv'), data.x_NxF[idx], data.y_N[idx])
  fit_path, val_path = csv('fit', fit_idx), csv('validation', val_idx)

  config = base_config(data, scratch)
  config.seed = i
  config.batch_size = batch_size(len(train_idx))
  eval_every = max(search.max_steps // search.evals_per_run, 1)
  best = None
  for lr in search.learning_rates:
    for wd in search.weight_decays:
      config.optimizer.learning_rate, config.optimizer.weight_decay = lr, wd
      curve = train(config, os.path.join(scratch, f'lr{lr}_wd{wd}'),
                    fit_path, val_path, search.max_steps, eval_every)
      step, rmse = min(curve, key=lambda c: c[1])
      if best is None or rmse < best[3]:
        best = (lr, wd, step * config.batch_size / num_fit, rmse)

  lr, wd, epochs, val_rmse = best
  config.optimizer.learning_rate, config.optimizer.weight_decay = lr, wd
  steps = max(int(round(epochs * len(train_idx) / config.batch_size)), 1)
  curve = train(config, os.path.join(scratch, 'final'),
                csv('train', train_idx), csv('test', test_idx), steps, steps)
  return SplitResult(curve[-1][1], lr, wd, epochs, val_rmse)


def mean_and_se(values: list[float]) -> tuple[float, float]:
  """Mean and standard error (sample std / sqrt(n); 0 for one value)."""
  a = np.asarray(values, np.float64)
  se = a.std(ddof=1) / math.sqrt(len(a)) if len(a) > 1 else 0.0
  return float(a.mean()), float(se)


def _mean_se(mean: float, se: float) -> str:
  """'mean ± se' with two decimals from 1 up, else three significant digits
  (wine: 0.657 against 0.654), the standard error to as many decimals."""
  decimals = 2 if abs(mean) >= 1 or mean == 0 else (
      2 - math.floor(math.log10(abs(mean))))
  return f'{mean:.{decimals}f} ± {se:.{decimals}f}'


def compare(name: str, mean: float, se: float) -> tuple[str, str]:
  """('yes'/'no' for beating OLS, beats/matches/worse against the re-run).

  Matching means the re-run's mean lies within one standard error of ours.
  """
  _, _, rerun, ols = PUBLISHED[name]
  vs_rerun = ('beats' if mean < rerun else
              'matches' if mean - se <= rerun else 'worse')
  return ('yes' if mean < ols else 'no'), vs_rerun


def markdown_table(results: dict[str, dict]) -> str:
  """Our test RMSE beside the published ones, one row per data set."""
  lines = [
      '| data set | splits | meshfit | PBP | MC dropout | single net '
      '(re-run) | OLS | beats OLS | vs re-run | time (CPU) |',
      '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |']
  for name, r in results.items():
    (pbp, pbp_se), (mc, mc_sd), rerun, ols = PUBLISHED[name]
    beats_ols, vs_rerun = compare(name, r['rmse_mean'], r['rmse_se'])
    # The published numbers as printed in their sources.
    lines.append(
        f'| {name} | {r["n_splits"]} | '
        f'{_mean_se(r["rmse_mean"], r["rmse_se"])} | {pbp:.2f} ± '
        f'{pbp_se:.2f} | {mc:.2f} ± {mc_sd:.2f} | {rerun:g} | {ols:g} | '
        f'{beats_ols} | {vs_rerun} | '
        f'{r["seconds"] / 60:.1f} min ({r["cpu_seconds"] / 60:.1f}) |')
  verdicts = [compare(n, r['rmse_mean'], r['rmse_se'])
              for n, r in results.items()]
  lines.append('')
  lines.append(
      f'Beats OLS on {sum(v[0] == "yes" for v in verdicts)} of '
      f'{len(verdicts)}; matches or beats the single-network re-run on '
      f'{sum(v[1] != "worse" for v in verdicts)} of {len(verdicts)}. '
      'PBP ± standard error, MC dropout ± standard deviation (as published); '
      'meshfit ± standard error over the splits. Time: wall-clock minutes '
      '(process CPU minutes).')
  return '\n'.join(lines)


def run_dataset(data: UciData, n_splits: int, search: Search,
                scratch: str) -> dict:
  """Every split of one data set: test RMSEs, their mean and standard error."""
  name = data.name
  start, cpu_start = time.time(), time.process_time()
  rmses = []
  for i in range(n_splits):
    split_dir = os.path.join(scratch, name, str(i))
    os.makedirs(split_dir)
    r = run_split(data, i, search, split_dir)
    shutil.rmtree(split_dir)  # prepared TFDS copies and checkpoints
    rmses.append(r.test_rmse)
    print(f'{name} split {i}: test RMSE {r.test_rmse:.5g} (lr '
          f'{r.learning_rate:g}, weight decay {r.weight_decay:g}, '
          f'{r.epochs:.0f} epochs, validation RMSE {r.validation_rmse:.5g}); '
          f'{name} so far {time.time() - start:.0f} s, CPU '
          f'{time.process_time() - cpu_start:.0f} s', flush=True)
  mean, se = mean_and_se(rmses)
  return {'rmse_mean': mean, 'rmse_se': se, 'n_splits': n_splits,
          'rmse_per_split': rmses, 'seconds': time.time() - start,
          'cpu_seconds': time.process_time() - cpu_start}


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  unknown = [d for d in FLAGS.datasets if d not in PUBLISHED]
  if unknown:
    raise app.UsageError(f'unknown data sets {unknown}; use some of '
                         f'{",".join(DATASETS)}')
  # TFDS warns about every custom (per-split) config; errors still show.
  logging.set_verbosity(logging.ERROR)
  import tensorflow_datasets as tfds  # noqa: PLC0415
  tfds.disable_progress_bar()
  scratch = FLAGS.workdir or tempfile.mkdtemp(prefix='meshfit_uci_')
  # Splits of a data set compile the same steps: cache them on disk.
  jax.config.update('jax_compilation_cache_dir',
                    os.path.join(scratch, 'jax_cache'))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
  print(f'UCI benchmark on {jax.device_count()} {jax.default_backend()} '
        f'device(s); scratch {scratch}', flush=True)
  search = Search(tuple(map(float, FLAGS.learning_rates)),
                  tuple(map(float, FLAGS.weight_decays)), FLAGS.max_steps,
                  FLAGS.evals_per_run, FLAGS.holdout)
  start = time.time()
  results = {}
  try:
    for name in FLAGS.datasets:
      data = load(FLAGS.data_dir, name)
      n_splits = (data.n_splits if FLAGS.splits is None
                  else min(FLAGS.splits, data.n_splits))
      results[name] = run_dataset(data, n_splits, search, scratch)
  finally:
    if FLAGS.workdir is None:
      shutil.rmtree(scratch, ignore_errors=True)
  print()
  print(markdown_table(results))
  print(f'\nTotal time {(time.time() - start) / 60:.1f} min.')
  if FLAGS.output:
    with open(FLAGS.output, 'w', encoding='utf-8') as f:
      json.dump({n: {k: r[k] for k in ('rmse_mean', 'rmse_se', 'n_splits')}
                 for n, r in results.items()}, f, indent=2)
      f.write('\n')


if __name__ == '__main__':
  app.run(main)
