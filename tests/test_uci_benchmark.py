"""benchmarks/uci.py: the protocol's bookkeeping, and a small run end to end."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

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


def test_choices_use_training_rows_only_and_the_test_split_once(
    toy, tmp_path, monkeypatch):
  data, train_idx, test_idx = toy
  calls = []

  def fake_train(config, workdir, train_path, eval_path, num_steps,
                 eval_every):
    rows = lambda path: set(pd.read_csv(path)['x0'].astype(int))  # noqa: E731
    calls.append(dict(train=rows(train_path), eval=rows(eval_path),
                      lr=config.optimizer.learning_rate,
                      wd=config.optimizer.weight_decay, steps=num_steps,
                      batch=config.batch_size))
    # The validation curve is lowest for lr 0.1, wd 0.5 at step 30.
    best = (config.optimizer.learning_rate == 0.1
            and config.optimizer.weight_decay == 0.5)
    return [(s, (0.5 if best and s == 30 else 1.0) + s / 1e4)
            for s in range(eval_every, num_steps + 1, eval_every)]

  monkeypatch.setattr(uci, 'train', fake_train)
  search = uci.Search(learning_rates=(0.01, 0.1), weight_decays=(0.0, 0.5),
                      max_steps=100, evals_per_run=10, holdout=0.2)
  (tmp_path / 'scratch').mkdir()
  result = uci.run_split(data, 0, search, str(tmp_path / 'scratch'))

  *validation, final = calls
  assert len(validation) == 4  # the whole grid
  held_out = set(train_idx[32:])  # the last 20% of the 40 training rows
  for call in validation:
    assert call['eval'] == held_out
    assert call['train'] == set(train_idx[:32])
    assert not (call['train'] | call['eval']) & set(test_idx)
  assert final['train'] == set(train_idx) and final['eval'] == set(test_idx)
  assert (result.learning_rate, result.weight_decay) == (0.1, 0.5)
  # Step 30 of batches of `batch` rows on 32 rows, in epochs; the final run
  # trains as many epochs on all 40 training rows.
  assert result.epochs == pytest.approx(30 * final['batch'] / 32)
  assert final['steps'] == round(result.epochs * 40 / final['batch'])
  assert (final['lr'], final['wd']) == (0.1, 0.5)


def test_mean_and_standard_error():
  mean, se = uci.mean_and_se([1.0, 2.0, 3.0, 4.0])
  assert mean == 2.5
  assert se == pytest.approx(np.std([1, 2, 3, 4], ddof=1) / 2)


@pytest.mark.skipif(not os.path.isdir(os.path.join(UCI_DIR, 'yacht')),
                    reason='the UCI data sets are not in ../shared')
def test_two_yacht_splits_end_to_end_beat_least_squares(tmp_path):
  out = tmp_path / 'results.json'
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS='')
  proc = subprocess.run(
      [sys.executable, 'benchmarks/uci.py', '--datasets=yacht', '--splits=2',
       '--learning_rates=1e-2', '--weight_decays=0,0.3', '--max_steps=1500',
       '--evals_per_run=5', f'--output={out}'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads(out.read_text())
  assert set(results) == {'yacht'}
  assert set(results['yacht']) == {'rmse_mean', 'rmse_se', 'n_splits'}
  assert results['yacht']['n_splits'] == 2
  assert results['yacht']['rmse_se'] > 0
  # Least squares scores 8.97 on these splits; a working MLP far less.
  assert results['yacht']['rmse_mean'] < 8.97 / 2
  table = [line for line in proc.stdout.splitlines() if line.startswith('|')]
  assert table[0].startswith('| data set | splits | meshfit | PBP |')
  mean, se = results['yacht']['rmse_mean'], results['yacht']['rmse_se']
  assert table[2].startswith(f'| yacht | 2 | {uci._mean_se(mean, se)} | '
                             '1.02 ± 0.05 | 1.11 ± 0.38 | 1.23 | 8.97 | yes |')


def test_table_rounds_small_errors_to_three_significant_digits():
  table = uci.markdown_table({'naval': dict(
      rmse_mean=0.000443, rmse_se=0.0000123, n_splits=20, seconds=60,
      cpu_seconds=50)})
  assert '| naval | 20 | 0.000443 ± 0.000012 | 0.01 ± 0.00 |' in table
  assert '| 0.00173 | 0.0059 | yes | beats | 1.0 min (0.8) |' in table
  assert 'Beats OLS on 1 of 1; matches or beats the single-network re-run ' \
         'on 1 of 1.' in table
