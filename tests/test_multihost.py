"""One job across processes: train.py launched N times on 127.0.0.1 (gloo).

Each process gets its own virtual CPU devices, as each host of a pod has its
own chips. Launching is slow (every process imports TensorFlow), so each
job runs once per module and several tests read it.
"""

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from cli_helpers import free_port, override
from meshfit.configs import default
from meshfit.report import writers
from meshfit.train import loop

# Every test here trains (or runs train.py): left out of `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB_TIMEOUT_S = 300
RTOL = 1e-5

# The run every topology must reproduce: an ensemble of two, one member per
# host of a 2-process job (members x data x model = 2 x 2 x 2). A constant
# learning rate does not depend on num_train_steps, so a run given fewer
# steps is the same run stopped early.
OVERRIDES = {
    'num_train_steps': 40,
    'model.hidden_sizes': (32, 32),
    'model.ensemble_size': 2,
    'mesh.members': 2,
    'optimizer.schedule': 'constant',
    'batch_size': 64,
    'eval_batch_size': 256,
    'log_every_steps': 10,
    'eval_every_steps': 20,
    'checkpoint_every_steps': 10,
    'mesh.model': 2,
}


def _flags(data_dir: str, **changes) -> list[str]:
  values = {**OVERRIDES, 'dataset.data_dir': data_dir, **changes}
  return [f'--config.{k}={v}' for k, v in values.items()]


@contextlib.contextmanager
def _sigint_deliverable():
  """Lets children turn SIGINT into KeyboardInterrupt, as Ctrl-C would.

  A pytest started as a background job ignores SIGINT, and children inherit
  an ignored signal; one with a handler is reset to the default at exec.
  """
  if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
    yield
    return
  signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# A scheduler's variables for process i of n (its coordinator on `port`),
# in place of the coordinator flags.
Scheduler = Callable[[int, int, int], dict[str, str]]


def slurm_variables(i: int, n: int, port: int) -> dict[str, str]:
  """What srun sets for task i of n on this host (jax takes the port from
  the job id)."""
  return {'SLURM_JOB_ID': str(port - 61440 + 4096),
          'SLURM_STEP_NODELIST': '127.0.0.1', 'SLURM_NTASKS': str(n),
          'SLURM_PROCID': str(i), 'SLURM_LOCALID': str(i)}


def open_mpi_variables(i: int, n: int, port: int) -> dict[str, str]:
  """What Open MPI's mpirun sets for rank i of n (jax takes the port from
  the job id in the launcher's URI)."""
  job_id = (port - 61440 + 4096) * 4096
  return {'OMPI_MCA_orte_hnp_uri': f'{job_id}.0;tcp://127.0.0.1:36012',
          'OMPI_COMM_WORLD_SIZE': str(n), 'OMPI_COMM_WORLD_RANK': str(i),
          'OMPI_COMM_WORLD_LOCAL_RANK': str(i)}


class Job:
  """N train.py processes joined through a coordinator on a free port,
  given by the flags or by a scheduler's variables."""

  def __init__(self, logdir: str, num_processes: int,
               devices_per_process: int, args: list[str],
               scheduler: Scheduler | None = None):
    os.makedirs(logdir, exist_ok=True)
    port = free_port() if scheduler is None else free_port(61440, 65536)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(('SLURM_', 'OMPI_'))}
    env['XLA_FLAGS'] = ('--xla_force_host_platform_device_count='
                        f'{devices_per_process}')
    self.logs = [os.path.join(logdir, f'p{i}.log')
                 for i in range(num_processes)]
    self.procs = []
    with _sigint_deliverable():
      for i, log in enumerate(self.logs):
        if scheduler is None:
          join, variables = [f'--coordinator_address=127.0.0.1:{port}',
                             f'--num_processes={num_processes}',
                             f'--process_id={i}'], {}
        else:
          join, variables = [], scheduler(i, num_processes, port)
        with open(log, 'w', encoding='utf-8') as f:
          self.procs.append(subprocess.Popen(
              [sys.executable, 'train.py', *args, *join],
              cwd=ROOT, env={**env, **variables}, stdout=f,
              stderr=subprocess.STDOUT))

  def log(self, i: int) -> str:
    with open(self.logs[i], encoding='utf-8') as f:
      return f.read()

  def wait(self, timeout: float = JOB_TIMEOUT_S) -> list[int]:
    """Every process's exit status; kills them all after `timeout`."""
    deadline = time.monotonic() + timeout
    try:
      return [p.wait(timeout=max(deadline - time.monotonic(), 0))
              for p in self.procs]
    except subprocess.TimeoutExpired:
      self.kill()
      pytest.fail(f'job still running after {timeout} s\n{self.tails()}')

  def check(self) -> None:
    codes = self.wait()
    assert codes == [0] * len(codes), self.tails()

  def kill(self) -> None:
    for p in self.procs:
      if p.poll() is None:
        p.kill()
        p.wait()

  def tails(self, chars: int = 3000) -> str:
    return '\n'.join(f'--- process {i} ---\n{self.log(i)[-chars:]}'
                     for i in range(len(self.procs)))


