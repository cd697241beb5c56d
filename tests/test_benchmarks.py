"""The benchmarks: each drives meshfit through its entry points only, and
each one's quick mode runs and reports what it measures."""

import ast
import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = sorted(glob.glob(os.path.join(ROOT, 'benchmarks', '*.py')))

# What a benchmark may import of this project, by module: the names listed
# (None: any public name). meshfit through its entry points (the loop a
# notebook calls, eval / predict / export of a saved run, the config, the
# errors, the XLA flags train.py starts with), the configs, the storage
# layer (which gcs_storage.py measures) and the table preparation that
# train.py runs on a new table (scale.py and gcs_storage.py time it).
# Everything else of meshfit is free to change without breaking a benchmark.
ENTRY_POINTS = {
    'meshfit': None,
    'meshfit.train.loop': {'train_and_evaluate'},
    'meshfit.serve.evaluate': {'evaluate'},
    'meshfit.serve.predict': {'predict'},
    'meshfit.serve.export': {'export'},
    'meshfit.config': None,
    'meshfit.errors': None,
    'meshfit.parallel': {'xla_flags'},
    'meshfit.parallel.xla_flags': {'apply'},
    'meshfit.configs': None,
    'meshfit.storage': None,
    'meshfit.input_pipeline.csv_regression': {'prepare'},
}
PROJECT = ('meshfit', 'configs', 'storage', 'input_pipeline', 'models')


def _imports(path: str) -> list[tuple[str, str | None]]:
  """(module, name) of every project import in a file; name None for
  `import module`."""
  with open(path, encoding='utf-8') as f:
    tree = ast.parse(f.read(), path)
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [(a.name, None) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      found += [(node.module, a.name) for a in node.names]
  return [(m, n) for m, n in found if m.split('.')[0] in PROJECT]


def _allowed(module: str, name: str | None) -> bool:
  if name is not None and name.startswith('_'):
    return False
  if module in ENTRY_POINTS:
    names = ENTRY_POINTS[module]
    return name is None or names is None or name in names
  # A sub-module of configs or storage (meshfit.configs.default, meshfit.storage.emulator).
  return module.startswith(('meshfit.configs.', 'meshfit.storage.'))


def test_benchmarks_reach_meshfit_through_its_entry_points_only():
  assert len(BENCHMARKS) >= 6  # the suite is here
  reaching = [f'{os.path.basename(p)}: {m}{"." + n if n else ""}'
              for p in BENCHMARKS for m, n in _imports(p)
              if not _allowed(m, n)]
  assert not reaching, (
      'these benchmarks import meshfit past its entry points (a refactor '
      'would break them; drive meshfit through ENTRY_POINTS, or add a '
      f'documented public hook): {reaching}')


def test_the_entry_point_rule_catches_an_internal_import(tmp_path):
  path = tmp_path / 'bench.py'
  path.write_text('from meshfit.data import feeding\n'
                  'from meshfit.train.loop import _train\n'
                  'from meshfit.train.loop import train_and_evaluate\n'
                  'import meshfit.models.mlp\n'
                  'from meshfit.configs import default\n'
                  'import numpy\n')
  verdicts = {(m, n): _allowed(m, n) for m, n in _imports(str(path))}
  assert verdicts == {('meshfit.data', 'feeding'): False,
                      ('meshfit.train.loop', '_train'): False,
                      ('meshfit.train.loop', 'train_and_evaluate'): True,
                      ('meshfit.models.mlp', None): False,
                      ('meshfit.configs', 'default'): True}


def test_no_benchmark_names_an_issue():
  for path in BENCHMARKS:
    with open(path, encoding='utf-8') as f:
      assert not re.search(r'issue \d', f.read(), re.IGNORECASE), path


def _run(script: str, *flags: str, timeout: float = 300) -> str:
  """A benchmark's stdout, on the process's one CPU device."""
  env = dict(os.environ, NO_GCE_CHECK='true')
  env.pop('XLA_FLAGS', None)
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'benchmarks', script), *flags],
      capture_output=True, text=True, env=env, timeout=timeout, check=False,
      cwd=ROOT)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


