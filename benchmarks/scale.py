"""Tables bigger than a host: preparing, memory, first step, throughput.

For each size (default 1M, 10M and 50M rows x 20 float32 features and one
target, in 8 Parquet files, plus a 100k-row evaluation file) it measures,
each in fresh processes:

  prepare   `csv_regression.prepare` (what train.py runs on a table it has
            not prepared yet) of the files into a fresh data_dir: rows/s per
            process and peak RSS, with 1 process and with 2 (each preparing
            its share of the files)
  train     `train.py` on the table, the small model on 1 process x 8
            devices and 2 processes x 4 devices (joined on 127.0.0.1), the
            medium one on 1 x 8: seconds from launch to the first step of a
            first run (preparing the files, compiling without the persistent
            cache), peak RSS of each process, and the rows/s the model
            consumed (the median of its logged steps/s, x batch)
  csv       `configs/csv.py`, 50 steps, on 2 processes x 1 device: wall
            seconds from launch to both processes' exit and each one's peak
            RSS; streamed (`dataset.resident_table_mb=256`, under the table)
            cold (preparing it) and prepared, then held in memory and
            cross-fitted (resident_table_mb over the table's size), as
            configs/csv.py trains a table that fits

A table larger than `dataset.resident_table_mb` (1024 MiB by default: the
10M and 50M tables) is streamed; the 1M table is resident.

    python benchmarks/scale.py                       # ~25 minutes, ~20 GB disk
    python benchmarks/scale.py --rows=1000000 --sections=prepare,train
    python benchmarks/scale.py --rows=10000000 --sections=csv

The tables are generated once into --workroot and kept (delete it after).
"""

import multiprocessing
import os
import re
import resource
import shutil
import time
from collections.abc import Sequence

import numpy as np
from absl import app, flags

import bench_common
from bench_common import markdown_table, number

SECTIONS = ('prepare', 'train', 'csv')
CSV_RUNS = ('cold', 'prepared', 'resident')

flags.DEFINE_list('rows', ['1000000', '10000000', '50000000'],
                  'Table sizes, in rows.')
flags.DEFINE_list('sections', list(SECTIONS), f'Any of {", ".join(SECTIONS)}.')
flags.DEFINE_string('workroot', '/tmp/meshfit-scale', 'Where the tables, '
                    'their prepared copies and the runs go.')
flags.DEFINE_integer('train_steps', 3000, 'Steps of each training run (the '
                     'small model; its steps/s is the median of its logs).')
flags.DEFINE_list('csv_runs', list(CSV_RUNS),
                  f'The csv section\'s runs: any of {", ".join(CSV_RUNS)}.')
FLAGS = flags.FLAGS

FEATURES, FILES = 20, 8
# What the models consume: benchmarks/speed.py's small and medium models,
# on this table's 20 features.
MODELS = {'small': ((64, 64), 256), 'medium': ((512, 512), 1024)}


def table(rows: int) -> tuple[str, str]:
  """The training files (a glob) and evaluation file of `rows` rows."""
  return bench_common.write_table(
      os.path.join(FLAGS.workroot, f'{rows}', 'files'), rows, FEATURES,
      files=FILES)


def _prepare_worker(files: tuple[str, str], data_dir: str, index: int,
                    count: int, barrier, shared, results) -> None:
  from meshfit.input_pipeline.csv_regression import prepare  # noqa: PLC0415

  def gather(array: np.ndarray) -> np.ndarray:
    # What jax's process_allgather does for train.py, between processes.
    shared[index] = array
    barrier.wait()
    every = np.stack([shared[i] for i in range(count)])
    barrier.wait()
    return every
  start = time.perf_counter()
  prepare(files[0], files[1], ('y',), (), (), data_dir,
          process_index=index, process_count=count,
          barrier=(lambda name: barrier.wait()) if count > 1 else None,
          gather=gather if count > 1 else None)
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


