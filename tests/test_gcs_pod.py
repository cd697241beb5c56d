"""A pod that shares no disk: every file of the job in one gs:// bucket.

Two train.py processes joined by jax.distributed (gloo), each with its own
empty local temporary directory and HOME, as the VMs of a TPU pod slice
are; the table, the prepared copy (data_dir) and the workdir live in a
bucket of the local GCS emulator. Both are SIGKILLed mid-run and started
again with fresh empty local directories (a recreated VM): the resumed run
must log what an unbroken run logs, bit for bit. A third process that has
only the gs:// workdir then evaluates and predicts (an export to gs://:
tests/test_gcs_runs.py).
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from cli_helpers import free_port

from meshfit import storage
from meshfit.report import writers

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 300


class _Pod:
  """Two train.py processes, each with local directories of its own."""

  def __init__(self, tmp_path, name: str, args: list[str]):
    port = free_port()
    self.procs, self.logs = [], []
    for i in range(2):
      home = tmp_path / f'{name}-vm{i}'
      home.mkdir()
      env = dict(os.environ, HOME=str(home), TMPDIR=str(home),
                 JAX_PLATFORMS='cpu',
                 XLA_FLAGS='--xla_force_host_platform_device_count=4')
      log = home / 'train.log'
      self.logs.append(log)
      with open(log, 'w', encoding='utf-8') as f:
        self.procs.append(subprocess.Popen(
            [sys.executable, 'train.py', *args,
             f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
             f'--process_id={i}'], cwd=ROOT, env=env, stdout=f,
            stderr=subprocess.STDOUT))

  def tails(self) -> str:
    return '\n'.join(f'--- process {i} ---\n{log.read_text()[-3000:]}'
                     for i, log in enumerate(self.logs))

  def wait(self) -> None:
    codes = [p.wait(timeout=TIMEOUT_S) for p in self.procs]
    assert codes == [0, 0], self.tails()

  def kill(self) -> None:
    for p in self.procs:
      p.kill()
      p.wait()


def _table(bucket_dir: str) -> list[str]:
  rng = np.random.default_rng(3)
  x = rng.normal(size=(3000, 4))
  frame = pd.DataFrame({f'x{i}': x[:, i] for i in range(4)})
  frame['kind'] = np.where(x[:, 3] > 0, 'up', 'down')
  # Values a few rows hold: the members count their vocabularies on every
  # process alike (model.category_member_min_count below).
  frame['shop'] = rng.choice(['a', 'b', 'c'], 3000)
  frame.loc[:7, 'shop'] = ['q0', 'q0', 'q1', 'q1', 'q1', 'q2', 'q2', 'q3']
  frame['y'] = np.sin(x[:, 0]) + x[:, 1] * x[:, 2]
  for i, rows in enumerate(np.array_split(np.arange(2500), 2)):
    with storage.open(f'{bucket_dir}/table/train-{i}.parquet', 'wb') as f:
      frame.iloc[rows].to_parquet(f, index=False)
  with storage.open(f'{bucket_dir}/table/eval.csv', 'w') as f:
    frame.iloc[2500:].to_csv(f, index=False)
  return ['--config.dataset.name=csv_regression',
          f'--config.dataset.train_path={bucket_dir}/table/train-*.parquet',
          f'--config.dataset.eval_path={bucket_dir}/table/eval.csv',
          f'--config.dataset.data_dir={bucket_dir}/data',
          "--config.dataset.target_columns=('y',)",
          '--config.dataset.validation=0.1',
          '--config.num_train_steps=300', '--config.model.hidden_sizes=(32,32)',
          '--config.model.ensemble_size=2', '--config.mesh.members=2',
          '--config.model.category_member_min_count=2',
          '--config.batch_size=64', '--config.log_every_steps=10',
          '--config.eval_every_steps=50', '--config.checkpoint_every_steps=50']


def _committed(workdir: str) -> list[int]:
  checkpoints = storage.join(workdir, 'checkpoints')
  if not storage.exists(checkpoints):
    return []
  return [int(s) for s in storage.listdir(checkpoints) if s.isdigit()
          and storage.exists(storage.join(checkpoints, s,
                                          'commit_success.txt'))]


def _series(workdir: str, key: str) -> dict[int, float]:
  return {r['step']: r[key] for r in writers.read_jsonl(
      storage.join(workdir, 'metrics.jsonl')) if key in r}


def test_a_pod_without_shared_disk_resumes_bit_for_bit_and_serves(
    gcs_dir, tmp_path):
  flags = _table(gcs_dir)
  # The unbroken run beside the broken one, to overlap their launches; it
  # prepares its own copy of the table (the same bytes), so that the two
  # pods never write one prepared copy at once.
  whole = storage.join(gcs_dir, 'whole')
  unbroken = _Pod(tmp_path, 'whole', [f'--workdir={whole}', *flags,
                                      f'--config.dataset.data_dir={gcs_dir}/'
                                      'whole_data'])
  try:
    broken = storage.join(gcs_dir, 'broken')
    pod = _Pod(tmp_path, 'first', [f'--workdir={broken}', *flags])
    deadline = time.monotonic() + TIMEOUT_S
    while not any(100 <= s < 300 for s in _committed(broken)):
      assert all(p.poll() is None for p in pod.procs), pod.tails()
      assert time.monotonic() < deadline, pod.tails()
      time.sleep(0.1)
    pod.kill()  # both VMs gone at once, local disks with them
    reached = max(_committed(broken))
    assert reached < 300
    resumed = _Pod(tmp_path, 'recreated', [f'--workdir={broken}', *flags])
    resumed.wait()
    unbroken.wait()
  finally:
    unbroken.kill()
  assert f'Resuming from the checkpoint of step {reached}' in (
      resumed.logs[0].read_text())
  for key in ('train/loss', 'val/loss', 'eval/rmse', 'eval/r2'):
    assert _series(broken, key) == _series(whole, key), key
  assert sorted(_series(broken, 'train/loss')) == list(range(10, 301, 10))

  # A third machine with only the workdir's URL.
  home = tmp_path / 'serving-vm'
  home.mkdir()
  env = dict(os.environ, HOME=str(home), TMPDIR=str(home),
             JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=1')

  def run(workdir: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, 'train.py', f'--workdir={workdir}',
                           *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout[proc.stdout.index('{'):])

  # The final evaluation, read back from the bucket alone, as the unbroken
  # run scored it (on 2 x 4 devices, not one: to float32's rounding).
  evaluated = run(broken, '--mode=eval')
  scored = [r for r in writers.read_jsonl(storage.join(whole, 'metrics.jsonl'))
            if 'eval/rmse' in r][-1]
  for key in ('mse', 'rmse', 'mae', 'r2'):
    assert evaluated[key] == pytest.approx(scored[f'eval/{key}'], rel=1e-6)
  predicted = run(broken, '--mode=predict',
                  f'--input={gcs_dir}/table/eval.csv',
                  f'--output={gcs_dir}/out/predictions.parquet')
  assert predicted['num_examples'] == 500
  with storage.open(f'{gcs_dir}/out/predictions.parquet', 'rb') as f:
    assert len(pd.read_parquet(f)) == 500
