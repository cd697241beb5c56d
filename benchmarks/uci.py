"""The UCI regression benchmark, run through meshfit's own training code.

    python benchmarks/uci.py [--data_dir=../shared/datasets/uci]
        [--datasets=boston,yacht] [--splits=N] [--output=results.json]

The protocol of ../shared/datasets/uci/README.md: the published splits, one
hidden layer of 50 ReLU units (100 for protein), features and target
standardised with the training split's statistics, test RMSE and test
negative log-likelihood (per example, in the target's original units), mean
and standard error over the splits.

Every model is trained the way a user trains one: each split's rows are
written to CSV files and `train_and_evaluate` runs on a config derived
from configs/csv.py, in this process, on one device.

One run per split, its hyperparameters chosen inside it: a Gaussian ensemble
(`model.likelihood='gaussian'`) whose members take the grid of learning rate
x weight decay in turn (`sweep`), `--seeds` members per grid point, trained
as one program. meshfit holds out a seeded `--holdout` of the split's
training rows (a fraction in `dataset.validation`), scores every member on them
at each of `--evals_per_run` evaluations, and keeps the greedy ensemble
(Caruana et al. 2004) of the step with the best validation NLL, stopping
after `--patience` evaluations without a better one. That model, chosen on
training rows only, is the one whose test metrics are reported. Members
train on beta-NLL (`--nll_beta`, Seitzer et al. 2022): plain NLL leaves the
mean underfit (energy's RMSE twice the squared-error model's).
"""

import dataclasses
import json
import math
import os
import shutil
import tempfile
import time

# Before TensorFlow, TFDS and JAX are imported: one CPU device, quiet logs.
os.environ.setdefault('NO_GCE_CHECK', 'true')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
from meshfit.parallel import xla_flags  # noqa: E402  (imports no jax)

xla_flags.apply()  # as train.py does

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from absl import app, flags, logging  # noqa: E402

from meshfit.configs import csv as csv_config  # noqa: E402
from meshfit.train.loop import train_and_evaluate  # noqa: E402

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
                  'Peak learning rates of the sweep.')
flags.DEFINE_list('weight_decays', ['0', '0.3'],
                  'Decoupled weight decays of the sweep (AdamW; per unit of '
                  'learning rate, as optax applies it).')
flags.DEFINE_integer('seeds', 2, 'Members per point of the grid.')
flags.DEFINE_integer('max_steps', 4000, 'Optimizer steps of each run.')
flags.DEFINE_integer('evals_per_run', 20, 'Validation evaluations per run: '
                     'the candidate steps.')
flags.DEFINE_integer('patience', 4, 'Stop a run once this many evaluations '
                     'in a row have not improved its validation NLL '
                     '(early_stopping_evals; 0: every step).')
flags.DEFINE_float('holdout', 0.2, 'Fraction of each training split held '
                   'out (by meshfit, seeded by the split) to choose members '
                   'and the step.')
flags.DEFINE_float('nll_beta', 0.5, 'beta of beta-NLL (0: plain NLL): 0.5 '
                   'fits the mean as well as squared error does.')
flags.DEFINE_string('select', 'greedy', 'sweep.select: greedy, best or all.')
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

# Test NLL, per example in the target's units: Deep Ensembles (5 networks;
# Lakshminarayanan et al. 2017, Table 1), MC dropout with grid search as
# re-run by its authors, PBP, and NGBoost (Duan et al. 2019).
PUBLISHED_NLL = {
    #           DE     MC dropout  PBP    NGBoost
    'boston': (2.41, 2.40, 2.57, 2.43),
    'concrete': (3.06, 2.93, 3.16, 3.04),
    'energy': (1.38, 1.21, 2.04, 0.60),
    'kin8nm': (-1.20, -1.14, -0.90, -0.49),
    'naval': (-5.63, -4.45, -3.73, -5.34),
    'power': (2.79, 2.80, 2.84, 2.79),
    'protein': (2.83, 2.87, 2.97, 2.81),
    'wine': (0.94, 0.93, 0.97, 0.91),
    'yacht': (1.18, 1.25, 1.63, 0.20),
}

# This benchmark's test RMSE before ensembles (docs/uci.md, commit 435e2ea:
# the best of a 2 x 2 grid per split, retrained on the whole split).
PREVIOUS_RMSE = {'boston': 2.95, 'concrete': 4.90, 'energy': 0.439,
                 'kin8nm': 0.0788, 'naval': 0.000495, 'power': 3.98,
                 'protein': 4.28, 'wine': 0.626, 'yacht': 0.703}


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


@dataclasses.dataclass(frozen=True)
class Search:
  """The sweep of each split's run.

  Attributes:
    learning_rates: peak learning rates of the grid.
    weight_decays: AdamW decoupled weight decays of the grid.
    seeds: members per grid point.
    max_steps: steps of the run.
    evals_per_run: validation evaluations: the candidate steps.
    holdout: fraction of the training split held out for validation.
    nll_beta: beta of beta-NLL.
    select: how members are weighed (sweep.select).
    patience: early_stopping_evals.
  """
  learning_rates: tuple[float, ...]
  weight_decays: tuple[float, ...]
  seeds: int
  max_steps: int
  evals_per_run: int
  holdout: float
  nll_beta: float = 0.0
  select: str = 'greedy'
  patience: int = 0

  @property
  def members(self) -> int:
    return len(self.learning_rates) * len(self.weight_decays) * self.seeds