def measure_train(files: tuple[str, str], data_dir: str, workdir: str,
                  processes: int, devices: int, model: str = 'small',
                  steps: int = 0) -> dict:
  """A training run: first step, peak RSS, rows/s consumed.

  `steps` == 1 logs its one step (its time is the first step's); longer
  runs log every 100 steps (a log ends a jitted call: logging every step
  would measure single-step calls).
  """
  shutil.rmtree(workdir, ignore_errors=True)
  hidden, batch = MODELS[model]
  steps = steps or FLAGS.train_steps
  run = bench_common.checked(bench_common.train_py([
      '--config=configs/default.py', '--config.dataset.name=csv_regression',
      f'--config.dataset.train_path={files[0]}',
      f'--config.dataset.eval_path={files[1]}',
      "--config.dataset.target_columns=('y',)",
      f'--config.dataset.data_dir={data_dir}',
      f'--config.model.hidden_sizes={hidden}', f'--config.batch_size={batch}',
      '--config.eval_batch_size=4096', f'--config.num_train_steps={steps}',
      f'--config.log_every_steps={1 if steps == 1 else 100}',
      f'--config.eval_every_steps={steps}', '--config.plots=False',
      '--config.compilation_cache_dir=', f'--workdir={workdir}',
      # The first step is read from the per-step INFO lines.
      '--verbose'], processes=processes, devices=devices, timeout=3600))
  rates = [r['train/steps_per_sec'] for r in bench_common.read_metrics(workdir)
           if 'train/steps_per_sec' in r and r['step'] > 100]
  return {'first_step_s': bench_common.first_log(run, r'\[1\] .*train/loss='),
          'rss_gib': run.peak_rss_gib,
          'rows_per_s': float(np.median(rates)) * batch if rates else None,
          'streamed': 'streamed from the host' in run.output}


def measure_csv(files: tuple[str, str], data_dir: str, workdir: str,
                resident_mb: int) -> list[str]:
  """configs/csv.py, 50 steps, 2 processes x 1 device: one table row."""
  shutil.rmtree(workdir, ignore_errors=True)
  run = bench_common.checked(bench_common.train_py([
      '--config=configs/csv.py', f'--workdir={workdir}',
      f'--config.dataset.train_path={files[0]}',
      f'--config.dataset.eval_path={files[1]}',
      "--config.dataset.target_columns=('y',)",
      f'--config.dataset.data_dir={data_dir}',
      f'--config.compilation_cache_dir={os.path.join(data_dir, "cache")}',
      '--config.num_train_steps=50', '--verbose',
      f'--config.dataset.resident_table_mb={resident_mb}'],
      processes=2, devices=1, timeout=3600))
  sized = re.search(r'Sized to .*', run.output)
  fed = re.search(r'batches (gathered on device|streamed from the host)',
                  run.output)
  return [str(resident_mb), fed[1] if fed else '?', f'{run.seconds:.1f}',
          ' / '.join(f'{g:.2f}' for g in run.peak_rss_gib),
          sized[0][:120] if sized else '']


def main(argv: Sequence[str]) -> None:
  del argv
  bad = (set(FLAGS.sections) - set(SECTIONS) or set(FLAGS.csv_runs)
         - set(CSV_RUNS))
  if bad:
    raise app.UsageError(f'unknown {sorted(bad)}: sections are '
                         f'{", ".join(SECTIONS)}, csv runs '
                         f'{", ".join(CSV_RUNS)}')
  print(bench_common.machine(), flush=True)
  prepare_rows, train_rows, csv_rows = [], [], []
  for rows in [int(r) for r in FLAGS.rows]:
    home = os.path.join(FLAGS.workroot, f'{rows}')
    files = table(rows)
    data_dir = os.path.join(home, 'data')
    label = f'{rows / 1e6:g}M'
    if 'prepare' in FLAGS.sections:
      two = measure_prepare(files, data_dir, rows, 2)
      one = measure_prepare(files, data_dir, rows, 1)
      prepare_rows.append([label, number(one['seconds']),
                           number(one['rows_per_s_per_process'] / 1e6),
                           f'{one["rss_gib"]:.2f}', number(two['seconds']),
                           number(two['rows_per_s_per_process'] / 1e6),
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
    if 'csv' in FLAGS.sections:
      csv_dir = os.path.join(home, 'csv_data')
      shutil.rmtree(csv_dir, ignore_errors=True)
      # Streamed (each process reads its rows) cold, then prepared; then
      # held in memory and cross-fitted, prepared.
      runs = {'cold': 256, 'prepared': 256, 'resident': 4096}
      for kind in FLAGS.csv_runs:
        csv_rows.append([label, kind, *measure_csv(
            files, csv_dir, os.path.join(home, f'csv_{kind}'), runs[kind])])
        print(csv_rows[-1], flush=True)
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
  if csv_rows:
    print('\nconfigs/csv.py, 50 steps, 2 processes x 1 device:\n')
    print(markdown_table(['rows', 'run', 'resident_table_mb', 'batches',
                          'wall, s', 'peak RSS per process, GiB', 'sized'],
                         csv_rows, text_columns=2))


if __name__ == '__main__':
  app.run(main)
