"""What several test files share: running train.py as a user does, and
small tables."""

import os
import random
import socket
import subprocess
import sys

import numpy as np
import pandas as pd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port(lo: int | None = None, hi: int | None = None) -> int:
  """A port free on this host now: any the system gives, or one in
  [lo, hi) (SLURM's own ports, the range jax derives from a job id)."""
  if lo is None:
    with socket.socket() as s:
      s.bind(('127.0.0.1', 0))
      return s.getsockname()[1]
  for _ in range(200):
    port = random.randrange(lo, hi)
    with socket.socket() as s:
      try:
        s.bind(('', port))
      except OSError:
        continue
      return port
  raise RuntimeError(f'no free port in {lo}..{hi - 1}')


def run_train(*args: str, devices: int = 8,
              check: int | None = None) -> subprocess.CompletedProcess:
  """`python train.py ARGS` on `devices` virtual CPU devices, from the repo."""
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}')
  proc = subprocess.run([sys.executable, 'train.py', *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=300)
  if check is not None:
    assert proc.returncode == check, proc.stderr[-3000:]
  return proc


def saved_config(workdir: str):
  """The run's saved config as train.py's eval, predict and export modes read
  it, its mesh fitted to this process's devices: for in-process calls that
  assert what those modes do without a train.py start each."""
  import jax  # noqa: PLC0415  (this module imports no jax otherwise)

  from meshfit.config import json_files  # noqa: PLC0415
  config = json_files.load_json(os.path.join(workdir, 'config.json'))
  return json_files.fit_saved_mesh(config, jax.device_count(),
                                   jax.local_device_count())


def override(config, changes: dict) -> None:
  """Sets each dotted key of `changes` ('dataset.data_dir') in `config`."""
  for key, value in changes.items():
    *parents, leaf = key.split('.')
    node = config
    for p in parents:
      node = node[p]
    node[leaf] = value


def regression_frame(n: int, seed: int) -> pd.DataFrame:
  """y = 3 a - 2 b + 0.1 c and z = a b, with a text 'id' column."""
  rng = np.random.default_rng(seed)
  a, b, c = rng.normal(size=(3, n))
  return pd.DataFrame({'id': [f'r{seed}_{i}' for i in range(n)], 'a': a,
                       'b': b, 'c': c, 'y': 3 * a - 2 * b + 0.1 * c,
                       'z': a * b})


def small_frame(n: int = 5) -> pd.DataFrame:
  """An 'id' text column, numbers 'a' and 'b', and a target 'y'."""
  rng = np.random.default_rng(0)
  return pd.DataFrame({
      'id': [f'row{i}' for i in range(n)],
      'a': rng.normal(size=n),
      'b': np.arange(n),
      'y': rng.normal(size=n) * 100,
  })


def write_table(path, frame: pd.DataFrame) -> str:
  """Writes `frame` to `path` as Parquet (.parquet, .pq) or CSV."""
  if str(path).lower().endswith(('.parquet', '.pq')):
    frame.to_parquet(path, index=False)
  else:
    frame.to_csv(path, index=False)
  return str(path)