def config_for(data: UciData, i: int, search: Search, scratch: str,
               num_train_rows: int) -> ml_collections.ConfigDict:
  """configs/csv.py with the protocol's model and split i's sweep."""
  config = csv_config.get_config()
  config.seed = i
  config.dataset.data_dir = os.path.join(scratch, 'tfds')
  config.dataset.target_columns = ('y',)
  # The protocol's inputs: numbers standardised, fed as they are.
  config.dataset.numeric_scaling = 'standardize'
  config.dataset.validation = search.holdout
  config.model.hidden_sizes = (data.n_hidden,)
  config.model.activation = 'relu'
  config.model.numeric_embedding = 'none'
  config.model.raw_numbers = False
  config.model.dropout_rate = 0.0
  config.model.dtype = config.model.param_dtype = 'float32'
  config.model.likelihood = 'gaussian'
  config.model.nll_beta = search.nll_beta
  config.model.ensemble_size = search.members
  config.sweep.learning_rates = search.learning_rates
  config.sweep.weight_decays = search.weight_decays
  config.sweep.dropout_rates = ()
  config.sweep.select = search.select
  # The schedule is the protocol's, whatever configs/csv.py's defaults are.
  config.optimizer.name = 'adamw'
  config.optimizer.schedule = 'warmup_cosine'
  config.optimizer.warmup_steps = 100
  config.optimizer.end_learning_rate_factor = 0.01
  config.optimizer.grad_clip_norm = 0.0
  config.batch_size = batch_size(num_train_rows)
  config.num_train_steps = search.max_steps
  config.eval_every_steps = max(search.max_steps // search.evals_per_run, 1)
  config.early_stopping_evals = search.patience
  # Only what the benchmark reads: no intermediate checkpoints or logs.
  config.log_every_steps = search.max_steps
  config.checkpoint_every_steps = 0
  config.checkpoint_every_seconds = 0
  config.max_checkpoints_to_keep = 1
  config.plots = False  # hundreds of runs: pictures would cost minutes
  return config


def write_csv(path: str, x_NxF: np.ndarray, y_N: np.ndarray) -> str:
  frame = pd.DataFrame(x_NxF, columns=[f'x{j}' for j in range(x_NxF.shape[1])])
  frame['y'] = y_N
  frame.to_csv(path, index=False)
  return path


def train(config: ml_collections.ConfigDict, workdir: str, train_path: str,
          eval_path: str) -> dict:
  """One meshfit run; returns its evaluation of the model it chose."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.dataset.train_path, config.dataset.eval_path = train_path, eval_path
  return train_and_evaluate(config, workdir)


@dataclasses.dataclass(frozen=True)
class SplitResult:
  test_rmse: float
  test_nll: float
  coverage_90: float
  step: int
  members: dict


def run_split(data: UciData, i: int, search: Search,
              scratch: str) -> SplitResult:
  """Trains split `i`'s sweep, chooses on its training rows, tests once.

  Args:
    data: the data set.
    i: the published split.
    search: the sweep.
    scratch: an empty directory for this split's files and run.
  """
  train_idx, test_idx = data.split(i)
  csv = lambda name, idx: write_csv(  # noqa: E731
      os.path.join(scratch, f'{name}.csv'), data.x_NxF[idx], data.y_N[idx])
  config = config_for(data, i, search, scratch, len(train_idx))
  final = train(config, os.path.join(scratch, 'run'),
                csv('train', train_idx), csv('test', test_idx))
  return SplitResult(final['rmse'], final['nll'], final['coverage_90'],
                     final['step'], final.get('members', {}))


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


def _nll(value: float, se: float | None = None) -> str:
  """An NLL to two decimals (naval's to the same: -5.63)."""
  return f'{value:.2f}' + ('' if se is None else f' ± {se:.2f}')


def verdicts(name: str, r: dict) -> dict[str, bool]:
  """Whether split-mean test NLL is at or below Deep Ensembles' and MC
  dropout's, and RMSE at or below this benchmark's before ensembles."""
  de, mc, _, _ = PUBLISHED_NLL[name]
  return {'nll_vs_de': round(r['nll_mean'], 2) <= de,
          'nll_vs_mc': round(r['nll_mean'], 2) <= mc,
          'rmse_vs_before': r['rmse_mean'] <= PREVIOUS_RMSE[name] * (1 + 5e-3)}


def markdown_table(results: dict[str, dict]) -> str:
  """Test NLL, 90% coverage and RMSE beside the published ones."""
  lines = [
      '| data set | splits | NLL | Deep Ens. | MC dropout | PBP | NGBoost '
      '| 90% covers | RMSE | before | MC dropout | time (CPU) |',
      '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- '
      '| --- |']
  counts = {'nll_vs_de': 0, 'nll_vs_mc': 0, 'rmse_vs_before': 0}
  for name, r in results.items():
    de, mc, pbp, ngb = PUBLISHED_NLL[name]
    verdict = verdicts(name, r)
    for key, ok in verdict.items():
      counts[key] += ok
    mark = lambda key: '' if verdict[key] else ' (worse)'  # noqa: E731
    (_, _), (mc_rmse, mc_sd), _, _ = PUBLISHED[name]
    lines.append(
        f'| {name} | {r["n_splits"]} | '
        f'{_nll(r["nll_mean"], r["nll_se"])} | {de:.2f}{mark("nll_vs_de")} '
        f'| {mc:.2f}{mark("nll_vs_mc")} | {pbp:.2f} | {ngb:.2f} | '
        f'{r["coverage_90_mean"]:.1%} | '
        f'{_mean_se(r["rmse_mean"], r["rmse_se"])} | '
        f'{PREVIOUS_RMSE[name]:g}{mark("rmse_vs_before")} | '
        f'{mc_rmse:.2f} ± {mc_sd:.2f} | '
        f'{r["seconds"] / 60:.1f} min ({r["cpu_seconds"] / 60:.1f}) |')
  n = len(results)
  coverage = np.mean([r['coverage_90_mean'] for r in results.values()])
  lines.append('')
  lines.append(
      f'Test NLL at or below Deep Ensembles\' on {counts["nll_vs_de"]} of '
      f'{n} and at or below MC dropout\'s on {counts["nll_vs_mc"]} of {n} '
      '(compared at the two decimals they are published to); RMSE no worse '
      f'than this benchmark\'s before ensembles on {counts["rmse_vs_before"]}'
      f' of {n}; the 90% intervals cover {coverage:.1%} of test rows on '
      'average. meshfit ± standard error over the splits; MC dropout RMSE '
      '± standard deviation as published. "(worse)" marks a reference '
      'meshfit does not reach. Time: wall-clock minutes (process CPU '
      'minutes).')
  return '\n'.join(lines)


def run_dataset(data: UciData, n_splits: int, search: Search,
                scratch: str) -> dict:
  """Every split of one data set: test metrics, means and standard errors."""
  name = data.name
  start, cpu_start = time.time(), time.process_time()
  splits = []
  for i in range(n_splits):
    split_dir = os.path.join(scratch, name, str(i))
    os.makedirs(split_dir)
    r = run_split(data, i, search, split_dir)
    shutil.rmtree(split_dir)  # prepared copies and checkpoints
    splits.append(r)
    print(f'{name} split {i}: test NLL {r.test_nll:.4g}, RMSE '
          f'{r.test_rmse:.5g}, 90% interval covers {r.coverage_90:.1%} '
          f'(step {r.step}, members {",".join(r.members) or "all"}); {name} '
          f'so far {time.time() - start:.0f} s, CPU '
          f'{time.process_time() - cpu_start:.0f} s', flush=True)
  out = {'n_splits': n_splits, 'seconds': time.time() - start,
         'cpu_seconds': time.process_time() - cpu_start}
  for key, values in (('rmse', [r.test_rmse for r in splits]),
                      ('nll', [r.test_nll for r in splits]),
                      ('coverage_90', [r.coverage_90 for r in splits])):
    out[f'{key}_mean'], out[f'{key}_se'] = mean_and_se(values)
    out[f'{key}_per_split'] = values
  return out


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  unknown = [d for d in FLAGS.datasets if d not in PUBLISHED]
  if unknown:
    raise app.UsageError(f'unknown data sets {unknown}; use some of '
                         f'{",".join(DATASETS)}')
  logging.set_verbosity(logging.ERROR)
  scratch = FLAGS.workdir or tempfile.mkdtemp(prefix='meshfit_uci_')
  # Splits of a data set compile the same steps: cache them on disk.
  jax.config.update('jax_compilation_cache_dir',
                    os.path.join(scratch, 'jax_cache'))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
  search = Search(tuple(map(float, FLAGS.learning_rates)),
                  tuple(map(float, FLAGS.weight_decays)), FLAGS.seeds,
                  FLAGS.max_steps, FLAGS.evals_per_run, FLAGS.holdout,
                  FLAGS.nll_beta, FLAGS.select, FLAGS.patience)
  print(f'UCI benchmark on {jax.device_count()} {jax.default_backend()} '
        f'device(s), {search.members} members per run; scratch {scratch}',
        flush=True)
  start, cpu_start = time.time(), time.process_time()
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
  print(f'\nTotal time {(time.time() - start) / 60:.1f} min, CPU '
        f'{(time.process_time() - cpu_start) / 60:.1f} min.')
  if FLAGS.output:
    keys = ('rmse_mean', 'rmse_se', 'nll_mean', 'nll_se', 'coverage_90_mean',
            'n_splits', 'cpu_seconds')
    with open(FLAGS.output, 'w', encoding='utf-8') as f:
      json.dump({n: {k: r[k] for k in keys} for n, r in results.items()},
                f, indent=2)
      f.write('\n')


if __name__ == '__main__':
  app.run(main)