def _run_job(tmp_path_factory, name, num_processes, devices_per_process,
             args) -> Job:
  job = Job(str(tmp_path_factory.mktemp(name)), num_processes,
            devices_per_process, args)
  job.check()
  return job


def _one_process(args: list[str], devices: int) -> subprocess.CompletedProcess:
  env = dict(os.environ,
             XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}')
  proc = subprocess.run([sys.executable, 'train.py', *args], cwd=ROOT,
                        env=env, capture_output=True, text=True,
                        timeout=JOB_TIMEOUT_S)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def _train_in_process(data_dir: str, workdir: str, **changes) -> None:
  """1 process x 8 devices: the pytest process itself (conftest.py)."""
  config = default.get_config()
  override(config, {**OVERRIDES, 'dataset.data_dir': data_dir, **changes})
  loop.train_and_evaluate(config, workdir)


def _scalars(workdir: str, name: str) -> dict[int, float]:
  records = writers.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  steps = [r['step'] for r in records if name in r]
  assert len(steps) == len(set(steps)), f'{name} logged twice: {steps}'
  return {r['step']: r[name] for r in records if name in r}


def _assert_close(got: dict[int, float], expected: dict[int, float]) -> None:
  assert got.keys() == expected.keys()
  for step, value in expected.items():
    assert got[step] == pytest.approx(value, rel=RTOL), f'step {step}'


def _assert_same_run(workdir: str, reference: str) -> None:
  """Every logged loss and every evaluation of `reference` match."""
  _assert_close(_scalars(workdir, 'train/loss'),
                _scalars(reference, 'train/loss'))
  expected = _scalars(reference, 'eval/rmse')
  # A stopped phase also evaluated where it stopped; the reference did not.
  got = _scalars(workdir, 'eval/rmse')
  assert got.keys() >= expected.keys()
  _assert_close({step: got[step] for step in expected}, expected)


@pytest.fixture(scope='module')
def reference(tmp_path_factory, data_dir) -> str:
  """40 steps on 1 process x 8 devices: the run that never changes."""
  workdir = str(tmp_path_factory.mktemp('ref_1x8'))
  _train_in_process(data_dir, workdir)
  return workdir


@pytest.fixture(scope='module')
def run_2x4(tmp_path_factory, data_dir) -> tuple[str, Job]:
  """The same 40 steps on 2 processes x 4 devices."""
  workdir = str(tmp_path_factory.mktemp('run_2x4') / 'run')
  job = _run_job(tmp_path_factory, 'logs_2x4', 2, 4,
                 [f'--workdir={workdir}', *_flags(data_dir)])
  return workdir, job


def test_2x4_logs_the_losses_of_1x8(run_2x4, reference):
  workdir, _ = run_2x4
  losses = _scalars(workdir, 'train/loss')
  assert sorted(losses) == [10, 20, 30, 40]
  _assert_close(losses, _scalars(reference, 'train/loss'))
  _assert_close(_scalars(workdir, 'eval/rmse'),
                _scalars(reference, 'eval/rmse'))


SCHEDULERS = {'SLURM job ': slurm_variables,
              'the Open MPI job': open_mpi_variables}


@pytest.fixture(scope='module')
def scheduled(tmp_path_factory, data_dir) -> dict[str, tuple[str, Job]]:
  """20 steps on 2 x 4 processes joined by a scheduler's variables alone,
  as srun and mpirun set them (no coordinator flags): for each, the workdir
  and the job. Both run at once to halve the launch time."""
  jobs = {}
  for found, scheduler in SCHEDULERS.items():
    workdir = str(tmp_path_factory.mktemp('scheduled') / 'run')
    jobs[found] = workdir, Job(
        str(tmp_path_factory.mktemp('logs_scheduled')), 2, 4,
        [f'--workdir={workdir}', *_flags(data_dir, num_train_steps=20)],
        scheduler)
  for _, job in jobs.values():
    job.check()
  return jobs


