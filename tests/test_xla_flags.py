"""The XLA flags that train.py starts its process with."""

import os
import subprocess
import sys

import pytest

from meshfit.parallel import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = '--xla_cpu_enable_concurrency_optimized_scheduler=false'


def test_apply_adds_meshfit_flags_after_the_users_once():
  env = {'XLA_FLAGS': '--xla_force_host_platform_device_count=8'}
  xla_flags.apply(env)
  xla_flags.apply(env)
  assert env['XLA_FLAGS'] == f'--xla_force_host_platform_device_count=8 {OURS}'
  empty = {}
  xla_flags.apply(empty)
  assert empty == {'XLA_FLAGS': OURS}


def test_a_flag_the_user_set_wins():
  env = {'XLA_FLAGS': '--xla_cpu_enable_concurrency_optimized_scheduler=true'}
  xla_flags.apply(env)
  assert env['XLA_FLAGS'] == (
      '--xla_cpu_enable_concurrency_optimized_scheduler=true')


@pytest.mark.slow
def test_train_py_sets_them_before_jax_starts_a_backend():
  # train.py's module body applies them; its jax then compiles under them.
  code = ('import os, sys; sys.argv = ["train.py"]; import train, jax; '
          'jax.devices(); print(os.environ["XLA_FLAGS"])')
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120,
                       check=True).stdout
  assert out.strip().splitlines()[-1] == OURS
