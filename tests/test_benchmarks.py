"""The benchmarks' cheapest sections run and report what they measure."""

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


def test_speed_norm_section_reports_both_ways_and_the_one_meshfit_takes():
  env = dict(os.environ, NO_GCE_CHECK='true')
  env.pop('XLA_FLAGS', None)  # the benchmark runs on the process's devices
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'benchmarks', 'speed.py'),
       '--sizes=small,medium', '--sections=norm', '--repeats=1',
       '--seconds=0.05'],
      capture_output=True, text=True, env=env, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = {line.split('|')[1].strip(): [c.strip() for c in line.split('|')[2:-1]]
          for line in result.stdout.splitlines()
          if line.startswith(('| small', '| medium'))}
  assert rows['small'][0] == '4,929' and rows['small'][-1] == 'one reduction'
  assert rows['medium'][0] == '268,801' and rows['medium'][-1] == 'per leaf'
  for cells in rows.values():
    assert float(cells[1].replace(',', '')) > 0
    assert float(cells[2].replace(',', '')) > 0


def test_speed_members_section_reports_each_ensemble_and_its_parts():
  env = dict(os.environ, NO_GCE_CHECK='true')
  env.pop('XLA_FLAGS', None)  # the benchmark runs on the process's devices
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'benchmarks', 'speed.py'),
       '--sections=members', '--members_size=small', '--members=1,8',
       '--repeats=1', '--seconds=0.05'],
      capture_output=True, text=True, env=env, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  tables = [[[c.strip() for c in line.split('|')[1:-1]] for line in block]
            for block in _tables(result.stdout)]
  speed, parts = [t for t in tables if t[0][0] == 'members']
  assert speed[0] == ['members', 'devices', 'steps/call', 'steps', 'steps/s',
                      'median', 'model-examples/s', 'x 1 member', 'GFLOP/s',
                      'of peak', 'cores busy']
  assert parts[0] == ['members', 'step (us)', 'per member (us)', 'matmuls',
                      'Adam over SGD', 'input pipeline', 'rest',
                      'matmul GFLOP/s', 'of peak']
  assert [row[0] for row in speed[2:]] == ['1', '8']
  assert [row[0] for row in parts[2:]] == ['1', '8']
  one, eight = (dict(zip(speed[0], row)) for row in speed[2:])
  assert one['x 1 member'] == '1.00x'
  for row in (one, eight):
    assert row['steps/call'] == '100'  # the small model's calls, 1 or 8
    assert row['devices'] == '1'
    for column in ('steps/s', 'model-examples/s', 'GFLOP/s', 'cores busy'):
      assert _number(row[column]) > 0, (column, row)
  # model-examples/s is members x batch x steps/s.
  assert _number(eight['model-examples/s']) == pytest.approx(
      8 * 256 * _number(eight['steps/s']), rel=0.01)
  assert float(eight['x 1 member'].rstrip('x')) == pytest.approx(
      _number(eight['model-examples/s']) / _number(one['model-examples/s']),
      abs=0.01)
  for row in parts[2:]:
    cells = dict(zip(parts[0], row))
    assert _number(cells['step (us)']) > 0
    assert _number(cells['matmuls'].split()[0]) > 0
    assert _number(cells['input pipeline'].split()[0]) > 0
    assert _number(cells['matmul GFLOP/s']) > 0


def _tables(text: str) -> list[list[str]]:
  """The markdown tables of `text`, each as its lines."""
  tables, block = [], []
  for line in text.splitlines() + ['']:
    if line.startswith('|'):
      block.append(line)
    elif block:
      tables.append(block)
      block = []
  return tables


def _number(cell: str) -> float:
  return float(cell.replace(',', '').rstrip('%x'))


def test_member_forms_reports_both_forms_against_one_model():
  env = dict(os.environ, NO_GCE_CHECK='true')
  env.pop('XLA_FLAGS', None)
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'benchmarks', 'member_forms.py'),
       '--members=1,4', '--hidden=8', '--batch=16', '--seconds=0.05'],
      capture_output=True, text=True, env=env, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = {line.split('|')[1].strip(): [c.strip() for c in line.split('|')[2:-1]]
          for line in result.stdout.splitlines() if line.startswith('| ')}
  assert set(rows) == {'members', '1', '4'}
  assert rows['1'][2] == '1.00x'  # one independent model against itself
  for cells in (rows['1'], rows['4']):
    assert float(cells[0].removesuffix('M')) > 0
    assert float(cells[1].removesuffix('M')) > 0


