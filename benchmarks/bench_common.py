"""The benchmarks' runner: train.py as processes, timing, tables, data.

Imported by the scripts beside it (`python benchmarks/speed.py` puts this
folder first on the module path). Everything here drives meshfit from the
outside: train.py in subprocesses, the workdir's files read back.
"""

import dataclasses
import json
import os
import platform
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The shared data sets (../shared/datasets beside the checkout).
DATASETS = os.path.join(ROOT, '..', 'shared', 'datasets')


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]],
                   text_columns: int = 1) -> str:
  """A markdown table whose columns line up in plain text too.

  Args:
    header: the column names.
    rows: the cells, row by row (converted with str; short rows padded).
    text_columns: the first columns, left-aligned whatever they hold; after
      them numbers are right-aligned (with a `:` rule) and other text
      left-aligned.

  Returns:
    The table's lines.
  """
  rows = [[str(c) for c in r] + [''] * (len(header) - len(r)) for r in rows]
  widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
  numeric = [i >= text_columns and any(re.match(r'-?[0-9]', r[i])
                                        for r in rows)
             for i in range(len(header))]

  def line(cells):
    return '| ' + ' | '.join(
        c.rjust(w) if numeric[i] and re.match(r'-?[0-9]', c) else c.ljust(w)
        for i, (c, w) in enumerate(zip(map(str, cells), widths))) + ' |'
  sep = '|' + '|'.join('-' * (w + 1) + ':' if numeric[i] else '-' * (w + 2)
                       for i, w in enumerate(widths)) + '|'
  return '\n'.join([line(header), sep] + [line(r) for r in rows])


def number(x: float) -> str:
  """Three significant digits or more: 12,345 / 123 / 12.3 / 1.23."""
  return f'{x:,.0f}' if x >= 100 else f'{x:.3g}'


def machine() -> str:
  """The CPU, its cores and the JAX devices this process sees."""
  cpu = platform.processor() or platform.machine()
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      cpu = next(line.split(':', 1)[1].strip() for line in f
                 if line.startswith('model name'))
  except (OSError, StopIteration):
    pass
  text = f'{cpu}, {os.cpu_count()} cores'
  if 'jax' in sys.modules:
    jax = sys.modules['jax']
    text += (f'; jax {jax.__version__} on {jax.device_count()} '
             f'{jax.devices()[0].platform} device(s)')
  return text


def load_average() -> float:
  """The 1-minute load average (other processes share the cores)."""
  return os.getloadavg()[0]


# ---------------------------------------------------------------------------
# Interleaved rounds.


def interleaved(runs: dict[str, Callable[[], float]], repeats: int
                ) -> dict[str, list[float]]:
  """Each of `runs` once per round, the start rotating every round.

  Slow drifts in the load of other processes then reach every variant;
  bursts do not, so read each at its best round (like `timeit`'s minimum).

  Args:
    runs: name -> a function that runs the variant once and returns its
      rate (higher is better).
    repeats: rounds.

  Returns:
    name -> its rate in each round.
  """
  names = list(runs)
  rates = {name: [] for name in names}
  for r in range(repeats):
    for name in names[r % len(names):] + names[:r % len(names)]:
      rates[name].append(runs[name]())
  return rates


# ---------------------------------------------------------------------------
# train.py as processes.


@dataclasses.dataclass
class Run:
  """What one train.py command (one or several processes) did."""
  returncode: int
  seconds: float  # launch to the last process's exit
  start: float  # time.time() at launch
  output: str  # process 0's stderr and stdout
  peak_rss_gib: list[float]  # each process's, from wait4
  cpu_seconds: float  # user + system, all processes
  timed_out: bool = False

  @property
  def lines(self) -> list[str]:
    return self.output.splitlines()


