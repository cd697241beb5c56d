"""Joining a job: flags and schedulers' variables, log tags, leaving at once
after a failure, jobs that cannot be joined.

The multi-process runs themselves are in test_multihost.py and test_slurm.py.
"""

import logging as std_logging
import os
import subprocess
import sys
import time

import pytest
from absl import logging

from meshfit.errors import UsageError
from meshfit.parallel import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The variables by which jax finds a scheduler's job: a test sets its own.
SCHEDULER_VARIABLES = (
    'SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_NTASKS', 'SLURM_PROCID',
    'SLURM_LOCALID', 'OMPI_MCA_orte_hnp_uri', 'OMPI_COMM_WORLD_SIZE',
    'OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_LOCAL_RANK',
    'KUBERNETES_SERVICE_HOST', 'TPU_WORKER_HOSTNAMES',
    'TPU_PROCESS_ADDRESSES', 'TPU_WORKER_ID', 'JAX_COORDINATOR_PORT')


@pytest.fixture
def no_scheduler(monkeypatch):
  """This process as if no scheduler had started it."""
  for name in SCHEDULER_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  return monkeypatch


@pytest.fixture
def slurm_task(no_scheduler):
  """Task 1 of 2 of SLURM job 4242, as srun describes it."""
  for name, value in (('SLURM_JOB_ID', '4242'),
                      ('SLURM_STEP_NODELIST', 'node[007-008],gpu3'),
                      ('SLURM_NTASKS', '2'), ('SLURM_PROCID', '1'),
                      ('SLURM_LOCALID', '0')):
    no_scheduler.setenv(name, value)
  return no_scheduler


def _options(**changes) -> distributed.Options:
  values = dict(coordinator_address='127.0.0.1:1234', num_processes=2,
                process_id=1, heartbeat_timeout_seconds=100,
                shutdown_timeout_seconds=300,
                initialization_timeout_seconds=300)
  values.update(changes)
  return distributed.Options(**values)


@pytest.mark.parametrize('changes', [
    {}, {'process_id': 0}, {'num_processes': 1, 'process_id': 0},
    {'coordinator_address': '[::1]:8476'},
    {'coordinator_address': 'host-0.pod.internal:65535'},
    {'coordinator_address': None, 'num_processes': None, 'process_id': None},
])
def test_good_options_pass(changes):
  distributed.validate(_options(**changes))


@pytest.mark.parametrize('changes, message', [
    ({'process_id': None}, '--process_id missing'),
    ({'coordinator_address': None}, '--coordinator_address missing'),
    ({'num_processes': None, 'process_id': None},
     '--num_processes, --process_id missing'),
])
def test_incomplete_flags_without_a_scheduler_are_usage_errors(
    no_scheduler, changes, message):
  with pytest.raises(UsageError, match=message):
    distributed.resolve(_options(**changes))


@pytest.mark.parametrize('changes, message', [
    ({'process_id': 2}, r'--process_id=2 must be in 0\.\.1'),
    ({'process_id': -1}, r'--process_id=-1 must be in 0\.\.1'),
    ({'num_processes': 0, 'process_id': 0}, '--num_processes=0 must be at '
     'least 1'),
    ({'coordinator_address': '127.0.0.1'}, 'must be HOST:PORT'),
    ({'coordinator_address': 'host:port'}, 'must be HOST:PORT'),
    ({'coordinator_address': 'host:70000'}, 'port 70000 must be in 1..65535'),
    ({'num_processes': None, 'process_id': -1}, '--process_id=-1 must be at '
     'least 0'),
    ({'coordinator_address': 'host:0'}, 'port 0 must be in 1..65535'),
    ({'heartbeat_timeout_seconds': 0}, '--heartbeat_timeout_seconds=0 must'),
    ({'shutdown_timeout_seconds': -5}, '--shutdown_timeout_seconds=-5 must'),
])
def test_bad_options_are_usage_errors(changes, message):
  with pytest.raises(UsageError, match=message):
    distributed.validate(_options(**changes))


def test_without_flags_or_a_scheduler_the_job_is_one_process(no_scheduler):
  # conftest.py already uses jax here: initialising would raise.
  assert distributed.find_scheduler() is None
  assert distributed.initialize(_options(
      coordinator_address=None, num_processes=None, process_id=None)) == (0, 1)


_NO_FLAGS = dict(coordinator_address=None, num_processes=None,
                 process_id=None)


