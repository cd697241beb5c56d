"""Local disk against a GCS emulator, through the storage layer, side by side.

    python benchmarks/gcs_storage.py --rows=2000000
    python benchmarks/gcs_storage.py --rows=10000000 --sections=prepare

(Not benchmarks/storage.py: run as a script, that name would shadow the
`storage` package it measures.)

Starts fake-gcs-server on 127.0.0.1 (storage/emulator.py), writes a
Parquet table of `rows` x `columns` float32 locally and uploads it, then
times, on each side:

  read        reading the table through a file of the layer (Parquet reads
              its footer and column chunks by ranged reads; no whole-file
              download), and the same rows as a prepared float32 file in
              blocks with RangeReader
  checkpoint  an Orbax checkpoint save of a ~`checkpoint_mb` pytree
  prepare     `csv_regression.prepare` of the table (its last column the
              target) and a 100k-row evaluation table into a fresh
              data_dir: local files into a local data_dir, the files on
              gs:// into a local one, and files and data_dir both on gs://;
              the best of `repeats` runs of each, interleaved
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'false')

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from bench_common import markdown_table, number  # noqa: E402

from meshfit import storage  # noqa: E402
from meshfit.storage import emulator as gcs_emulator  # noqa: E402

EVAL_ROWS = 100_000


def read_parquet(path: str) -> int:
  """Rows read from a Parquet table, row group by row group."""
  rows = 0
  with storage.open(path, 'rb') as f:
    table = pq.ParquetFile(f, pre_buffer=True)
    for i in range(table.num_row_groups):
      rows += table.read_row_group(i).num_rows
  return rows


def read_blocks(path: str, row_bytes: int, block_rows: int) -> int:
  """Rows read from a float32 file in blocks of `block_rows`."""
  rows = 0
  with storage.RangeReader(path) as reader:
    for offset in range(0, reader.size, row_bytes * block_rows):
      rows += len(reader.read_at(offset, row_bytes * block_rows)) // row_bytes
  return rows


def save_checkpoint(directory: str, tree: dict) -> float:
  import orbax.checkpoint as ocp  # noqa: PLC0415
  with ocp.CheckpointManager(directory) as manager:
    start = time.perf_counter()
    manager.save(0, args=ocp.args.StandardSave(tree))
    manager.wait_until_finished()
    return time.perf_counter() - start


def prepare(train: str, eval_path: str, target: str, data_dir: str) -> float:
  """Seconds to prepare `train` and `eval_path` into `data_dir` afresh."""
  from meshfit.input_pipeline.csv_regression import (  # noqa: PLC0415
      prepare as prepare_table)
  start = time.perf_counter()
  prepare_table(train, eval_path, (target,), (), (), data_dir)
  seconds = time.perf_counter() - start
  storage.rmtree(data_dir)  # the emulator keeps objects in memory
  return seconds


def measure_prepare(local: str, remote: str, rows: int, target: str,
                    repeats: int) -> list[tuple[str, ...]]:
  """Rows/s preparing from local disk against from the emulator."""
  cases = {'local': (local, os.path.join(local, 'prep')),
           'gs files': (remote, os.path.join(local, 'prep')),
           'gs files and data_dir': (remote, f'{remote}/prep')}
  best = dict.fromkeys(cases, float('inf'))
  for _ in range(repeats):
    for case, (root, data_dir) in cases.items():
      seconds = prepare(storage.join(root, 't.parquet'),
                        storage.join(root, 'e.parquet'), target, data_dir)
      best[case] = min(best[case], seconds)
      print(f'prepare, {case}: {seconds:.2f} s', flush=True)
  rate = {case: rows / s for case, s in best.items()}
  return [(f'prepare, {case}, rows/s', f'{rate["local"]:,.0f}',
           f'{rate[case]:,.0f}', number(rate[case] / rate['local']))
          for case in ('gs files', 'gs files and data_dir')]


def timed(fn, *args) -> tuple[float, int]:
  start = time.perf_counter()
  out = fn(*args)
  return time.perf_counter() - start, out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rows', type=int, default=2_000_000)
  parser.add_argument('--columns', type=int, default=20)
  parser.add_argument('--block_rows', type=int, default=65_536)
  parser.add_argument('--checkpoint_mb', type=int, default=50)
  parser.add_argument('--sections', default='read,checkpoint,prepare',
                      help='comma-separated: read, checkpoint, prepare')
  parser.add_argument('--repeats', type=int, default=2,
                      help='runs of each preparing case (the best counts)')
  args = parser.parse_args()
  sections = args.sections.split(',')

  with tempfile.TemporaryDirectory() as local, \
      gcs_emulator.running('bench') as emulator:
    os.environ.update(emulator.env())
    storage.configure_environment()
    import jax.numpy as jnp  # noqa: PLC0415  (after the environment)
    rng = np.random.default_rng(0)
    rows_RxC = rng.standard_normal((args.rows, args.columns), np.float32)
    table = pa.table({f'x{i}': rows_RxC[:, i] for i in range(args.columns)})
    pq.write_table(table, os.path.join(local, 't.parquet'),
                   row_group_size=args.block_rows)
    if 'read' in sections:
      rows_RxC.tofile(os.path.join(local, 'rows.f32'))
    pq.write_table(table.slice(0, EVAL_ROWS), os.path.join(local, 'e.parquet'))
    del table, rows_RxC
    remote = 'gs://bench/data'
    storage.copytree(local, remote)  # every file
    row_bytes = args.columns * 4

    results = []
    if 'prepare' in sections:
      results += measure_prepare(local, remote, args.rows,
                                 f'x{args.columns - 1}', args.repeats)
    for what, fn, extra in [
        ('Parquet table, rows/s', read_parquet, ()),
        ('float32 blocks, rows/s', read_blocks, (row_bytes,
                                                 args.block_rows))]:
      if 'read' not in sections:
        break
      name = 't.parquet' if fn is read_parquet else 'rows.f32'
      rates = []
      for root in (local, remote):
        path = storage.join(root, name)
        fn(path, *extra)  # warm: page cache, connections
        seconds, rows = timed(fn, path, *extra)
        assert rows == args.rows, (rows, args.rows)
        rates.append(rows / seconds)
      results.append((what, f'{rates[0]:,.0f}', f'{rates[1]:,.0f}',
                      number(rates[1] / rates[0])))
    if 'checkpoint' in sections:
      n = args.checkpoint_mb * 2**20 // 4
      tree = {'w': jnp.asarray(rng.standard_normal(n, np.float32))}
      times = [save_checkpoint(storage.join(root, 'ckpt'), tree)
               for root in (local, remote)]
      results.append((f'Orbax save {args.checkpoint_mb} MB, s',
                      f'{times[0]:.2f}', f'{times[1]:.2f}',
                      number(times[1] / times[0])))
  print(f'{args.rows:,} rows x {args.columns} float32 columns, '
        f'blocks of {args.block_rows:,} rows\n')
  print(markdown_table(['what', 'local disk', 'emulator', 'emulator/local'],
                       results))


if __name__ == '__main__':
  main()
