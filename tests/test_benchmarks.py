"""The speed benchmark's cheapest section runs and reports what meshfit uses."""

import os
import subprocess
import sys

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