def test_slurm_variables_describe_the_job(slurm_task):
  assert distributed.find_scheduler().__name__ == 'SlurmCluster'
  # jax's port: the job id folded into the top 4096 ports.
  assert distributed.resolve(_options(**_NO_FLAGS)) == distributed.Job(
      f'node007:{4242 % 4096 + 61440}', 2, 1, 'SLURM job 4242')


def test_open_mpi_variables_describe_the_job(no_scheduler):
  for name, value in (
      ('OMPI_MCA_orte_hnp_uri', '1531576320.0;tcp://10.96.0.1,10.0.0.2:34911'),
      ('OMPI_COMM_WORLD_SIZE', '4'), ('OMPI_COMM_WORLD_RANK', '3'),
      ('OMPI_COMM_WORLD_LOCAL_RANK', '1')):
    no_scheduler.setenv(name, value)
  port = 1531576320 // 4096 % 4096 + 61440
  assert distributed.resolve(_options(**_NO_FLAGS)) == distributed.Job(
      f'10.96.0.1:{port}', 4, 3, 'the Open MPI job')


def test_flags_override_the_scheduler(slurm_task):
  job = distributed.resolve(_options(
      coordinator_address='10.0.0.9:8476', num_processes=None,
      process_id=None))
  assert job == distributed.Job('10.0.0.9:8476', 2, 1, 'SLURM job 4242')
  slurm_task.setenv('JAX_COORDINATOR_PORT', '9999')  # as jax reads it
  assert distributed.resolve(_options(**_NO_FLAGS)).coordinator_address == (
      'node007:9999')
  assert distributed.resolve(_options(
      coordinator_address=None, num_processes=1, process_id=None)) is None
  assert distributed.resolve(_options()) == distributed.Job(
      '127.0.0.1:1234', 2, 1, 'the job of the flags')


def test_a_batch_script_without_srun_runs_alone_and_says_so(slurm_task,
                                                           absl_caplog):
  # What sbatch sets for the script itself: no step, so no node list.
  slurm_task.delenv('SLURM_STEP_NODELIST')
  slurm_task.setenv('SLURM_PROCID', '0')
  assert distributed.resolve(_options(**_NO_FLAGS)) is None
  assert ('SLURM job 4242 has 2 tasks, but this process was not started by '
          'srun: it runs alone.') in absl_caplog.text


def test_a_slurm_job_of_one_task_is_one_process(slurm_task):
  slurm_task.setenv('SLURM_NTASKS', '1')
  slurm_task.setenv('SLURM_PROCID', '0')
  assert distributed.resolve(_options(**_NO_FLAGS)) is None


def test_a_kubernetes_pod_of_no_job_is_one_process(no_scheduler):
  from jax._src.clusters import k8s_cluster  # noqa: PLC0415

  def no_job():
    raise KeyError('job-name')  # what jax meets in the pod's labels

  no_scheduler.setattr(k8s_cluster.K8sCluster, 'is_env_present',
                       classmethod(lambda cls: True))
  no_scheduler.setattr(k8s_cluster.K8sCluster, 'get_process_count', no_job)
  assert distributed.find_scheduler() is k8s_cluster.K8sCluster
  assert distributed.resolve(_options(**_NO_FLAGS)) is None


def test_a_scheduler_that_cannot_say_is_a_usage_error(slurm_task):
  slurm_task.setenv('SLURM_NTASKS', 'two')
  with pytest.raises(UsageError, match=r"^SLURM describes this process's "
                     r'job, but jax cannot read it: .*two'):
    distributed.resolve(_options(**_NO_FLAGS))


def test_a_rank_out_of_range_is_a_usage_error(slurm_task):
  slurm_task.setenv('SLURM_PROCID', '2')
  with pytest.raises(UsageError, match=r'SLURM job 4242 makes this process '
                     r'number 2 of 2 \(SLURM_PROCID=2, SLURM_NTASKS=2\), out '
                     r'of 0\.\.1'):
    distributed.resolve(_options(**_NO_FLAGS))


def test_log_lines_say_which_process_speaks(monkeypatch):
  handler = logging.get_absl_handler()
  monkeypatch.setattr(handler.python_handler, 'formatter',
                      handler.python_handler.formatter)
  distributed.tag_logs(3, 4)
  record = std_logging.LogRecord('x', std_logging.INFO, __file__, 1,
                                 'hello', None, None)
  line = handler.python_handler.formatter.format(record)
  assert line.startswith('[p3/4] ') and line.endswith('] hello')