def env(**extra: str) -> dict[str, str]:
  """The environment of a benchmark's subprocess: local and quiet."""
  return dict(os.environ, NO_GCE_CHECK='true', TF_CPP_MIN_LOG_LEVEL='2',
              **extra)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def train_py(args: Sequence[str], processes: int = 1,
             devices: int | None = None,
             timeout: float | None = None) -> Run:
  """Runs `python train.py ARGS` as a user does, and waits for it.

  Args:
    args: train.py's flags.
    processes: with more than one, a job joined on 127.0.0.1 (each process
      gets --coordinator_address, --num_processes and its --process_id).
    devices: CPU devices per process (XLA_FLAGS); None keeps the
      environment's.
    timeout: seconds before the processes are killed (`timed_out`).

  Returns:
    The run: exit status (the first non-zero one), wall seconds, process 0's
    output, each process's peak RSS and their CPU time.
  """
  extra = ({} if devices is None else
           {'XLA_FLAGS': f'--xla_force_host_platform_device_count={devices}'})
  port = _free_port()
  start = time.time()
  procs = []
  for i in range(processes):
    job = ([f'--coordinator_address=127.0.0.1:{port}',
            f'--num_processes={processes}', f'--process_id={i}']
           if processes > 1 else [])
    procs.append(subprocess.Popen(
        [sys.executable, 'train.py', *args, *job], cwd=ROOT, env=env(**extra),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
  outputs = [''] * processes

  def read(i: int) -> None:
    outputs[i] = procs[i].stdout.read()
  readers = [threading.Thread(target=read, args=(i,), daemon=True)
             for i in range(processes)]
  for r in readers:
    r.start()
  killed = threading.Event()

  def kill() -> None:
    killed.set()
    for p in procs:
      p.kill()
  timer = None
  if timeout is not None:
    timer = threading.Timer(timeout, kill)
    timer.start()
  peaks, cpu, returncode = [], 0.0, 0
  for p in procs:  # wait4: each child's own peak RSS (KiB on Linux)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    returncode = returncode or p.returncode
    peaks.append(usage.ru_maxrss / 2**20)
    cpu += usage.ru_utime + usage.ru_stime
  seconds = time.time() - start
  if timer is not None:
    timer.cancel()
  for r in readers:
    r.join()
  return Run(returncode, seconds, start, outputs[0], peaks, cpu,
             killed.is_set())


def checked(run: Run) -> Run:
  """`run`, or RuntimeError with its output's end if it failed."""
  if run.returncode:
    raise RuntimeError(f'train.py exited {run.returncode}:\n'
                       f'{run.output[-3000:]}')
  return run


# absl's log line prefix (I1124 00:23:39.123456), after a process tag.
_STAMP = re.compile(
    r'^(?:\[p\d+/\d+\] )?[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+)')


def log_time(line: str, year: int) -> float | None:
  """The Unix time of an absl log line, or None for another line."""
  match = _STAMP.match(line)
  if not match:
    return None
  month, day, h, m, s = match.groups()
  return time.mktime(time.strptime(f'{year}{month}{day} {h}:{m}:00',
                                   '%Y%m%d %H:%M:%S')) + float(s)


def first_log(run: Run, pattern: str) -> float | None:
  """Seconds from launch to the first log line matching `pattern`."""
  year = time.localtime(run.start).tm_year
  for line in run.lines:
    if re.search(pattern, line):
      stamp = log_time(line, year)
      if stamp is not None:
        return stamp - run.start
  return None


def read_metrics(workdir: str) -> list[dict]:
  """A run's metrics.jsonl records (the workdir's public file)."""
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------------------
# Synthetic tables.


def write_table(directory: str, rows: int, features: int = 20,
                targets: int = 1, files: int = 1, eval_rows: int = 100_000,
                seed: int = 0) -> tuple[str, str]:
  """A regression table as Parquet, written unless present.

  y = tanh(x w) + noise with x standard normal float32; the columns are
  x0.. and y (y0.. with several targets).

  Args:
    directory: where the files go (created).
    rows: training rows, over `files` files.
    features: input columns.
    targets: target columns.
    files: training files (train-00.parquet, ...).
    eval_rows: rows of eval.parquet.
    seed: seeds the weights and every file's rows.

  Returns:
    The training files' glob (one file's path if `files` is 1) and the
    evaluation file.
  """
  import pyarrow as pa  # noqa: PLC0415  (not every benchmark needs it)
  import pyarrow.parquet as pq  # noqa: PLC0415
  os.makedirs(directory, exist_ok=True)
  w_FxT = np.random.default_rng(seed).standard_normal(
      (features, targets)) / np.sqrt(features)
  names = [f'x{i}' for i in range(features)]
  target_names = ['y'] if targets == 1 else [f'y{i}' for i in range(targets)]

  def write(path: str, n: int, file_seed: int) -> None:
    if os.path.exists(path):
      return
    rng = np.random.default_rng(file_seed)
    writer = None
    for start in range(0, n, 1 << 20):
      x = rng.standard_normal((min(1 << 20, n - start), features), np.float32)
      y = (np.tanh(x @ w_FxT) + 0.1 * rng.standard_normal(
          (len(x), targets))).astype(np.float32)
      table = pa.table({**{c: x[:, i] for i, c in enumerate(names)},
                        **{c: y[:, i] for i, c in enumerate(target_names)}})
      if writer is None:
        writer = pq.ParquetWriter(path + '.tmp', table.schema)
      writer.write_table(table, row_group_size=1 << 20)
    writer.close()
    os.replace(path + '.tmp', path)

  bounds = np.linspace(0, rows, files + 1).astype(int)
  paths = [os.path.join(directory, f'train-{i:02d}.parquet')
           for i in range(files)]
  for i, path in enumerate(paths):
    write(path, int(bounds[i + 1] - bounds[i]), seed + 1 + i)
  eval_path = os.path.join(directory, 'eval.parquet')
  write(eval_path, eval_rows, seed + 100)
  train = paths[0] if files == 1 else os.path.join(directory,
                                                   'train-*.parquet')
  return train, eval_path
