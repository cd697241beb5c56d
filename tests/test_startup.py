"""What a start imports: the slow imports are left to the runs that need them.

TensorFlow takes seconds to import, TFDS, pandas and matplotlib a fraction of
one each. They are needed to prepare a dataset, parse a split for the first
time, read a CSV file and draw a figure, and nothing else; a restart on
prepared data must not pay for them. Each check runs in a fresh interpreter.
"""

import json
import os
import subprocess
import sys

import pytest
from model_helpers import dataset_config
from cli_helpers import ROOT, regression_frame

from meshfit.configs import csv as csv_config
from meshfit.configs import default
from meshfit.data import splits as splits_lib

# Every test here trains (or runs train.py): left out of `make test-fast`.
pytestmark = pytest.mark.slow

SLOW_IMPORTS = ('tensorflow', 'tensorflow_datasets', 'pandas', 'matplotlib')


def _slow_imports_after(code: str) -> list[str]:
  """The modules of SLOW_IMPORTS that running `code` imports."""
  report = ('\nimport json, sys\n'
            f'print(json.dumps([m for m in {SLOW_IMPORTS!r} '
            'if m in sys.modules]))')
  proc = subprocess.run([sys.executable, '-c', code + report], cwd=ROOT,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'),
                        capture_output=True, text=True, timeout=300,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.splitlines()[-1])


def test_importing_the_pipeline_and_the_runtime_imports_none():
  assert _slow_imports_after(
      'import meshfit.input_pipeline.column_plan, meshfit.input_pipeline.csv_regression, '
      'meshfit.input_pipeline.order, meshfit.input_pipeline.tables, '
      'meshfit.checkpoints.checkpointer, meshfit.config.json_files, '
      'meshfit.serve.evaluate, meshfit.serve.export, meshfit.train.loop, '
      'meshfit.model.metrics, meshfit.report.plots, meshfit.serve.predict, '
      'meshfit.model.state, meshfit.model.steps, meshfit.report.writers'
  ) == []


def _load_twice(dataset, train_rows: int) -> list[str]:
  """Slow imports of a fresh process loading `dataset` after this one did."""
  splits_lib.load_splits(dataset_config(dataset), 0)  # prepares, parses
  return _slow_imports_after(
      'from meshfit.config import DatasetConfig\n'
      'from meshfit.data import splits as splits_lib\n'
      'splits = splits_lib.load_splits(DatasetConfig(**'
      f'{dataset.to_dict()!r}), 0)\n'
      f'assert splits.member_rows == {train_rows}')


def test_prepared_generated_dataset_loads_with_none(data_dir):
  dataset = default.get_config().dataset
  dataset.data_dir = data_dir
  assert _load_twice(dataset, train_rows=100_000) == []


def test_prepared_csv_dataset_loads_with_none(tmp_path):
  regression_frame(40, 0).to_csv(tmp_path / 'train.csv', index=False)
  regression_frame(10, 1).to_csv(tmp_path / 'eval.csv', index=False)
  dataset = csv_config.get_config().dataset
  dataset.data_dir = str(tmp_path / 'tfds')
  dataset.train_path = str(tmp_path / 'train.csv')
  dataset.eval_path = str(tmp_path / 'eval.csv')
  dataset.target_columns = ('y',)
  # configs/csv.py's members each hold a fold, a fifth of the 40 rows, out.
  assert _load_twice(dataset, train_rows=32) == []