@pytest.mark.parametrize('found', SCHEDULERS)
def test_a_schedulers_variables_alone_join_2x4_as_1x8_runs(
    scheduled, reference, found):
  workdir, job = scheduled[found]
  for i in range(2):
    assert f'[p{i}/2] I' in job.log(i) and (
        f'] Joined {found}') in job.log(i), job.tails()
    assert f' as process {i} of 2 (coordinator 127.0.0.1:' in job.log(i)
  losses = _scalars(workdir, 'train/loss')
  assert sorted(losses) == [10, 20]
  _assert_close(losses, {step: loss for step, loss in _scalars(
      reference, 'train/loss').items() if step <= 20})


def test_only_process_0_writes_and_reports(run_2x4):
  workdir, job = run_2x4
  # Each scalar once (_scalars checks), one TensorBoard file, one config.
  _scalars(workdir, 'train/loss')
  events = [f for f in os.listdir(workdir) if 'tfevents' in f]
  assert len(events) == 1, events
  assert os.path.exists(os.path.join(workdir, 'config.json'))
  # Process 0 reports: its lines say who speaks, its progress display gives
  # a line per evaluation; without --verbose, nothing per log step and
  # nothing from process 1 but the line saying it joined, warnings and
  # errors.
  report = job.log(0)
  assert '[p0/2] I' in report and '[p1/2] ' not in report
  assert 'Done: ' in report and 'train/loss=' not in report
  assert [line.split()[1] for line in report.splitlines()
          if line.startswith('step ')] == ['20/40', '40/40']
  other = job.log(1)
  said = [line for line in other.splitlines() if line.startswith('[p1/2] I')]
  assert len(said) == 1 and '] Joined the job of the flags as process 1 of ' \
      '2 (coordinator 127.0.0.1:' in said[0], job.tails()
  assert 'Done: ' not in other, job.tails()
  assert not [line for line in other.splitlines() if line.startswith('step')]


def test_verbose_processes_log_every_step_and_say_who_they_are(dead_peers):
  job, _ = dead_peers['killed']  # run with --verbose
  for i in range(2):
    log = job.log(i)
    assert f'[p{i}/2] I' in log and f'[p{1 - i}/2] ' not in log
    assert '] [20] train/' in log  # process 1's on the console only


def test_2x4_checkpoint_evaluates_the_same_on_one_device(run_2x4):
  workdir, _ = run_2x4
  trained = _scalars(workdir, 'eval/rmse')[40]
  proc = _one_process(['--mode=eval', f'--workdir={workdir}'], devices=1)
  result = json.loads(proc.stdout[proc.stdout.index('{'):])
  assert result['step'] == 40 and result['num_examples'] == 10_000
  assert result['rmse'] == pytest.approx(trained, rel=RTOL)


def test_checkpoints_by_the_clock_are_taken_alike_by_every_process(
    tmp_path_factory, data_dir, reference):
  """Process 0's clock decides: every process saves the same steps (a
  disagreement would leave a save half done and the job stuck)."""
  workdir = str(tmp_path_factory.mktemp('clock_2x4') / 'run')
  _run_job(tmp_path_factory, 'logs_clock_2x4', 2, 4,
           [f'--workdir={workdir}', '--config.steps_per_call=1',
            '--config.max_checkpoints_to_keep=100',
            *_flags(data_dir, checkpoint_every_steps=0,
                    checkpoint_every_seconds=0.05)])
  steps = sorted(int(s) for s in os.listdir(os.path.join(workdir,
                                                         'checkpoints')))
  assert steps[-1] == 40 and len(steps) >= 3, steps
  _assert_same_run(workdir, reference)  # checkpoints change nothing


@pytest.fixture(scope='module')
def resumed_4x2(tmp_path_factory, data_dir, run_2x4) -> str:
  """The 2 x 4 run stopped after step 20, continued to 30 on 4 x 2.

  Removing the checkpoints after step 20 leaves the workdir as if the run
  had been stopped there (the metrics it logged later are cut on resume).
  """
  workdir = str(tmp_path_factory.mktemp('moved') / 'run')
  shutil.copytree(run_2x4[0], workdir)
  for step in ('30', '40'):
    shutil.rmtree(os.path.join(workdir, 'checkpoints', step))
  _run_job(tmp_path_factory, 'logs_4x2', 4, 2,
           [f'--workdir={workdir}', *_flags(data_dir, num_train_steps=30)])
  assert sorted(_scalars(workdir, 'train/loss')) == [10, 20, 30]
  return workdir


