"""meshfit under a real SLURM: examples/slurm/train.sbatch on a one-node
cluster of this machine (tests/slurm_cluster.py).

Its srun starts 2 tasks x 4 CPU devices that join through the variables
SLURM sets, with no coordinator flags. Two jobs run at once: one trains to
the end and must log the losses of 1 x 8; the other loses a task to SIGKILL
after its first checkpoint, must end within the heartbeat timeout, and the
same sbatch again must finish it as the first, bit for bit.
"""

import os
import signal
import sys
import time

import pytest

import slurm_cluster
from meshfit.configs import default
from meshfit.report import writers
from meshfit.train import loop

# Every test here trains (or runs train.py): left out of `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, 'examples', 'slurm', 'train.sbatch')
JOB_TIMEOUT_S = 300
RTOL = 1e-5
HEARTBEAT_TIMEOUT_S = 10
EXIT_BOUND_S = HEARTBEAT_TIMEOUT_S + 5

# Small and quick, but long enough after the first checkpoint that the task
# is killed mid-run. A constant learning rate keeps the 1 x 8 reference
# comparable step by step.
OVERRIDES = {
    'dataset.name': 'synthetic_regression/linear',
    'num_train_steps': 120,
    'model.hidden_sizes': (16,),
    'optimizer.schedule': 'constant',
    'batch_size': 64,
    'eval_batch_size': 1000,
    'log_every_steps': 10,
    'eval_every_steps': 60,
    'checkpoint_every_steps': 20,
}


def _flags(data_dir: str) -> list[str]:
  values = {**OVERRIDES, 'dataset.data_dir': data_dir}
  return [f'--config.{k}={v}' for k, v in values.items()]


def _scalars(workdir: str, name: str) -> dict[int, float]:
  records = writers.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  return {r['step']: r[name] for r in records if name in r}


class Batch:
  """One submission of examples/slurm/train.sbatch to the cluster."""

  def __init__(self, cluster: slurm_cluster.Cluster, log: str,
               args: list[str]):
    env = {k: v for k, v in cluster.env.items()
           if not k.startswith('SLURM_') or k == 'SLURM_CONF'}
    # Each task sees 4 CPU devices; `python` is this test's interpreter.
    env['XLA_FLAGS'] = '--xla_force_host_platform_device_count=4'
    env['PATH'] = f'{os.path.dirname(sys.executable)}:{env["PATH"]}'
    self.cluster, self.log = cluster, log
    # One node of 2 tasks in place of the script's 2 nodes of one.
    self.id = cluster.run(
        'sbatch', '--parsable', '--nodes=1', '--ntasks-per-node=2',
        f'--chdir={ROOT}', f'--output={log}', SCRIPT, *args,
        env=env).strip().split(';')[0]

  def state(self) -> dict[str, str]:
    return self.cluster.job(self.id)

  def done(self) -> bool:
    return self.state()['JobState'] not in ('PENDING', 'RUNNING',
                                            'CONFIGURING', 'COMPLETING')

  def wait(self, timeout: float = JOB_TIMEOUT_S) -> dict[str, str]:
    """The job's fields once it has ended."""
    deadline = time.monotonic() + timeout
    while not self.done():
      if time.monotonic() > deadline:
        self.cluster.run('scancel', self.id)
        pytest.fail(f'job {self.id} still running after {timeout} s\n'
                    f'{self.output()}')
      time.sleep(0.2)
    return self.state()

  def output(self) -> str:
    """What its tasks printed, each line led by its task id (`srun
    --label`)."""
    if not os.path.exists(self.log):
      return ''
    with open(self.log, encoding='utf-8', errors='replace') as f:
      return f.read()

  def task_output(self, task: int) -> str:
    prefix = f'{task}: '
    return '\n'.join(line[len(prefix):] for line in self.output().splitlines()
                     if line.lstrip().startswith(prefix.strip()))


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
  slurm_cluster.require()
  # Four CPUs whatever the host has: two 2-task jobs run at once.
  running = slurm_cluster.Cluster(str(tmp_path_factory.mktemp('slurm')),
                                  cpus=4)
  yield running
  running.run('scancel', '--user=root', check=False)
  running.stop()


