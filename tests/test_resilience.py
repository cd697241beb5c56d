"""Preemption, crashes and damage: users must not be able to tell.

These tests drive real `train.py` processes: SIGKILL at random moments,
SIGTERM, truncated checkpoints, a second trainer, a diverging run.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from meshfit.report import writers

# Every test here trains (or runs train.py): left out of `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = int(os.environ.get('MESHFIT_TEST_SEED', random.randrange(1 << 30)))
STEPS = 200


def _args(workdir, data_dir, *extra):
  # ~90 steps/s on 8 virtual CPU devices: slow enough to be killed mid-run;
  # an evaluation mid-run and one at the end, each resumed across.
  return [sys.executable, 'train.py', f'--workdir={workdir}',
          f'--config.dataset.data_dir={data_dir}',
          f'--config.num_train_steps={STEPS}',
          '--config.model.hidden_sizes=(256,256)',
          '--config.batch_size=512', '--config.log_every_steps=10',
          '--config.checkpoint_every_steps=50',
          f'--config.eval_every_steps={STEPS // 2}', *extra]


def _start(args):
  return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _run(args, timeout=300):
  proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout)
  return proc


def _records(workdir):
  path = os.path.join(workdir, 'metrics.jsonl')
  return writers.read_jsonl(path) if os.path.exists(path) else []


def _last_step(workdir):
  try:
    steps = [r['step'] for r in _records(workdir) if 'train/loss' in r]
  except json.JSONDecodeError:  # a line being written
    return 0
  return max(steps, default=0)


def _wait_for_step(proc, workdir, step, timeout=120):
  deadline = time.monotonic() + timeout
  while _last_step(workdir) < step:
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    assert time.monotonic() < deadline, f'step {step} not reached'
    time.sleep(0.02)


def _series(workdir, key):
  return {r['step']: r[key] for r in _records(workdir) if key in r}


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory, data_dir):
  workdir = str(tmp_path_factory.mktemp('whole'))
  proc = _run(_args(workdir, data_dir))
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir


def test_three_sigkills_then_completion_match_exactly(uninterrupted, data_dir,
                                                      tmp_path):
  rng = random.Random(SEED)
  workdir = str(tmp_path)
  kill_steps = sorted(rng.sample(range(20, STEPS - 20, 10), 3))
  for target in kill_steps:
    proc = _start(_args(workdir, data_dir))
    _wait_for_step(proc, workdir, target)
    time.sleep(rng.uniform(0, 0.15))  # anywhere: a step, a log, a save
    proc.kill()
    proc.communicate()
  proc = _run(_args(workdir, data_dir))
  assert proc.returncode == 0, (SEED, proc.stderr[-3000:])
  for key in ('train/loss', 'eval/rmse', 'eval/r2'):
    assert _series(workdir, key) == _series(uninterrupted, key), (
        f'{key} differs after SIGKILLs at steps {kill_steps} '
        f'(MESHFIT_TEST_SEED={SEED})')
  assert sorted(_series(workdir, 'train/loss')) == list(
      range(10, STEPS + 1, 10))


def test_sigterm_saves_the_step_reached_and_resumes(uninterrupted, data_dir,
                                                    tmp_path):
  workdir = str(tmp_path)
  proc = _start(_args(workdir, data_dir))
  _wait_for_step(proc, workdir, 50)
  sent = time.monotonic()
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=60)
  assert proc.returncode == 143, stderr[-3000:]
  assert time.monotonic() - sent < 30
  saved = sorted(int(s) for s in os.listdir(os.path.join(workdir,
                                                         'checkpoints')))
  reached = saved[-1]
  assert reached >= 50 and 'Traceback' not in stderr
  assert f'checkpoint of step {reached}' in stderr
  assert not os.path.exists(os.path.join(workdir, 'lock'))

  rerun = _run(_args(workdir, data_dir))
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert f'Resuming from the checkpoint of step {reached}' in rerun.stderr
  assert _series(workdir, 'train/loss') == _series(uninterrupted, 'train/loss')


def test_truncated_newest_checkpoint_is_skipped_and_kept(uninterrupted,
                                                         data_dir, tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(uninterrupted, workdir)
  ckpts = os.path.join(workdir, 'checkpoints')
  # The final checkpoint and the periodic one before it.
  *_, previous, newest = sorted(int(s) for s in os.listdir(ckpts))
  assert (previous, newest) == (STEPS - 50, STEPS)
  for parent, _, files in os.walk(os.path.join(ckpts, str(STEPS))):
    for name in files:
      with open(os.path.join(parent, name), 'r+b') as f:
        f.truncate(os.path.getsize(f.name) // 2)

  proc = _run(_args(workdir, data_dir))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (f'Checkpoint of step {STEPS} is damaged and is skipped'
          in proc.stderr)
  assert f'Resuming from the checkpoint of step {previous}' in proc.stderr
  assert os.path.isdir(os.path.join(workdir, 'damaged_checkpoints',
                                    str(STEPS)))
  assert os.path.isdir(os.path.join(ckpts, str(STEPS)))  # written again
  assert _series(workdir, 'train/loss') == _series(uninterrupted, 'train/loss')
  assert _series(workdir, 'eval/rmse') == _series(uninterrupted, 'eval/rmse')


def test_a_second_trainer_is_refused_while_the_first_lives(data_dir,
                                                           tmp_path):
  workdir = str(tmp_path)
  long_run = ('--config.num_train_steps=1000000',
              '--config.optimizer.schedule=constant')
  first = _start(_args(workdir, data_dir, *long_run))
  _wait_for_step(first, workdir, 10)
  with open(os.path.join(workdir, 'lock')) as f:
    assert json.load(f)['pid'] == first.pid
  checkpoints = sorted(os.listdir(os.path.join(workdir, 'checkpoints')))

  second = _run(_args(workdir, data_dir, *long_run))
  assert second.returncode == 2, second.stderr[-2000:]
  last = second.stderr.strip().splitlines()[-1]
  assert last.startswith('error: workdir') and 'is in use by a training run' \
      in last and f'pid {first.pid}' in last
  assert 'Traceback' not in second.stderr
  assert first.poll() is None  # untouched by the refused one

  first.send_signal(signal.SIGTERM)
  _, stderr = first.communicate(timeout=60)
  assert first.returncode == 143, stderr[-3000:]
  assert set(checkpoints) <= set(os.listdir(os.path.join(workdir,
                                                          'checkpoints')))
