"""What train.py prints: a progress display a person reads, not a log.

Runs train.py as a user does, on a small table: its stdout through a pipe
(one plain line per evaluation) and on a terminal (`pty`: one line redrawn
in place); its stderr holds meshfit's report lines, not the libraries'.
"""

import fcntl
import os
import pathlib
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

from cli_helpers import ROOT, regression_frame, write_table
from meshfit.report import writers

# Every test here runs train.py: left out of `make test-fast`.
pytestmark = pytest.mark.slow

STEPS, EVAL_EVERY, LOG_EVERY = 40, 10, 5
# An INFO line of absl's format: `I1125 20:10:17.008362 1397... loop.py:122]`.
INFO = re.compile(r'^I\d{4} [\d:.]+ +\d+ ([^:\s]+):\d+\] ', re.MULTILINE)
OURS = {p.name for package in ('meshfit', 'input_pipeline', 'models',
                               'storage')
        for p in (pathlib.Path(ROOT) / package).rglob('*.py')} | {'train.py'}


@pytest.fixture(scope='module')
def tables(tmp_path_factory) -> str:
  root = tmp_path_factory.mktemp('console')
  write_table(root / 'train.csv', regression_frame(200, 0))
  write_table(root / 'eval.csv', regression_frame(60, 1))
  return str(root)


def _args(tables: str, workdir: str, targets: tuple[str, ...], *extra: str
          ) -> list[str]:
  return [sys.executable, 'train.py', '--config=configs/csv.py',
          f'--workdir={workdir}', f'--config.dataset.data_dir={tables}/tfds',
          f'--config.dataset.train_path={tables}/train.csv',
          f'--config.dataset.eval_path={tables}/eval.csv',
          f'--config.dataset.target_columns={targets!r}',
          f'--config.num_train_steps={STEPS}',
          f'--config.eval_every_steps={EVAL_EVERY}',
          f'--config.log_every_steps={LOG_EVERY}',
          '--config.early_stopping_evals=0',
          # The eval file at every evaluation, to see it on each line.
          '--config.eval_during_training=True',
          '--config.model.hidden_sizes=(16,)', *extra]


def _env() -> dict[str, str]:
  # JAX_PLATFORMS left unset: JAX looks for a TPU first, as in a user's run,
  # and logs at INFO that it found none.
  env = {k: v for k, v in os.environ.items() if k != 'JAX_PLATFORMS'}
  env['XLA_FLAGS'] = '--xla_force_host_platform_device_count=1'
  return env