@pytest.fixture(scope='module')
def reference(tmp_path_factory, data_dir) -> str:
  """The run on 1 process x 8 devices (this one)."""
  workdir = str(tmp_path_factory.mktemp('slurm_ref_1x8'))
  config = default.get_config()
  for key, value in {**OVERRIDES, 'dataset.data_dir': data_dir}.items():
    *parents, leaf = key.split('.')
    node = config
    for p in parents:
      node = node[p]
    node[leaf] = value
  loop.train_and_evaluate(config, workdir)
  return workdir


@pytest.fixture(scope='module')
def jobs(cluster, tmp_path_factory, data_dir) -> dict:
  """The whole job (`whole`), and the one killed (`killed`) then submitted
  again (`resumed`); with the seconds from the kill to the killed job's
  end."""
  root = tmp_path_factory.mktemp('slurm_runs')
  common = [f'--heartbeat_timeout_seconds={HEARTBEAT_TIMEOUT_S}',
            *_flags(data_dir)]
  whole_dir, killed_dir = str(root / 'whole'), str(root / 'killed')
  whole = Batch(cluster, str(root / 'whole.out'),
                [f'--workdir={whole_dir}', *common])
  killed_args = [f'--workdir={killed_dir}', *common]
  killed = Batch(cluster, str(root / 'killed.out'), killed_args)
  try:
    checkpoints = os.path.join(killed_dir, 'checkpoints')
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not (os.path.isdir(checkpoints) and any(
        name.isdigit() for name in os.listdir(checkpoints))):
      if time.monotonic() > deadline or killed.done():
        pytest.fail(f'no checkpoint before the job ended or {JOB_TIMEOUT_S} '
                    f's passed:\n{killed.output()[-5000:]}')
      time.sleep(0.1)
    os.kill(killed.cluster.task_pids(killed.id)[1], signal.SIGKILL)
    killed_at = time.monotonic()
    while not killed.done() and time.monotonic() - killed_at < 3 * (
        EXIT_BOUND_S):
      time.sleep(0.1)
    seconds = time.monotonic() - killed_at
    killed_state = killed.wait()
    whole_state = whole.wait()
    resumed = Batch(cluster, str(root / 'resumed.out'), killed_args)
    resumed_state = resumed.wait()
  finally:
    cluster.run('scancel', '--user=root', check=False)
  return {'whole': (whole, whole_state, whole_dir),
          'killed': (killed, killed_state, seconds),
          'resumed': (resumed, resumed_state, killed_dir)}


def test_srun_joins_2_tasks_that_log_the_losses_of_1x8(jobs, reference):
  batch, state, workdir = jobs['whole']
  assert (state['JobState'], state['ExitCode']) == ('COMPLETED', '0:0'), (
      batch.output()[-5000:])
  for task in range(2):
    assert (f'[p{task}/2] I' in batch.task_output(task) and
            f'] Joined SLURM job {batch.id} as process {task} of 2 '
            '(coordinator ') in batch.task_output(task), batch.output()[-5000:]
  for name in ('train/loss', 'eval/rmse'):
    got, expected = _scalars(workdir, name), _scalars(reference, name)
    assert got.keys() == expected.keys() and len(got) >= 2, name
    for step, value in expected.items():
      assert got[step] == pytest.approx(value, rel=RTOL), (name, step)


def test_a_killed_task_ends_the_job_within_the_heartbeat_timeout(jobs):
  batch, state, seconds = jobs['killed']
  assert state['JobState'] == 'FAILED', (state, batch.output()[-5000:])
  assert seconds <= EXIT_BOUND_S, (seconds, batch.output()[-5000:])
  assert ('stopped sending heartbeats' in batch.output() or
          'gloo/transport/tcp' in batch.output()), batch.output()[-5000:]


def test_the_same_sbatch_again_resumes_bit_for_bit(jobs):
  batch, state, workdir = jobs['resumed']
  assert (state['JobState'], state['ExitCode']) == ('COMPLETED', '0:0'), (
      batch.output()[-5000:])
  assert 'Resuming from the checkpoint of step ' in batch.task_output(0), (
      batch.output()[-5000:])
  whole = jobs['whole'][2]
  for name in ('train/loss', 'eval/rmse', 'eval/mae'):
    assert _scalars(workdir, name) == _scalars(whole, name), name