@pytest.mark.slow
def test_speed_reports_the_loops_side_by_side_and_members_host_share():
  stdout = _run('speed.py', '--sizes=tiny', '--sections=main,members',
                '--members=1,2', '--members_size=tiny', '--repeats=1',
                '--steps=300', '--seconds=0.05', '--matmul_n=256')
  tables = [[[c.strip() for c in line.split('|')[1:-1]] for line in block]
            for block in _tables(stdout)]
  main = next(t for t in tables if t[0][0] == 'variant')
  members = next(t for t in tables if t[0][0] == 'members')
  rows = {row[0]: dict(zip(main[0], row)) for row in main[2:]}
  assert {'meshfit', 'meshfit, 1 step per call', 'jit', 'pmap'} <= set(rows)
  for row in rows.values():
    assert _number(row['steps/s']) > 0
    # examples/s is tiny's batch of 128 x steps/s.
    assert _number(row['examples/s']) == pytest.approx(
        128 * _number(row['steps/s']), rel=0.01)
  assert rows['jit']['x jit'] == '1.00x'
  assert members[0] == ['members', 'devices', 'steps', 'steps/s', 'median',
                        'model-examples/s', 'x 1 member', 'GFLOP/s',
                        'of peak', 'cores busy', 'host us/step',
                        'device us/step', 'host share', 'x jit loop']
  one, two = (dict(zip(members[0], row)) for row in members[2:])
  assert (one['members'], two['members']) == ('1', '2')
  assert one['x 1 member'] == '1.00x'
  assert _number(two['model-examples/s']) == pytest.approx(
      2 * 128 * _number(two['steps/s']), rel=0.01)
  for row in (one, two):
    assert _number(row['host us/step']) > 0
    assert _number(row['device us/step']) >= 0
    assert _number(row['x jit loop']) > 0
    assert 0 <= _number(row['host share']) <= 100


@pytest.mark.slow
def test_scale_prepares_a_table_with_one_and_two_processes(tmp_path):
  stdout = _run('scale.py', '--rows=30000', '--sections=prepare',
                f'--workroot={tmp_path}')
  (prepare,) = [[[c.strip() for c in line.split('|')[1:-1]]
                 for line in block] for block in _tables(stdout)]
  assert prepare[2][0] == '0.03M' and len(prepare) == 3
  for cell in prepare[2][1:]:
    assert float(cell) > 0
  assert len(os.listdir(tmp_path / '30000' / 'files')) == 9  # 8 + eval


@pytest.mark.slow
def test_gcs_storage_reads_and_prepares_on_both_sides():
  stdout = _run('gcs_storage.py', '--rows=20000', '--sections=read,prepare',
                '--repeats=1')
  (table,) = [[[c.strip() for c in line.split('|')[1:-1]] for line in block]
              for block in _tables(stdout)]
  assert table[0] == ['what', 'local disk', 'emulator', 'emulator/local']
  assert [row[0] for row in table[2:]] == [
      'prepare, gs files, rows/s', 'prepare, gs files and data_dir, rows/s',
      'Parquet table, rows/s', 'float32 blocks, rows/s']
  for row in table[2:]:
    assert all(_number(c) > 0 for c in row[1:])


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


@pytest.mark.slow
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
  # PLS (not in refs.json), 6 ratios, time.
  line = rows['line']
  assert line[0] == '60' and line[2:8] == ['0.5000', '1.000', '2.000',
                                           '0.2500', '4.000', '–']
  rmse = float(line[1])
  assert 0 < rmse < 0.5 * 3.6  # well under the test target's spread
  assert [float(r) for r in line[8:13]] == pytest.approx(
      [rmse / 0.5, rmse / 1.0, rmse / 2.0, rmse / 0.25, rmse / 4.0],
      abs=0.006)
  assert line[13] == '–'
  assert rows['twice'][1].startswith('exit 2: ')
  assert "column 'a' twice" in rows['twice'][1]
  assert rows['twice'][8:14] == ['–'] * 6
  assert rows['geometric mean (1 of 2 tables)'][8:14] == line[8:14]

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
                     'vs CatBoost', 'vs LightGBM', 'vs PLS']
  # Split 1 has no CatBoost, LightGBM or PLS interval: split 0's alone
  # count.
  assert rows[2:] == [['a', '1 / 1 / 0', '1 / 0 / 1', '1 / 1 / 0',
                       '1 / 0 / 0', '1 / 0 / 0', '1 / 0 / 0'],
                      ['splits in all', '1 / 1 / 0', '1 / 0 / 1',
                       '1 / 1 / 0', '1 / 0 / 0', '1 / 0 / 0', '1 / 0 / 0']]
  assert tables.interval_report({'b': results['b']}) == ''
