"""Joining a job: flag checks, log tags, leaving at once after a failure.

The multi-process runs themselves are in test_multihost.py.
"""

import logging as std_logging
import os
import subprocess
import sys

import pytest
from absl import logging

from meshfit.errors import UsageError
from meshfit.parallel import distributed

# Every test here trains (or runs train.py): left out of `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    ({'process_id': 2}, r'--process_id=2 must be in 0\.\.1'),
    ({'process_id': -1}, r'--process_id=-1 must be in 0\.\.1'),
    ({'num_processes': 0, 'process_id': 0}, '--num_processes=0 must be at '
     'least 1'),
    ({'coordinator_address': '127.0.0.1'}, 'must be HOST:PORT'),
    ({'coordinator_address': 'host:port'}, 'must be HOST:PORT'),
    ({'coordinator_address': 'host:70000'}, 'port 70000 must be in 1..65535'),
    ({'coordinator_address': 'host:0'}, 'port 0 must be in 1..65535'),
    ({'heartbeat_timeout_seconds': 0}, '--heartbeat_timeout_seconds=0 must'),
    ({'shutdown_timeout_seconds': -5}, '--shutdown_timeout_seconds=-5 must'),
])
def test_bad_options_are_usage_errors(changes, message):
  with pytest.raises(UsageError, match=message):
    distributed.validate(_options(**changes))


def test_without_flags_off_a_tpu_vm_the_job_is_one_process():
  # conftest.py already uses jax here: initialising would raise.
  assert not distributed.tpu_environment_present()
  assert distributed.initialize(_options(
      coordinator_address=None, num_processes=None, process_id=None)) == (0, 1)


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
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and message in last, last
  assert 'Traceback' not in proc.stderr
  assert not os.path.exists(tmp_path / 'w')