def test_matmul_isa_section_measures_both_instructions_or_says_why_not():
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'benchmarks', 'matmul.py'),
       '--sections=isa', '--rounds=1'],
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  if 'skipped: ' in result.stdout:  # no C compiler, or no AVX512_BF16
    return
  rows = [[c.strip() for c in line.split('|')[1:-1]]
          for line in result.stdout.splitlines() if ' at once |' in line]
  assert [r[1] for r in rows][:2] == ['sum', 'process 0']
  for row in rows:
    assert float(row[2]) > 0 and float(row[3]) > 0
    assert row[4].endswith('x')


def _tables_data_dir(root) -> str:
  """A --data_dir in the shared tables' layout: 'line' (two numbers, 60
  training and 20 test rows) and 'twice' (a header naming a column twice,
  which meshfit refuses with exit 2)."""
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(2, 80))
  line = pd.DataFrame({'a': a, 'b': b,
                       'y': 3 * a - 2 * b + 0.1 * rng.normal(size=80)})
  refs = {'ridge': 0.5, 'sklearn_mlp': 1.0, 'histgbr': 2.0, 'catboost': 0.25,
          'lightgbm': 4.0}
  for name in ('line', 'twice'):
    os.makedirs(root / name / '0')
  line[:60].to_csv(root / 'line' / '0' / 'train.csv', index=False)
  line[60:].to_csv(root / 'line' / '0' / 'test.csv', index=False)
  for kind, n in (('train', 60), ('test', 20)):
    (root / 'twice' / '0' / f'{kind}.csv').write_text(
        'a,a,y\n' + ''.join(f'{i},{i},{i}\n' for i in range(n)))
  (root / 'refs.json').write_text(json.dumps(
      {name: {'target': 'y', 'splits': {'0': refs}}
       for name in ('line', 'twice')}))
  return str(root)


def test_tables_benchmark_reports_meshfit_beside_refs_and_refusals(tmp_path):
  # --skip_refs never imports scikit-learn, which this venv lacks.
  data_dir = _tables_data_dir(tmp_path / 'tables')
  output = tmp_path / 'results.json'
  env = dict(os.environ, NO_GCE_CHECK='true')
  env.pop('XLA_FLAGS', None)  # meshfit runs on the process's devices
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'benchmarks', 'tables.py'),
       f'--data_dir={data_dir}', '--splits=0', '--skip_refs',
       '--meshfit_args=--config.num_train_steps=1000 '
       '--config.eval_every_steps=1000', f'--output={output}'],
      capture_output=True, text=True, env=env, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = {line.split('|')[1].strip(): [c.strip() for c in line.split('|')[2:-1]]
          for line in result.stdout.splitlines() if line.startswith('| ')}

  # table, rows, meshfit RMSE, ridge, MLP, HistGBR, CatBoost, LightGBM,
  # 5 ratios, time.
  line = rows['line']
  assert line[0] == '60' and line[2:7] == ['0.5000', '1.000', '2.000',
                                           '0.2500', '4.000']
  rmse = float(line[1])
  assert 0 < rmse < 0.5 * 3.6  # well under the test target's spread
  assert [float(r) for r in line[7:12]] == pytest.approx(
      [rmse / 0.5, rmse / 1.0, rmse / 2.0, rmse / 0.25, rmse / 4.0],
      abs=0.006)
  assert rows['twice'][1].startswith('exit 2: ')
  assert "column 'a' twice" in rows['twice'][1]
  assert rows['twice'][7:12] == ['–'] * 5
  assert rows['geometric mean (1 of 2 tables)'][7:12] == line[7:12]

  saved = json.loads(output.read_text())
  run = saved['tables']['line']['splits']['0']['meshfit']
  # --meshfit_args reached train.py: its one evaluation is the best step.
  assert run['step'] == 1000
  assert float(line[1]) == pytest.approx(run['rmse'], rel=1e-3)
  assert run['seconds'] > 0 and run['cpu_seconds'] > 0
  # --mode=predict on the test file scores what --mode=eval reported.
  assert run['predict_rmse'] == pytest.approx(run['rmse'], rel=1e-4)
  failed = saved['tables']['twice']['splits']['0']['meshfit']
  assert failed['returncode'] == 2 and failed['error'].startswith('error: ')
  assert saved['meshfit_args'] == ['--config.num_train_steps=1000',
                                   '--config.eval_every_steps=1000']
  assert saved['commit']


