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
