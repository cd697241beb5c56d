"""Tables bigger than a host: preparing, memory, first step, input speed.

For each size (default 1M, 10M and 50M rows x 20 float32 features and one
target, in 8 Parquet files, plus a 100k-row evaluation file) it measures,
each in fresh processes:

  prepare         `csv_regression.prepare` of the files into a fresh
                  data_dir: rows/s per process and peak RSS, with 1 process
                  and with 2 (each preparing its share of the files)
  train           `train.py` on the prepared table, the small model on
                  1 process x 8 devices and 2 processes x 4 devices (joined
                  on 127.0.0.1 with gloo), the medium one on 1 x 8: seconds
                  from the start of the process to its first step (a first
                  run: preparing the files, compiling without the
                  persistent cache; the medium run's table is prepared), peak RSS
                  of each process, and the rows/s the model consumed (the
                  median of its logged steps/s, x batch)
  formats         reading random blocks of 4096 rows from the prepared parts
                  (`Store.read_rows`) against the same blocks as ArrayRecord
                  records (one record per block, read through
                  `ArrayRecordDataSource`, what Grain reads with)
  input           the streamed feed alone (`feeding._Windows`: reading each
                  lane's windows of blocks from the prepared parts, shuffled)
                  for one process's entries of every batch, in 1 process
                  and in 2 at once: rows/s delivered, against what the small
                  and medium models consume

A table larger than `dataset.resident_table_mb` (1024 MiB by default: the
10M and 50M tables) is streamed; the 1M table is resident.

    python benchmarks/scale.py                       # ~15 minutes, ~20 GB disk
    python benchmarks/scale.py --rows=1000000 --sections=prepare,train

The tables are generated once into --workroot and kept (delete it after).
"""

import json
import multiprocessing
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np
from absl import app, flags

from bench_common import markdown_table  # noqa: E402
from big_table import generate  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

flags.DEFINE_list('rows', ['1000000', '10000000', '50000000'],
                  'Table sizes, in rows.')
flags.DEFINE_list('sections', ['prepare', 'train', 'formats', 'input'],
                  'What to measure.')
flags.DEFINE_string('workroot', '/tmp/meshfit-scale', 'Where the tables, '
                    'their prepared copies and the runs go.')
flags.DEFINE_integer('train_steps', 3000, 'Steps of each training run (the '
                     'small model; its steps/s is the median of its logs).')
flags.DEFINE_float('input_seconds', 10.0, 'How long the feed alone runs.')
FLAGS = flags.FLAGS

# What the models consume: benchmarks/speed.py's small and medium models,
# on this table's 20 features.
MODELS = {'small': ((64, 64), 256), 'medium': ((512, 512), 1024)}


def _prepare_worker(files: tuple[str, str], data_dir: str, index: int,
                    count: int, barrier, shared, results) -> None:
  import resource  # noqa: PLC0415
  from input_pipeline import csv_regression  # noqa: PLC0415

  def gather(array: np.ndarray) -> np.ndarray:
    # What jax's process_allgather does for train.py, between processes.
    shared[index] = array
    barrier.wait()
    every = np.stack([shared[i] for i in range(count)])
    barrier.wait()
    return every
  start = time.perf_counter()
  csv_regression.prepare(files[0], files[1], ('y',), (), (), data_dir,
                         process_index=index, process_count=count,
                         barrier=(lambda name: barrier.wait()) if count > 1
                         else None, gather=gather if count > 1 else None)
  results.put((index, time.perf_counter() - start,
               resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20))


def measure_prepare(files: tuple[str, str], data_dir: str, rows: int,
                    processes: int) -> dict:
  """Rows/s per process and the peak RSS (GiB) of preparing afresh."""
  shutil.rmtree(data_dir, ignore_errors=True)
  context = multiprocessing.get_context('spawn')
  barrier, results = context.Barrier(processes), context.Queue()
  manager = context.Manager()
  shared = manager.dict()
  workers = [context.Process(target=_prepare_worker,
                             args=(files, data_dir, i, processes, barrier,
                                   shared, results))
             for i in range(processes)]
  for w in workers:
    w.start()
  out = [results.get(timeout=3600) for _ in workers]
  for w in workers:
    w.join()
  manager.shutdown()
  seconds = max(s for _, s, _ in out)
  return {'seconds': seconds,
          'rows_per_s_per_process': rows / seconds / processes,
          'rss_gib': max(r for _, _, r in out)}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


# absl's log line prefix: I1124 00:23:39.123456.
_STAMP = re.compile(r'^(?:\[p\d+/\d+\] )?[IWE](\d{4}) (\d\d):(\d\d):(\d\d\.\d+)')


def _stamp(line: str, year: int) -> float | None:
  match = _STAMP.match(line)
  if not match:
    return None
  md, h, m, s = match.groups()
  return time.mktime(time.strptime(f'{year}{md} {h}:{m}:00',
                                   '%Y%m%d %H:%M:%S')) + float(s)