def test_scale_benchmark_prepares_and_streams_a_small_table(tmp_path):
  env = dict(os.environ, NO_GCE_CHECK='true')
  env.pop('XLA_FLAGS', None)
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'benchmarks', 'scale.py'),
       '--rows=30000', '--sections=prepare,input', '--input_seconds=0.5',
       f'--workroot={tmp_path}'],
      capture_output=True, text=True, env=env, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  tables = [[[c.strip() for c in line.split('|')[1:-1]] for line in block]
            for block in _tables(result.stdout)]
  prepare, feed = tables
  assert prepare[2][0] == '0.03M' and len(prepare) == 3
  for cell in prepare[2][1:]:
    assert float(cell) > 0
  assert [row[1] for row in feed[2:]] == ['1', '2']
  assert all(float(row[2].rstrip('M')) > 0 for row in feed[2:])
  assert len(os.listdir(tmp_path / '30000' / 'files')) == 9  # 8 + eval


def _table_scores():
  """benchmarks/table_scores.py (tables.py's scores without its absl flags,
  which would clash with uci.py's in this process)."""
  import table_scores  # noqa: PLC0415  (benchmarks/ is on pytest's pythonpath)
  return table_scores


def test_paired_interval_tells_a_real_difference_from_noise():
  tables = _table_scores()
  rng = np.random.default_rng(0)
  y = rng.normal(size=400)
  good = y + 0.5 * rng.normal(size=400)
  noisy = y + 1.0 * rng.normal(size=400)
  other_good = y + 0.5 * rng.normal(size=400)
  clear = tables.paired_interval(good, noisy, y)
  assert clear['diff'] == pytest.approx(
      tables.rmse(good, y) - tables.rmse(noisy, y))
  assert clear['low'] < clear['diff'] < clear['high'] < 0
  assert tables.verdict(clear) == 'better'
  assert tables.verdict(tables.paired_interval(noisy, good, y)) == 'worse'
  close = tables.paired_interval(good, other_good, y)
  assert close['low'] < 0 < close['high'] and tables.verdict(close) == 'tied'
  # Seeded: the same rows give the same interval.
  assert tables.paired_interval(good, noisy, y) == clear


def test_interval_report_counts_splits_per_reference():
  tables = _table_scores()
  better = {'diff': -2.0, 'low': -3.0, 'high': -1.0}
  tied = {'diff': 0.5, 'low': -1.0, 'high': 2.0}
  worse = {'diff': 2.0, 'low': 1.0, 'high': 3.0}
  results = {
      'a': {'splits': {
          '0': {m: {'rmse': 1.0, 'meshfit_minus': better}
                for m in tables.MODELS},
          '1': {'ridge': {'rmse': 1.0, 'meshfit_minus': tied},
                'sklearn_mlp': {'rmse': 1.0, 'meshfit_minus': worse},
                'histgbr': {'rmse': 1.0, 'meshfit_minus': tied}}}},
      # References from refs.json: no intervals, no row.
      'b': {'splits': {'0': {m: {'rmse': 1.0, 'from': 'refs.json'}
                             for m in tables.MODELS}}}}
  rows = [[c.strip() for c in line.split('|')[1:-1]]
          for line in tables.interval_report(results).splitlines()]
  assert rows[0] == ['table', 'vs ridge', 'vs sklearn MLP', 'vs HistGBR',
                     'vs CatBoost', 'vs LightGBM']
  # Split 1 has no CatBoost or LightGBM interval: split 0's alone count.
  assert rows[2:] == [['a', '1 / 1 / 0', '1 / 0 / 1', '1 / 1 / 0',
                       '1 / 0 / 0', '1 / 0 / 0'],
                      ['splits in all', '1 / 1 / 0', '1 / 0 / 1',
                       '1 / 1 / 0', '1 / 0 / 0', '1 / 0 / 0']]
  assert tables.interval_report({'b': results['b']}) == ''


def test_early_stopping_reads_a_patience_as_the_best_tracker_stops():
  import early_stopping  # noqa: PLC0415  (benchmarks/ is on the path)
  from meshfit.train.validation import BestTracker  # noqa: PLC0415
  losses = [1.0, 0.8, 0.9, 0.85, 0.7, 0.75, 0.76, 0.77, 0.71, 0.72]
  for patience in (1, 2, 3, 4, 20):
    tracker, stop = BestTracker(patience), len(losses) - 1
    for i, loss in enumerate(losses):
      tracker.update(i + 1, loss)
      if tracker.stopped:
        stop = i
        break
    assert early_stopping.stopped(losses, patience) == (
        stop, tracker.best_step - 1), patience


