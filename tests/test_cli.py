"""train.py as users run it: exit codes, error lines, eval mode, devices."""

import json
import os
import subprocess
import sys

import pytest

from cli_helpers import ROOT, run_train

# Every test here trains (or runs train.py): left out of `make test-fast`.
pytestmark = pytest.mark.slow

run = run_train


def assert_usage_error(proc, message):
  assert proc.returncode == 2, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and message in last, last
  assert 'Traceback' not in proc.stderr
  assert proc.stderr.count('error: ') == 1


@pytest.fixture(scope='module')
def run_42(tmp_path_factory, data_dir):
  """A short run trained by the CLI on a 4 x 2 mesh."""
  workdir = str(tmp_path_factory.mktemp('cli') / 'run')
  run('--config=configs/default.py', f'--workdir={workdir}',
      f'--config.dataset.data_dir={data_dir}', '--config.num_train_steps=60',
      "--config.model.hidden_sizes=(32, 32)", '--config.mesh.model=2',
      '--config.log_every_steps=20', '--config.checkpoint_every_steps=30',
      '--config.eval_every_steps=30', check=0)
  return workdir


def _eval_json(proc):
  return json.loads(proc.stdout[proc.stdout.index('{'):])


def test_eval_mode_prints_and_writes_the_result(run_42):
  proc = run('--mode=eval', f'--workdir={run_42}', check=0)
  result = _eval_json(proc)
  assert set(result) == {'step', 'split', 'num_examples', 'mse', 'rmse',
                         'mae', 'r2', 'targets'}
  assert result['targets']['y']['rmse'] == result['rmse']  # one target
  assert result['step'] == 60 and result['num_examples'] == 10_000
  with open(os.path.join(run_42, 'eval', 'step_60.json')) as f:
    assert json.load(f) == result


def test_a_4x2_checkpoint_evaluates_the_same_on_one_device_and_2x4(run_42):
  base = _eval_json(run('--mode=eval', f'--workdir={run_42}', '--step=30',
                        check=0))
  one = _eval_json(run('--mode=eval', f'--workdir={run_42}', '--step=30',
                       devices=1, check=0))
  other = _eval_json(run('--mode=eval', f'--workdir={run_42}', '--step=30',
                         '--config.mesh.data=2', '--config.mesh.model=4',
                         check=0))
  assert one['rmse'] == pytest.approx(base['rmse'], rel=1e-6)
  assert other['rmse'] == pytest.approx(base['rmse'], rel=1e-6)


def test_eval_refuses_to_change_the_model(run_42):
  proc = run('--mode=eval', f'--workdir={run_42}',
             '--config.model.hidden_sizes=(8,)')
  assert_usage_error(proc, 'cannot change model.hidden_sizes')


def test_eval_of_a_missing_step_lists_the_available_ones(run_42):
  assert_usage_error(run('--mode=eval', f'--workdir={run_42}', '--step=7'),
                     'no checkpoint of step 7')


def test_eval_of_an_empty_workdir(tmp_path):
  assert_usage_error(run('--mode=eval', f'--workdir={tmp_path}'),
                     'this workdir holds no run')


def test_bad_config_exits_2_and_leaves_the_workdir_alone(run_42):
  before = sorted(os.listdir(run_42)), sorted(
      os.listdir(os.path.join(run_42, 'checkpoints')))
  proc = run(f'--workdir={run_42}', '--config.batch_size=12')
  assert_usage_error(proc, "batch_size 12 is not divisible by the 8 devices "
                     "of mesh axis 'data'")
  assert (sorted(os.listdir(run_42)), sorted(
      os.listdir(os.path.join(run_42, 'checkpoints')))) == before


@pytest.mark.parametrize('args, message', [
    (['--config.no_such_key=1'], 'no_such_key'),
    (["--config.model.hiden_sizes=(8,)"], "unknown config key "
     "'model.hiden_sizes' in --config.model.hiden_sizes=(8,); did you mean "
     "'model.hidden_sizes'?"),
    (['--config.batch_size=abc'], 'batch_size'),
    (['--mode=fit'], 'mode'),
    (['--config=configs/missing.py'], 'configs/missing.py'),
    (['stray'], "unexpected arguments ['stray']"),
])
def test_bad_flags_exit_2_with_one_error_line(args, message, tmp_path):
  assert_usage_error(run(f'--workdir={tmp_path}/w', *args), message)
  assert not os.path.exists(tmp_path / 'w')


def test_a_diverging_run_exits_3_naming_the_step(data_dir, tmp_path):
  proc = run(f'--workdir={tmp_path}', f'--config.dataset.data_dir={data_dir}',
             '--config.optimizer.name=sgd', '--config.optimizer.schedule=constant',
             '--config.optimizer.learning_rate=1e4',
             '--config.checkpoint_every_steps=1', '--config.num_train_steps=50')
  assert proc.returncode == 3, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('error: loss is ') and 'at step ' in last
  assert 'the last good checkpoint is step ' in last
  assert 'Traceback' not in proc.stderr


def test_a_workdir_this_user_cannot_write_is_named(data_dir, tmp_path):
  # Root writes anywhere; without CAP_DAC_OVERRIDE it meets the mode bits
  # as any user would.
  workdir = tmp_path / 'read_only'
  workdir.mkdir()
  os.chmod(workdir, 0o555)
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=8')
  proc = subprocess.run(
      ['setpriv', '--inh-caps=-dac_override', '--bounding-set=-dac_override',
       sys.executable, 'train.py', f'--workdir={workdir}',
       f'--config.dataset.data_dir={data_dir}', '--config.num_train_steps=4',
       '--config.compilation_cache_dir='], cwd=ROOT, env=env,
      capture_output=True, text=True, timeout=300, check=False)
  assert_usage_error(proc, f'cannot write in workdir {workdir} (Permission '
                           'denied)')
  assert os.listdir(workdir) == []


def test_the_error_line_stays_last_while_another_thread_prints():
  # A thread printing tracebacks when the error is raised (Orbax's, reading
  # a damaged checkpoint) must not print after the error line.
  script = r'''
import sys, threading, time, train
def noise():
  while True:
    sys.stderr.write('Traceback (most recent call last):\n')  # a line a write
for _ in range(4):
  threading.Thread(target=noise, daemon=True).start()
time.sleep(0.05)
train._fail('the step is damaged; pick another with --step')
'''
  for _ in range(10):
    proc = subprocess.run([sys.executable, '-c', script], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        'error: the step is damaged; pick another with --step')