def test_one_process_logs_are_left_alone(monkeypatch):
  handler = logging.get_absl_handler()
  before = handler.python_handler.formatter
  distributed.tag_logs(0, 1)
  assert handler.python_handler.formatter is before


class _Exited(Exception):
  pass


@pytest.fixture
def exits(monkeypatch) -> list[int]:
  """Statuses passed to os._exit, which raises instead of ending pytest."""
  statuses = []

  def fake_exit(status):
    statuses.append(status)
    raise _Exited

  monkeypatch.setattr(distributed.os, '_exit', fake_exit)
  return statuses


@pytest.mark.parametrize('error, status', [
    (RuntimeError('disk full'), 1), (KeyboardInterrupt(), 1),
    (SystemExit(2), 2), (SystemExit(143), 143)])
def test_a_failing_process_of_several_leaves_at_once(exits, error, status):
  with pytest.raises(_Exited):
    with distributed.exit_at_once_on_failure(2):
      raise error
  assert exits == [status]


def test_success_and_single_processes_exit_normally(exits):
  with pytest.raises(SystemExit):
    with distributed.exit_at_once_on_failure(2):
      sys.exit(0)
  with distributed.exit_at_once_on_failure(2):
    pass
  with pytest.raises(RuntimeError):
    with distributed.exit_at_once_on_failure(1):
      raise RuntimeError('one process: nobody waits for it')
  assert not exits


@pytest.mark.slow
@pytest.mark.parametrize('args, message', [
    (['--num_processes=2', '--process_id=0'], '--coordinator_address missing'),
    (['--coordinator_address=127.0.0.1:1234', '--num_processes=2',
      '--process_id=2'], '--process_id=2 must be in 0..1'),
    (['--coordinator_address=localhost', '--num_processes=2',
      '--process_id=0'], 'must be HOST:PORT'),
])
def test_bad_multihost_flags_exit_2_with_one_error_line(args, message,
                                                        tmp_path):
  proc = subprocess.run(
      [sys.executable, 'train.py', f'--workdir={tmp_path}/w', *args],
      cwd=ROOT, env=_without_scheduler(), capture_output=True, text=True,
      timeout=120)
  assert proc.returncode == 2, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and message in last, last
  assert 'Traceback' not in proc.stderr
  assert not os.path.exists(tmp_path / 'w')


def _without_scheduler(**variables: str) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if k not in SCHEDULER_VARIABLES}
  return {**env, **variables}


INIT_TIMEOUT_S = 3


@pytest.mark.slow
@pytest.mark.parametrize('process, message', [
    # Process 1 of a job whose process 0 never started.
    ('1', f'did not answer process 1 within '
     f'--initialization_timeout_seconds={INIT_TIMEOUT_S}'),
    # Process 0 of a job whose other process never started (a batch script
    # that runs train.py itself rather than through srun).
    ('0', f'process 1 of the 2 of SLURM job 4242 did not reach the '
     f'coordinator 127.0.0.1:{4242 % 4096 + 61440} within '
     f'--initialization_timeout_seconds={INIT_TIMEOUT_S}'),
    # SLURM's variables of another job, or edited by hand.
    ('5', 'SLURM job 4242 makes this process number 5 of 2'),
])
def test_a_job_that_cannot_be_joined_exits_2_in_time_writing_nothing(
    tmp_path, process, message):
  env = _without_scheduler(
      SLURM_JOB_ID='4242', SLURM_STEP_NODELIST='127.0.0.1', SLURM_NTASKS='2',
      SLURM_PROCID=process, SLURM_LOCALID='0')
  start = time.monotonic()
  proc = subprocess.run(
      [sys.executable, 'train.py', f'--workdir={tmp_path}/w',
       f'--initialization_timeout_seconds={INIT_TIMEOUT_S}'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  seconds = time.monotonic() - start
  assert proc.returncode == 2, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and message in last, last
  assert 'Traceback' not in proc.stderr and 'Check failure' not in (
      proc.stderr)
  assert not os.path.exists(tmp_path / 'w')
  # Python and jax's imports take seconds of their own before the wait.
  assert seconds < INIT_TIMEOUT_S + 30, seconds