def _early_stopping(tmp_path, records, *flags: str) -> str:
  """early_stopping.py's output on one run (table/0, a 400-step cap) of
  these metrics records."""
  workdir = tmp_path / 'runs' / 'table' / '0' / 'workdir'
  workdir.mkdir(parents=True)
  (workdir / 'config.json').write_text(json.dumps({'num_train_steps': 400}))
  (workdir / 'metrics.jsonl').write_text(
      ''.join(json.dumps(r) + '\n' for r in records))
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'benchmarks', 'early_stopping.py'),
       f'--runs={tmp_path}', *flags],
      capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


def test_early_stopping_lengths_reads_each_runs_cap_stop_and_best(tmp_path):
  records = [{'step': 10 * i, 'train/loss': 1.0} for i in range(1, 4)] + [
      {'step': 10 * i, 'val/loss': loss}
      for i, loss in enumerate([0.9, 0.5, 0.5, 0.7], start=1)]
  row = next(line for line in _early_stopping(
      tmp_path, records, '--lengths').splitlines()
             if line.startswith('| table/0'))
  # The first of equal losses is the best, as BestTracker keeps it.
  assert [c.strip() for c in row.split('|')[1:-1]] == [
      'table/0', '400', '40', '20', '0.05']


def test_early_stopping_reads_patiences_off_runs_that_scored_the_eval_file_once(
    tmp_path):
  # The default runs: validation losses at every evaluation, no eval RMSE.
  records = [{'step': 10 * i, 'val/loss': loss}
             for i, loss in enumerate([0.9, 0.6, 0.7, 0.5], start=1)]
  stdout = _early_stopping(tmp_path, records, '--patiences=1,3')
  rows = {cells[0]: cells[1:] for cells in (
      [c.strip() for c in line.split('|')[1:-1]]
      for line in stdout.splitlines() if line.startswith('| '))}
  # Patience 1 stops at step 30 with step 20's 0.6 for step 40's 0.5.
  assert rows['1'] == ['1.2000', '1.200', '', '', '', '0.75', '1']
  assert rows['3'] == ['1.0000', '1.000', '', '', '', '1.00', '0']
  assert 'table/0 (20 for 40: val 1.200x)' in stdout


def test_first_minute_big_section_reports_each_run_and_its_memory(tmp_path):
  # A table small enough to be held in memory in both runs (of the three:
  # the streamed, prepared one is left out for the suite's time).
  env = dict(os.environ, NO_GCE_CHECK='true')
  env.pop('XLA_FLAGS', None)
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'benchmarks', 'first_minute.py'),
       '--sections=big', '--big_rows=4000', '--big_runs=cold,resident',
       f'--big_root={tmp_path / "tables"}'],
      capture_output=True, text=True, env=env, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [[c.strip() for c in line.split('|')[1:-1]]
          for line in result.stdout.splitlines()
          if line.startswith(('| cold', '| prepared'))]
  assert [r[:3] for r in rows] == [['cold', '256', 'gathered on device'],
                                   ['prepared', '4096', 'gathered on device']]
  for row in rows:
    assert float(row[3]) > 0
    assert all(0.1 < float(g) < 8 for g in row[4].split(' / '))
    assert row[5].startswith('Sized to the 3200 training rows')


def test_error_rows_scores_with_and_without_rows_and_finds_the_gap():
  import table_scores  # noqa: PLC0415  (benchmarks/ is on the path)
  y = np.array([1.0, 2.0, 3.0, 10.0])
  # meshfit is better on every row but the last, where it is far off.
  predictions = {'meshfit': np.array([1.1, 2.1, 2.9, 16.0]),
                 'catboost': np.array([1.5, 2.5, 3.5, 11.0])}
  kept = np.array([True, True, True, False])
  rows = [[c.strip() for c in line.split('|')[1:-1]] for line in
          table_scores.score_table({'0': (predictions, y, kept)}, 'catboost',
                                 excluding=True).splitlines()]
  assert rows[0] == ['model', 'split 0', 'split 0 kept', 'x CatBoost',
                     'x CatBoost, kept']
  # RMSE sqrt((3 * 0.01 + 36) / 4) over all rows, 0.1 over the kept ones.
  assert rows[2] == ['meshfit', '3.001', '0.1000', '4.537', '0.200']
  assert rows[3] == ['CatBoost', '0.6614', '0.5000', '1.000', '1.000']
  # The last row holds more than all of meshfit's excess (the others give
  # some back): 36 - 1 of 3 * (0.01 - 0.25) + 35 = 34.28.
  (row, share), = table_scores.excess_rows(predictions, y, 'catboost', top=1)
  assert row == 3 and share == pytest.approx(35.0 / 34.28)
  # No excess at all: no share to give.
  _, share = table_scores.excess_rows(
      {'meshfit': y, 'catboost': y + 1}, y, 'catboost', top=1)[0]
  assert np.isnan(share)