def test_2x4_then_4x2_then_1x8_ends_as_the_unchanged_run(
    resumed_4x2, reference, data_dir, tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(resumed_4x2, workdir)
  _train_in_process(data_dir, workdir)
  _assert_same_run(workdir, reference)


def test_2x4_then_4x2_then_1x1_ends_as_the_unchanged_run(
    resumed_4x2, reference, data_dir, tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(resumed_4x2, workdir)
  _one_process([f'--workdir={workdir}',
                *_flags(data_dir, **{'mesh.model': 1, 'mesh.members': 1})],
               devices=1)
  _assert_same_run(workdir, reference)


# A dead peer. The documented bound (README.md, "Preemption, resuming and
# several hosts"): the others exit within --heartbeat_timeout_seconds plus a
# few seconds.
HEARTBEAT_TIMEOUT_S = 10
EXIT_BOUND_S = HEARTBEAT_TIMEOUT_S + 5


@pytest.fixture(scope='module')
def dead_peers(tmp_path_factory,
               data_dir) -> dict[str, tuple[Job, list[float | None]]]:
  """Two 2-process jobs whose process 1 is killed, or fails, mid-training.

  Both run at once to halve the launch time. Returns, for each, the job and
  the seconds from the signal to each process's exit (None: still running
  after three times the bound, then killed).
  """
  signals = {'killed': signal.SIGKILL, 'failed': signal.SIGINT}
  jobs = {}
  for name in signals:
    workdir = str(tmp_path_factory.mktemp(f'dead_{name}') / 'run')
    jobs[name] = Job(
        str(tmp_path_factory.mktemp(f'logs_dead_{name}')), 2, 4,
        [f'--workdir={workdir}', '--verbose',  # every process logs its steps
         f'--heartbeat_timeout_seconds={HEARTBEAT_TIMEOUT_S}',
         *_flags(data_dir, num_train_steps=1_000_000,
                 eval_every_steps=1_000_000,
                 checkpoint_every_steps=1_000_000)])
  procs = [p for job in jobs.values() for p in job.procs]
  try:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not all('] [20] train/' in job.log(i)
                  for job in jobs.values() for i in range(2)):
      if (time.monotonic() > deadline
          or any(p.poll() is not None for p in procs)):
        pytest.fail('jobs did not reach step 20:\n' + '\n'.join(
            job.tails() for job in jobs.values()))
      time.sleep(0.5)
    for name, job in jobs.items():
      job.procs[1].send_signal(signals[name])
    start = time.monotonic()
    exited = {}
    # Polled past the bound, so that a slow exit is measured, not cut short.
    while len(exited) < len(procs) and (
        time.monotonic() - start < 3 * EXIT_BOUND_S):
      for p in procs:
        if p not in exited and p.poll() is not None:
          exited[p] = time.monotonic() - start
      time.sleep(0.1)
    return {name: (job, [exited.get(p) for p in job.procs])
            for name, job in jobs.items()}
  finally:
    for job in jobs.values():
      job.kill()


def test_a_killed_process_stops_the_other_within_the_bound(dead_peers):
  job, seconds = dead_peers['killed']
  assert seconds[0] is not None and seconds[0] <= EXIT_BOUND_S, (
      seconds, job.tails())
  assert job.procs[0].returncode != 0
  # Either the coordination service saw its heartbeats stop, or (sooner) a
  # collective in flight failed on the dead peer's closed connection.
  log = job.log(0)
  assert ('stopped sending heartbeats' in log or
          'gloo/transport/tcp' in log), job.tails()


def test_a_failing_process_leaves_at_once_and_the_other_follows(dead_peers):
  job, seconds = dead_peers['failed']
  # Without leaving at once, the failed process would wait at jax's shutdown
  # barrier (300 s) for a peer stuck in a collective.
  assert job.procs[1].returncode == 1, job.tails()
  assert 'KeyboardInterrupt' in job.log(1)
  assert seconds[1] is not None and seconds[1] <= EXIT_BOUND_S, seconds
  assert seconds[0] is not None and seconds[0] <= EXIT_BOUND_S, (
      seconds, job.tails())
  assert job.procs[0].returncode != 0


def test_sigterm_to_one_host_stops_every_host_at_the_same_saved_step(
    tmp_path_factory, data_dir):
  """A maintenance event on one host: the job saves one step and exits 143."""
  workdir = str(tmp_path_factory.mktemp('preempted') / 'run')
  args = [f'--workdir={workdir}',
          *_flags(data_dir, num_train_steps=1_000_000,
                  checkpoint_every_steps=1_000_000, log_every_steps=5)]
  job = Job(os.path.join(workdir + '_logs'), 2, 4, args)
  deadline = time.monotonic() + JOB_TIMEOUT_S
  logged = os.path.join(workdir, 'metrics.jsonl')
  while not (os.path.exists(logged) and _scalars(workdir, 'train/loss')):
    assert time.monotonic() < deadline and all(
        p.poll() is None for p in job.procs), job.tails()
    time.sleep(0.1)
  job.procs[1].send_signal(signal.SIGTERM)
  codes = job.wait(timeout=60)
  assert codes == [143, 143], job.tails()
  saved = os.listdir(os.path.join(workdir, 'checkpoints'))
  assert len(saved) == 1, saved  # one step, saved by both hosts together
  step = int(saved[0])
  assert f'checkpoint of step {step}' in job.log(0)
  assert f'checkpoint of step {step}' in job.log(1)


# A table larger than resident_table_mb (0 here), in four Parquet files:
# each of 2 processes prepares two of them and reads only its lanes' blocks.


@pytest.fixture(scope='module')
def parquet_table(tmp_path_factory) -> dict[str, object]:
  import numpy as np  # noqa: PLC0415
  import pandas as pd  # noqa: PLC0415
  root = tmp_path_factory.mktemp('parquet')
  rng = np.random.default_rng(0)
  x = rng.normal(size=(24_000, 4))
  frame = pd.DataFrame({f'x{i}': x[:, i] for i in range(4)})
  frame['y'] = np.sin(x[:, 0]) + x[:, 1] * x[:, 2]
  for i, rows in enumerate(np.array_split(np.arange(len(frame)), 4)):
    frame.iloc[rows].to_parquet(root / f'train-{i}.parquet', index=False)
  frame.iloc[:2000].to_parquet(root / 'eval.parquet', index=False)
  return {'dataset.name': 'csv_regression',
          'dataset.train_path': f'{root}/train-*.parquet',
          'dataset.eval_path': f'{root}/eval.parquet',
          'dataset.target_columns': ('y',),
          'dataset.validation': 0.1,
          # Fitted by every process, broadcast from process 0.
          'model.ridge_blend': True}


def test_a_streamed_table_trains_on_2x4_as_on_1x8_and_as_resident(
    tmp_path_factory, parquet_table):
  """2 x 4 streamed from disk (each process preparing and reading its
  share) logs the losses of 1 x 8 streamed; 2 x 4 resident (each process's
  devices making their own batches' rows) logs those of 1 x 8 resident. The
  two orders differ (blocks read from disk, rows of a table in memory) and
  train alike."""
  runs, jobs = {}, {}
  try:
    for name, processes, mb in (('2x4', 2, 0), ('2x4_resident', 2, 1024),
                                ('1x8', 1, 0), ('1x8_resident', 1, 1024)):
      runs[name] = str(tmp_path_factory.mktemp(f'streamed_{name}') / 'run')
      data_dir = str(tmp_path_factory.mktemp('streamed_data'))  # its own
      # Members on one 'members' shard: the processes split every batch.
      changes = {**parquet_table, 'mesh.members': 1,
                 'dataset.resident_table_mb': mb}
      if processes == 1:  # the pytest process, as `reference` is
        _train_in_process(data_dir, runs[name], **changes)
      else:  # the jobs run meanwhile, to overlap their launches
        jobs[name] = Job(
            str(tmp_path_factory.mktemp(f'logs_streamed_{name}')),
            processes, 4, [f'--workdir={runs[name]}',
                           *_flags(data_dir, **changes),
                           '--verbose'])  # process 1's INFO too
    for name, job in jobs.items():
      job.check()
      assert ('streamed from the host' in job.log(1)) == (name == '2x4')
  finally:
    for job in jobs.values():
      job.kill()
  streamed = _scalars(runs['1x8'], 'train/loss')
  assert sorted(streamed) == [10, 20, 30, 40]
  _assert_close(_scalars(runs['2x4'], 'train/loss'), streamed)
  _assert_close(_scalars(runs['2x4'], 'val/loss'),
                _scalars(runs['1x8'], 'val/loss'))
  for name in ('train/loss', 'val/loss', 'eval/rmse'):
    _assert_close(_scalars(runs['2x4_resident'], name),
                  _scalars(runs['1x8_resident'], name))
  assert (_scalars(runs['1x8_resident'], 'train/loss')
          != _scalars(runs['1x8'], 'train/loss'))
  resident, streamed = (list(_scalars(runs[name], 'eval/rmse').values())[-1]
                        for name in ('1x8_resident', '1x8'))
  assert resident == pytest.approx(streamed, rel=0.2)