def _train(tables: str, workdir: str, targets: tuple[str, ...],
           *extra: str) -> subprocess.CompletedProcess:
  """train.py with stdout and stderr through pipes (not a terminal)."""
  proc = subprocess.run(_args(tables, workdir, targets, *extra), cwd=ROOT,
                        env=_env(), capture_output=True, text=True,
                        timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


@pytest.fixture(scope='module')
def one_target(tables, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('one') / 'run')
  return workdir, _train(tables, workdir, ('y',))


@pytest.fixture(scope='module')
def one_target_verbose(tables, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('verbose') / 'run')
  return workdir, _train(tables, workdir, ('y',), '--verbose')


def _evaluations(workdir: str) -> list[dict]:
  return [r for r in writers.read_jsonl(os.path.join(workdir,
                                                     'metrics.jsonl'))
          if 'val/loss' in r]


def _without_the_end_notice(workdir: str, lines: list[str]) -> list[str]:
  """Checks that the line saying a longer run may help follows the last
  evaluation if and only if the best step was in the run's last tenth;
  returns the lines without it."""
  records = _evaluations(workdir)
  best = min(records, key=lambda r: r['val/loss'])['step']
  notices = [i for i, line in enumerate(lines)
             if line.startswith('The validation loss was still improving')]
  if best > 0.9 * STEPS:
    last_evaluation = max(i for i, line in enumerate(lines)
                          if line.startswith(f'step {STEPS}/'))
    assert notices == [last_evaluation + 1], lines
    assert f'at step {best} of {STEPS})' in lines[notices[0]]
  else:
    assert not notices, lines
  return [line for i, line in enumerate(lines) if i not in notices]


def _check_lines(workdir: str, stdout: str) -> list[str]:
  """Checks that `stdout` holds one line per evaluation, saying what
  metrics.jsonl recorded there (and the end's notice where it is due);
  returns the evaluations' lines."""
  lines = _without_the_end_notice(workdir, stdout.splitlines())
  records = _evaluations(workdir)
  assert [r['step'] for r in records] == list(range(EVAL_EVERY, STEPS + 1,
                                                    EVAL_EVERY))
  assert len(lines) == len(records), stdout
  best = None
  for line, record in zip(lines, records, strict=True):
    if best is None or record['val/loss'] < best['val/loss']:
      best = record
    assert line.startswith(f'step {record["step"]}/{STEPS} ('), line
    assert ' epochs), ' in line and ' elapsed, ' in line and ' left: ' in line
    assert 'train loss ' in line
    assert (f'val loss {record["val/loss"]:.4g} (best step {best["step"]})'
            in line), line
    if 'eval/rmse' in record:
      assert f'eval rmse {record["eval/rmse"]:.5g}' in line, line
  return lines


def test_a_pipe_gets_a_line_per_evaluation_and_nothing_per_log_step(
    one_target):
  workdir, proc = one_target
  lines = _check_lines(workdir, proc.stdout)
  assert '\r' not in proc.stdout
  assert not [line for line in lines if '(y ' in line]  # one target: once
  assert 'train/loss' not in proc.stderr
  assert 'Done: best step' in proc.stderr


def test_the_libraries_info_logs_are_silenced(one_target):
  _, proc = one_target
  assert "Unable to initialize backend 'tpu'" not in proc.stderr
  assert 'transition_steps' not in proc.stderr  # optax: no 0-step warmup
  assert 'Resetting cache' not in proc.stderr
  assert {name for name in INFO.findall(proc.stderr)} <= OURS, proc.stderr
  for line in ('Sized to the 160 training rows',
               f'Training steps 1..{STEPS} on a'):
    assert line in proc.stderr


def test_verbose_logs_every_log_step_and_the_libraries(one_target_verbose):
  _, proc = one_target_verbose
  logged = re.findall(r'\] \[(\d+)\] train/', proc.stderr)
  assert logged == [str(s) for s in range(LOG_EVERY, STEPS + 1, LOG_EVERY)]
  evaluated = re.findall(r'\] \[(\d+)\] eval/mae=', proc.stderr)
  assert evaluated == [str(s) for s in range(EVAL_EVERY, STEPS + 1,
                                             EVAL_EVERY)]
  assert 'eval/mae/y=' not in proc.stderr  # one target: each metric once
  assert set(INFO.findall(proc.stderr)) - OURS  # Orbax's, JAX's, ...
  assert 'transition_steps' not in proc.stderr  # its cause is gone
  assert 'Done: best step' in proc.stderr


def test_metrics_jsonl_records_every_scalar_whatever_the_console_shows(
    one_target, one_target_verbose):
  quiet = writers.read_jsonl(os.path.join(one_target[0], 'metrics.jsonl'))
  loud = writers.read_jsonl(os.path.join(one_target_verbose[0],
                                         'metrics.jsonl'))
  timed = 'train/steps_per_sec'
  assert [{k: v for k, v in r.items() if k != timed} for r in quiet] == [
      {k: v for k, v in r.items() if k != timed} for r in loud]
  assert [r.keys() for r in quiet] == [r.keys() for r in loud]
  keys = set().union(*quiet)
  assert {'train/loss', 'train/grad_norm', timed, 'train/learning_rate',
          'val/loss', 'eval/mae', 'eval/mae/y', 'eval/rmse',
          'eval/rmse/y'} <= keys


def test_the_eval_file_scored_once_gets_a_line_of_its_own(tables, tmp_path):
  workdir = str(tmp_path / 'run')
  proc = _train(tables, workdir, ('y', 'z'),
                '--config.eval_during_training=False')
  *lines, last = _without_the_end_notice(workdir, proc.stdout.splitlines())
  records = _evaluations(workdir)
  assert len(lines) == len(records)  # one per evaluation, no eval rmse
  assert not any('eval rmse' in line for line in lines)
  final = [r for r in writers.read_jsonl(os.path.join(
      workdir, 'metrics.jsonl')) if 'eval/rmse' in r]
  assert [r['step'] for r in final] == [STEPS]
  assert last == (f'The final model on the eval file: rmse '
                  f'{final[0]["eval/rmse"]:.5g} (y '
                  f'{final[0]["eval/rmse/y"]:.5g}, z '
                  f'{final[0]["eval/rmse/z"]:.5g}).')


def test_two_targets_show_each_targets_metrics(tables, tmp_path):
  workdir = str(tmp_path / 'run')
  proc = _train(tables, workdir, ('y', 'z'), '--verbose')
  lines = _check_lines(workdir, proc.stdout)
  for line, record in zip(lines, _evaluations(workdir), strict=True):
    if 'eval/rmse' in record:
      assert line.endswith(f'eval rmse {record["eval/rmse"]:.5g} '
                           f'(y {record["eval/rmse/y"]:.5g}, '
                           f'z {record["eval/rmse/z"]:.5g})'), line
  assert 'eval/mae/y=' in proc.stderr and 'eval/mae/z=' in proc.stderr


def _on_a_terminal(args: list[str]) -> str:
  """What a terminal 200 columns wide shows of `args` (stdout and stderr,
  its newlines left as '\\n')."""
  leader, follower = pty.openpty()
  fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack('HHHH', 50, 200,
                                                        0, 0))
  attrs = termios.tcgetattr(follower)
  attrs[1] &= ~termios.ONLCR  # '\n' stays '\n'
  termios.tcsetattr(follower, termios.TCSANOW, attrs)
  # The terminal's size, not an inherited COLUMNS (pytest-xdist's workers
  # carry one), says how wide the line is.
  env = {k: v for k, v in _env().items() if k not in ('COLUMNS', 'LINES')}
  proc = subprocess.Popen(args, cwd=ROOT, env=env, stdin=follower,
                          stdout=follower, stderr=follower, close_fds=True)
  os.close(follower)
  out = b''
  try:
    while chunk := os.read(leader, 65536):
      out += chunk
  except OSError:  # EIO: every writer has closed the terminal
    pass
  finally:
    os.close(leader)
  assert proc.wait(timeout=300) == 0, out[-3000:]
  return out.decode()


def test_a_terminal_gets_one_line_redrawn_in_place(tables, tmp_path):
  # Long enough that the line is redrawn a few times (every 0.25 s).
  steps = 6000
  out = _on_a_terminal(_args(tables, str(tmp_path / 'run'), ('y',),
                             f'--config.num_train_steps={steps}',
                             '--config.eval_every_steps=100',
                             '--config.log_every_steps=50'))
  lines = out.split('\n')
  assert not [line for line in lines if line.startswith('step ')]
  shown = [line for line in lines if '\rstep ' in line]
  draws = [d.replace('\x1b[K', '') for line in shown
           for d in line.split('\r') if d.startswith('step ')]
  # Evaluations do not print lines of their own: the draws share a line,
  # or a few when a log record comes between them.
  assert len(draws) > len(shown) >= 1, out[-3000:]
  assert draws[-1].startswith(f'step {steps}/{steps} (')
  assert 'val loss' in draws[-1] and 'eval rmse' in draws[-1]
  end = lines.index(shown[-1])
  assert shown[-1].replace('\x1b[K', '').endswith(draws[-1])
  assert 'Done: best step' in lines[end + 1]
