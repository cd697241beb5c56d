"""benchmarks/uci.py: the protocol's bookkeeping, and a small run end to end."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

# Every test here trains (or runs train.py): left out of `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UCI_DIR = os.path.join(ROOT, '..', 'shared', 'datasets', 'uci')


def _load_uci_module():
  spec = importlib.util.spec_from_file_location(
      'uci_benchmark', os.path.join(ROOT, 'benchmarks', 'uci.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


uci = _load_uci_module()


@pytest.fixture()
def toy(tmp_path):
  """50 rows whose only feature is the row number; test rows 0, 5, 10..."""
  n = 50
  test_idx = np.arange(0, n, 5)
  train_idx = np.random.default_rng(0).permutation(
      np.setdiff1d(np.arange(n), test_idx))
  np.savetxt(tmp_path / 'index_train_0.txt', train_idx, fmt='%d')
  np.savetxt(tmp_path / 'index_test_0.txt', test_idx, fmt='%d')
  data = uci.UciData('toy', np.arange(n, dtype=np.float64)[:, None],
                     np.zeros(n), n_hidden=4, n_splits=1,
                     directory=str(tmp_path))
  return data, train_idx, test_idx


def test_one_sweep_per_split_chooses_on_training_rows_and_tests_once(
    toy, tmp_path, monkeypatch):
  data, train_idx, test_idx = toy
  calls = []

  def fake_train(config, workdir, train_path, eval_path):
    rows = lambda path: set(pd.read_csv(path)['x0'].astype(int))  # noqa: E731
    calls.append(dict(config=config, train=rows(train_path),
                      eval=rows(eval_path)))
    return {'rmse': 1.5, 'nll': 0.25, 'coverage_90': 0.9, 'step': 60,
            'members': {'3': {'weight': 1.0}}}

  monkeypatch.setattr(uci, 'train', fake_train)
  search = uci.Search(learning_rates=(0.01, 0.1), weight_decays=(0.0, 0.5),
                      seeds=3, max_steps=100, evals_per_run=10, holdout=0.2,
                      nll_beta=0.5)
  (tmp_path / 'scratch').mkdir()
  result = uci.run_split(data, 0, search, str(tmp_path / 'scratch'))

  (call,) = calls  # one run per split: the whole grid as one sweep
  assert call['train'] == set(train_idx) and call['eval'] == set(test_idx)
  config = call['config']
  # meshfit holds the validation rows out of the training file itself, so
  # the members and the step are chosen on training rows only.
  assert config.dataset.validation == 0.2
  assert config.model.ensemble_size == 12
  assert config.sweep.learning_rates == (0.01, 0.1)
  assert config.sweep.weight_decays == (0.0, 0.5)
  assert config.sweep.select == 'greedy'
  assert config.model.likelihood == 'gaussian'
  assert config.model.nll_beta == 0.5
  assert config.model.hidden_sizes == (4,)
  assert config.num_train_steps == 100 and config.eval_every_steps == 10
  assert config.seed == 0
  assert (result.test_rmse, result.test_nll, result.coverage_90,
          result.step) == (1.5, 0.25, 0.9, 60)


def test_mean_and_standard_error():
  mean, se = uci.mean_and_se([1.0, 2.0, 3.0, 4.0])
  assert mean == 2.5
  assert se == pytest.approx(np.std([1, 2, 3, 4], ddof=1) / 2)


@pytest.mark.skipif(not os.path.isdir(os.path.join(UCI_DIR, 'yacht')),
                    reason='the UCI data sets are not in ../shared')
def test_two_yacht_splits_end_to_end_report_nll_and_beat_least_squares(
    tmp_path):
  out = tmp_path / 'results.json'
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS='')
  proc = subprocess.run(
      [sys.executable, 'benchmarks/uci.py', '--datasets=yacht', '--splits=2',
       '--learning_rates=1e-2', '--weight_decays=0', '--seeds=2',
       '--max_steps=1500', '--evals_per_run=5', f'--output={out}'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads(out.read_text())
  assert set(results) == {'yacht'}
  r = results['yacht']
  assert set(r) == {'rmse_mean', 'rmse_se', 'nll_mean', 'nll_se',
                    'coverage_90_mean', 'n_splits', 'cpu_seconds'}
  assert r['n_splits'] == 2 and r['rmse_se'] > 0 and r['nll_se'] > 0
  # Least squares scores 8.97 on these splits; a working MLP far less, and
  # a Gaussian that fits them has a density well above PBP's.
  assert r['rmse_mean'] < 8.97 / 2
  assert r['nll_mean'] < 1.63
  assert 0.5 < r['coverage_90_mean'] <= 1.0
  table = [line for line in proc.stdout.splitlines() if line.startswith('|')]
  assert table[0].startswith('| data set | splits | NLL | Deep Ens. |')
  assert table[2].startswith(
      f'| yacht | 2 | {uci._nll(r["nll_mean"], r["nll_se"])} | 1.18 |')


def test_table_rounds_small_errors_and_marks_references_not_reached():
  table = uci.markdown_table({'naval': dict(
      rmse_mean=0.000443, rmse_se=0.0000123, nll_mean=-5.5, nll_se=0.04,
      coverage_90_mean=0.9, n_splits=20, seconds=60, cpu_seconds=50)})
  assert ('| naval | 20 | -5.50 ± 0.04 | -5.63 (worse) | -4.45 | -3.73 | '
          '-5.34 | 90.0% | 0.000443 ± 0.000012 | 0.000495 | 0.01 ± 0.00 | '
          '1.0 min (0.8) |') in table
  assert "Deep Ensembles' on 0 of 1 and at or below MC dropout's on 1 of 1" \
      in table


def test_verdicts_compare_at_the_published_decimals():
  r = dict(nll_mean=2.4149, rmse_mean=2.96)
  assert uci.verdicts('boston', r) == {
      'nll_vs_de': True, 'nll_vs_mc': False, 'rmse_vs_before': True}
  r = dict(nll_mean=2.4151, rmse_mean=2.97)
  assert uci.verdicts('boston', r) == {
      'nll_vs_de': False, 'nll_vs_mc': False, 'rmse_vs_before': False}