def measure_train(files: tuple[str, str], data_dir: str, workdir: str,
                  processes: int, devices: int, model: str = 'small',
                  steps: int = 0) -> dict:
  """A training run: first step, peak RSS, rows/s consumed.

  `steps` == 1 logs its one step (its time is the first step's); longer
  runs log every 100 steps (a log ends a jitted call: logging every step
  would measure single-step calls)."""
  shutil.rmtree(workdir, ignore_errors=True)
  hidden, batch = MODELS[model]
  flags_ = [
      '--config=configs/default.py', '--config.dataset.name=csv_regression',
      f'--config.dataset.train_path={files[0]}',
      f'--config.dataset.eval_path={files[1]}',
      "--config.dataset.target_columns=('y',)",
      f'--config.dataset.data_dir={data_dir}',
      f"--config.model.hidden_sizes={hidden}", f'--config.batch_size={batch}',
      '--config.eval_batch_size=4096',
      f'--config.num_train_steps={steps or FLAGS.train_steps}',
      f'--config.log_every_steps={1 if steps == 1 else 100}',
      f'--config.eval_every_steps={steps or FLAGS.train_steps}',
      '--config.plots=False', '--config.compilation_cache_dir=',
      f'--workdir={workdir}',
      # The first step is read from the per-step INFO lines.
      '--verbose']
  # Peak RSS printed at exit by the process itself.
  runner = ('import atexit, resource, runpy, sys; atexit.register(lambda: '
            'print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF)'
            '.ru_maxrss, flush=True)); sys.argv = ["train.py"] + sys.argv[1:];'
            ' runpy.run_path("train.py", run_name="__main__")')
  env = dict(os.environ,
             XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}')
  port = _free_port()
  os.makedirs(os.path.dirname(workdir), exist_ok=True)
  logs = [os.path.join(os.path.dirname(workdir), f'p{i}.log')
          for i in range(processes)]
  start = time.time()
  procs = []
  for i, log in enumerate(logs):
    extra = ([f'--coordinator_address=127.0.0.1:{port}',
              f'--num_processes={processes}', f'--process_id={i}']
             if processes > 1 else [])
    with open(log, 'w', encoding='utf-8') as f:
      procs.append(subprocess.Popen(
          [sys.executable, '-c', runner, *flags_, *extra], cwd=ROOT, env=env,
          stdout=f, stderr=subprocess.STDOUT))
  for p in procs:
    p.wait(timeout=3600)
  texts = [open(log, encoding='utf-8').read() for log in logs]
  for p, text in zip(procs, texts):
    if p.returncode:
      raise RuntimeError(f'train.py failed:\n{text[-3000:]}')
  year = time.localtime(start).tm_year
  first = min((_stamp(line, year) for line in texts[0].splitlines()
               if re.search(r'\[1\] .*train/loss=', line)), default=None)
  records = [json.loads(line) for line in open(
      os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8')]
  rates = [r['train/steps_per_sec'] for r in records
           if 'train/steps_per_sec' in r and r['step'] > 100]
  return {'first_step_s': first - start if first else None,
          'rss_gib': [int(re.findall(r'PEAK_RSS_KB (\d+)', t)[-1]) / 2**20
                      for t in texts],
          'rows_per_s': float(np.median(rates)) * batch if rates else None,
          'streamed': 'streamed from the host' in texts[0]}


def _input_worker(directory: str, index: int, count: int, seconds: float,
                  results) -> None:
  from input_pipeline import csv_regression, order  # noqa: PLC0415
  from meshfit.data import feeding  # noqa: PLC0415
  store = csv_regression.open_split(directory, 'train')
  batch = MODELS['small'][1]
  share = batch // count
  windows = feeding._Windows(  # noqa: SLF001  (the feed's reading alone)
      order.ExampleOrder(store.num_examples, batch, seed=0), store,
      slice(index * share, (index + 1) * share))
  rows, position, start = 0, 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    rows += windows.rows(position, 128).shape[0] * share
    position += 128 * batch
  results.put(rows / (time.perf_counter() - start))


def measure_input(directory: str, processes: int) -> float:
  """Rows/s the streamed feed delivers, all processes together."""
  context = multiprocessing.get_context('spawn')
  results = context.Queue()
  workers = [context.Process(target=_input_worker,
                             args=(directory, i, processes,
                                   FLAGS.input_seconds, results))
             for i in range(processes)]
  for w in workers:
    w.start()
  total = sum(results.get(timeout=600) for _ in workers)
  for w in workers:
    w.join()
  return total


def measure_formats(directory: str, blocks: int = 2000) -> dict[str, float]:
  """Rows/s reading `blocks` random blocks of 4096 rows, both ways."""
  from array_record.python import (  # noqa: PLC0415
      array_record_data_source, array_record_module)
  from input_pipeline import csv_regression  # noqa: PLC0415
  store = csv_regression.open_split(directory, 'train')
  rows = 4096
  count = min(blocks, store.num_examples // rows)
  path = os.path.join(os.path.dirname(directory), 'blocks.array_record')
  writer = array_record_module.ArrayRecordWriter(path, 'group_size:1')
  for b in range(count):
    writer.write(store.read_rows(b * rows, (b + 1) * rows).tobytes())
  writer.close()
  order = np.random.default_rng(0).permutation(count)
  timings = {}
  start = time.perf_counter()
  for b in order:
    store.read_rows(int(b) * rows, (int(b) + 1) * rows)
  timings['prepared parts (preadv)'] = count * rows / (
      time.perf_counter() - start)
  source = array_record_data_source.ArrayRecordDataSource(path)
  start = time.perf_counter()
  for i in range(0, count, 64):
    for record in source.__getitems__(order[i:i + 64].tolist()):
      np.frombuffer(record, np.float32).reshape(rows, -1)
  timings['ArrayRecord (64 records a call)'] = count * rows / (
      time.perf_counter() - start)
  os.remove(path)
  return timings


def _prepared(data_dir: str) -> str:
  root = os.path.join(data_dir, 'csv_regression')
  return os.path.join(root, os.listdir(root)[0])


def main(argv: Sequence[str]) -> None:
  del argv
  rows_list = [int(r) for r in FLAGS.rows]
  prepare_rows, train_rows, format_rows, input_rows = [], [], [], []
  for rows in rows_list:
    home = os.path.join(FLAGS.workroot, f'{rows}')
    files = generate(os.path.join(home, 'files'), rows)
    data_dir = os.path.join(home, 'data')
    label = f'{rows / 1e6:g}M'
    if 'prepare' in FLAGS.sections:
      two = measure_prepare(files, data_dir, rows, 2)
      one = measure_prepare(files, data_dir, rows, 1)
      prepare_rows.append([label, f'{one["seconds"]:.1f}',
                           f'{one["rows_per_s_per_process"] / 1e6:.2f}',
                           f'{one["rss_gib"]:.2f}', f'{two["seconds"]:.1f}',
                           f'{two["rows_per_s_per_process"] / 1e6:.2f}',
                           f'{two["rss_gib"]:.2f}'])
      print(prepare_rows[-1], flush=True)
    if 'train' in FLAGS.sections:
      for processes, devices in ((1, 8), (2, 4)):
        # A first run: it prepares the files (each process its share).
        shutil.rmtree(data_dir, ignore_errors=True)
        first = measure_train(files, data_dir, os.path.join(
            home, f'first_{processes}x{devices}', 'run'), processes, devices,
                              steps=1)
        run = measure_train(files, data_dir, os.path.join(
            home, f'run_{processes}x{devices}', 'run'), processes, devices)
        train_rows.append([
            label, 'small', f'{processes} x {devices}',
            'streamed' if run['streamed'] else 'resident',
            f'{first["first_step_s"]:.1f}',
            ' / '.join(f'{r:.2f}' for r in first['rss_gib']),
            ' / '.join(f'{r:.2f}' for r in run['rss_gib']),
            f'{run["rows_per_s"] / 1e3:.0f}k'])
        print(train_rows[-1], flush=True)
      run = measure_train(files, data_dir, os.path.join(
          home, 'run_medium', 'run'), 1, 8, 'medium', 600)
      train_rows.append([label, 'medium', '1 x 8',
                         'streamed' if run['streamed'] else 'resident', '',
                         '', ' / '.join(f'{r:.2f}' for r in run['rss_gib']),
                         f'{run["rows_per_s"] / 1e3:.0f}k'])
      print(train_rows[-1], flush=True)
    if 'formats' in FLAGS.sections:
      if not os.path.exists(os.path.join(data_dir, 'csv_regression')):
        measure_prepare(files, data_dir, rows, 1)
      for name, rate in measure_formats(_prepared(data_dir)).items():
        format_rows.append([label, name, f'{rate / 1e6:.1f}M'])
        print(format_rows[-1], flush=True)
    if 'input' in FLAGS.sections:
      if not os.path.exists(os.path.join(data_dir, 'csv_regression')):
        measure_prepare(files, data_dir, rows, 1)
      for processes in (1, 2):
        rate = measure_input(_prepared(data_dir), processes)
        input_rows.append([label, str(processes), f'{rate / 1e6:.2f}M'])
        print(input_rows[-1], flush=True)
  if prepare_rows:
    print('\nPreparing (seconds, M rows/s per process, peak RSS GiB):\n')
    print(markdown_table(['rows', '1 proc s', '1 proc Mrows/s', '1 proc RSS',
                          '2 procs s', '2 procs Mrows/s each',
                          '2 procs RSS'], prepare_rows))
  if train_rows:
    print('\nTraining (small: (64, 64), batch 256; medium: (512, 512), '
          'batch 1024):\n')
    print(markdown_table(['rows', 'model', 'processes x devices', 'table',
                          'first step s (first run)',
                          'its peak RSS GiB per process',
                          'training: peak RSS GiB per process',
                          'rows/s consumed'], train_rows, text_columns=4))
  if format_rows:
    print('\nRandom blocks of 4096 rows, read from the page cache:\n')
    print(markdown_table(['rows', 'format', 'rows/s'], format_rows,
                         text_columns=2))
  if input_rows:
    print('\nThe streamed feed alone (all processes together):\n')
    print(markdown_table(['rows', 'processes', 'rows/s delivered'],
                         input_rows))


if __name__ == '__main__':
  app.run(main)
