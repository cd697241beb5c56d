"""A table's first minute: where a small table's seconds go, and a big one's.

    python benchmarks/first_minute.py [--sections=small,big]
        [--train=... --test=... --target=bwt] [--big_rows=10000000]
        [--big_runs=cold,prepared,resident]

small  `configs/csv.py` on one table (default: the shared babies table,
       988 rows), train then predict, each a fresh `train.py` process as a
       user runs them: cold (no compilation cache, no prepared copy) and
       warm (both kept from the cold run), and warm without `--verbose`
       ('quiet', the command as a user types it: its wall only). Wall
       seconds of each phase, read
       from the run's own timestamped lines (`--verbose`): Python and
       library imports up to the first line, preparing the table, setting
       up (model, state, compiling the first call), training (steps and
       evaluations), after the last step (final evaluation, loss curve,
       last checkpoint, exit), and predict.
big    a `--big_rows`-row Parquet table (benchmarks/scale.py's, in 8 files)
       streamed on 2 processes x 1 device (over `dataset.resident_table_mb`
       =256), `configs/csv.py` with 50 steps (validated on the held-out
       fraction chosen for a table too large to cross-fit),
       as issue 32 timed it: wall seconds from launch to both processes'
       exit and each one's peak RSS, the table prepared in the run (cold)
       and already prepared; then held in memory and cross-fitted
       (`resident_table_mb` over its size), as configs/csv.py trains a
       table that fits.
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from absl import app, flags

from bench_common import markdown_table
from big_table import generate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLES = os.path.join(ROOT, '..', 'shared', 'datasets', 'tables')

flags.DEFINE_list('sections', ['small', 'big'], 'small, big')
flags.DEFINE_string('train', os.path.join(TABLES, 'babies', '0',
                                          'train.csv'), 'Training file.')
flags.DEFINE_string('test', os.path.join(TABLES, 'babies', '0', 'test.csv'),
                    'Eval file (and predict input).')
flags.DEFINE_string('target', 'bwt', 'The column to predict.')
flags.DEFINE_integer('big_rows', 10_000_000, 'Rows of the big table.')
BIG_RUNS = ('cold', 'prepared', 'resident')
flags.DEFINE_list('big_runs', list(BIG_RUNS),
                  "The big section's runs: streamed cold, streamed prepared, "
                  'resident (each a few minutes at 10M rows).')
flags.register_validator(
    'big_runs', lambda runs: set(runs) <= set(BIG_RUNS),
    message=f'--big_runs: some of {",".join(BIG_RUNS)}')
flags.DEFINE_string('big_root', '/tmp/meshfit-scale', 'Where the big table '
                    'is generated (kept; benchmarks/scale.py shares it).')
flags.DEFINE_string('log_flag', '--verbose', "train.py's flag that prints "
                    "every log step's timestamped line ('' for a meshfit "
                    'older than --verbose, which always printed them).')
FLAGS = flags.FLAGS

_STAMP = re.compile(r'^[IWE](\d{4}) (\d\d):(\d\d):(\d\d\.\d+)')


def _seconds(line: str) -> float | None:
  """The time of day of an absl log line, in seconds."""
  m = _STAMP.match(line)
  if not m:
    return None
  return int(m[2]) * 3600 + int(m[3]) * 60 + float(m[4])


def _first(lines: list[str], pattern: str) -> float | None:
  return next((_seconds(x) for x in lines if re.search(pattern, x)
               and _seconds(x) is not None), None)


def _run(args: list[str], env: dict | None = None) -> tuple[float, float,
                                                            list[str]]:
  """(start time of day, wall seconds, output lines) of one train.py."""
  start_wall = time.time()
  day = time.localtime(start_wall)
  start = (day.tm_hour * 3600 + day.tm_min * 60 + day.tm_sec
           + start_wall % 1)
  proc = subprocess.run([sys.executable, 'train.py', *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, check=False)
  if proc.returncode:
    raise RuntimeError(proc.stderr[-3000:])
  return start, time.time() - start_wall, (proc.stderr + proc.stdout
                                           ).splitlines()


def small(scratch: str) -> list[list[object]]:
  cache, data = os.path.join(scratch, 'cache'), os.path.join(scratch, 'data')
  rows = []
  # 'quiet': warm, the user's command as typed (no --verbose), so its wall
  # is not the timestamped lines' cost; its phases are not read.
  for kind in ('cold', 'warm', 'quiet'):
    workdir = os.path.join(scratch, f'{kind}_run')
    log_flag = [FLAGS.log_flag] if FLAGS.log_flag and kind != 'quiet' else []
    start, wall, lines = _run([
        '--config=configs/csv.py', f'--workdir={workdir}',
        f'--config.dataset.train_path={FLAGS.train}',
        f'--config.dataset.eval_path={FLAGS.test}',
        f"--config.dataset.target_columns=('{FLAGS.target}',)",
        f'--config.dataset.data_dir={data}',
        f'--config.compilation_cache_dir={cache}', *log_flag])
    marks = [start, _first(lines, r'JAX process'), _first(lines, r'Sized to'),
             _first(lines, r'Training steps'),
             _first(lines, r'\] \[\d+\] train/'), _first(lines, r'Done:'),
             start + wall]
    p_start, p_wall, _ = _run([
        '--mode=predict', f'--workdir={workdir}', f'--input={FLAGS.test}',
        f'--output={os.path.join(scratch, kind + "_predictions.csv")}'])
    del p_start
    steps = re.search(r'Done: (?:best )?step (\d+)', '\n'.join(lines))
    spans = ([f'{b - a:.2f}' for a, b in zip(marks, marks[1:])]
             if log_flag else ['-'] * (len(marks) - 1))
    rows.append([kind, f'{wall + p_wall:.2f}', f'{wall:.2f}', *spans,
                 f'{p_wall:.2f}', steps[1] if steps else '?'])
  return rows


def _job(args: list[str]) -> tuple[float, str, list[float]]:
  """Runs train.py `args` as 2 processes x 1 device joined on 127.0.0.1:
  (wall seconds, process 0's stderr, each process's peak RSS in GB)."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=1')
  start = time.time()
  procs = [subprocess.Popen(
      [sys.executable, 'train.py', *args,
       f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
       f'--process_id={i}'], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, text=True) for i in range(2)]
  errors = ['', '']

  def read(i: int) -> None:
    errors[i] = procs[i].stderr.read()
  readers = [threading.Thread(target=read, args=(i,)) for i in range(2)]
  for r in readers:
    r.start()
  peaks, failed = [], False
  for p in procs:  # wait4: each child's own peak RSS (KiB on Linux)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    failed = failed or p.returncode != 0
    peaks.append(usage.ru_maxrss / 2**20)
  for r in readers:
    r.join()
  if failed:
    raise RuntimeError('\n'.join(f'--- process {i} ---\n{e[-3000:]}'
                                  for i, e in enumerate(errors)))
  return time.time() - start, errors[0], peaks