def test_log_target_carves_a_holdout_from_the_train_file_and_reads_back(
    tmp_path):
  # table_scores, not log_target: log_target imports tables.py's flags,
  # which another benchmark's test has defined already (--data_dir).
  scores = _table_scores()
  rng = np.random.default_rng(0)
  frame = pd.DataFrame({'x': rng.normal(size=50),
                        'y': np.exp(rng.normal(size=50))})
  frame.loc[3, 'y'] = np.nan  # a row without a target is left out
  train = tmp_path / 'train.csv'
  frame.to_csv(train, index=False)
  paths = scores.carve_holdout(str(train), 'y', '1', str(tmp_path / 'files'))
  fit, holdout = pd.read_csv(paths['fit']), pd.read_csv(paths['holdout'])
  assert (len(fit), len(holdout)) == (39, 10)
  kept = frame.dropna().round(12)
  assert sorted(pd.concat([fit, holdout])['y'].round(12)) == sorted(kept['y'])
  assert not set(fit['x'].round(12)) & set(holdout['x'].round(12))
  np.testing.assert_allclose(pd.read_csv(paths['fit_log'])['y'],
                             np.log(fit['y']), rtol=1e-12)
  np.testing.assert_allclose(pd.read_csv(paths['holdout_log'])['x'],
                             holdout['x'])
  # The same split seeds the same holdout; another split another.
  again = scores.carve_holdout(str(train), 'y', '1', str(tmp_path / 'again'))
  assert pd.read_csv(again['holdout']).equals(holdout)
  other = scores.carve_holdout(str(train), 'y', '0', str(tmp_path / 'other'))
  assert not pd.read_csv(other['holdout']).equals(holdout)
  frame.loc[0, 'y'] = 0.0
  frame.to_csv(train, index=False)
  assert scores.carve_holdout(str(train), 'y', '0', str(tmp_path / 'no')) is None

  truth = np.array([1.0, 2.0, 4.0])
  got = scores.log_scores(truth, raw=truth + 1, logged=np.log(truth),
                          log_mse=0.5)
  assert got['raw'] == pytest.approx(1.0)
  assert got['log_median'] == pytest.approx(0.0)
  # The mean of a lognormal: exp(mu + s^2 / 2), above its median.
  factor = np.exp(0.25) - 1
  assert got['log_mean'] == pytest.approx(
      factor * np.sqrt(np.mean(truth**2)))


def test_step_profile_names_each_op_by_the_part_of_the_model_it_runs():
  import step_profile  # noqa: PLC0415  (benchmarks/ is on the path)
  ops = step_profile.read_ops('\n'.join([
      '  %dot.65 = f32[5,54,16,128]{3,2,1,0} dot(%a, %b), metadata={op_name='
      '"jit(train_call)/while/body/vmap(jvp(number_embedding))/bnk,nkd->bnd'
      '/dot_general" stack_frame_id=39}',
      '  %ynn_fusion.6 = f32[5,128,918]{2,1,0} fusion(%c, %d), kind=kCustom, '
      'metadata={op_name="jit(train_call)/while/body/vmap(transpose(jvp('
      'hidden_0)))/dot_general"}',
      '  ROOT %wrapped_multiply.6 = f32[5,918,128]{2,1,0} fusion(%e), '
      'metadata={op_name="jit(train_call)/while/body/vmap(optimizer)/mul"}',
      '  %copy.3 = f32[4]{0} copy(%f)',
      # The innermost scope names the op.
      '  %x.1 = f32[2]{0} add(%g, %h), metadata={op_name="jit(train_call)/'
      'while/body/batch/vmap(jvp(hidden_2))/add"}']))
  assert {name: (op.shape, op.part) for name, op in ops.items()} == {
      'dot.65': ('f32[5,54,16,128]', 'number_embedding'),
      'ynn_fusion.6': ('f32[5,128,918]', 'hidden_0'),
      'wrapped_multiply.6': ('f32[5,918,128]', 'optimizer'),
      'copy.3': ('f32[4]', 'other'), 'x.1': ('f32[2]', 'hidden_2')}
  ms = {'dot.65': 6.0, 'ynn_fusion.6': 2.0, 'wrapped_multiply.6': 1.0,
        'copy.3': 1.0, 'unknown.1': 2.0}
  assert step_profile.part_rows(ms, ops, steps=2) == [
      ['number_embedding', '3.000', '50%'], ['hidden_0', '1.000', '17%'],
      ['optimizer', '0.500', '8%'], ['other', '1.500', '25%'],
      ['all', '6.000', '100%']]