def big(scratch: str) -> list[list[object]]:
  train, test = generate(os.path.join(FLAGS.big_root,
                                            f'{FLAGS.big_rows}'),
                               FLAGS.big_rows)
  data = os.path.join(scratch, 'big_data')
  rows = []
  # Streamed, as issue 32 ran it (each process reads its rows): cold, then
  # prepared; then held in memory and cross-fitted (configs/csv.py's
  # default for a table under dataset.resident_table_mb), prepared.
  runs = {'cold': ('cold', 256), 'prepared': ('prepared', 256),
          'resident': ('prepared', 4096)}
  for kind, resident_mb in (runs[r] for r in FLAGS.big_runs):
    workdir = os.path.join(scratch, f'big_{len(rows)}')
    wall, errors, peaks = _job([
        '--config=configs/csv.py', f'--workdir={workdir}',
        f'--config.dataset.train_path={train}',
        f'--config.dataset.eval_path={test}',
        "--config.dataset.target_columns=('y',)",
        f'--config.dataset.data_dir={data}',
        f'--config.compilation_cache_dir={os.path.join(scratch, "bc")}',
        '--config.num_train_steps=50',
        f'--config.dataset.resident_table_mb={resident_mb}'])
    sized = re.search(r'Sized to .*', errors)
    fed = re.search(r'batches (gathered on device|streamed from the host)',
                    errors)
    rows.append([kind, resident_mb, fed[1] if fed else '?', f'{wall:.1f}',
                 ' / '.join(f'{g:.2f}' for g in peaks),
                 sized[0][:120] if sized else ''])
  return rows


def main(argv: list[str]) -> None:
  del argv
  scratch = tempfile.mkdtemp(prefix='meshfit_first_minute_')
  try:
    if 'small' in FLAGS.sections:
      print(f'{FLAGS.train}: train + predict, each a fresh process')
      print(markdown_table(
          ['run', 'train + predict, s', 'train, s', 'imports', 'prepare',
           'set up', 'first call', 'training', 'after the last step',
           'predict, s', 'model step'], small(scratch)))
    if 'big' in FLAGS.sections:
      print(f'{FLAGS.big_rows:,}-row table, 2 processes x 1 device, 50 steps')
      print(markdown_table(['run', 'resident_table_mb', 'batches', 'wall, s',
                            'peak RSS per process, GB', 'sized'],
                           big(scratch)))
  finally:
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == '__main__':
  app.run(main)
