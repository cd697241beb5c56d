"""The synthetic big table of benchmarks/scale.py and first_minute.py:
20 float32 features and one target, in 8 Parquet files, and an evaluation
file of 100k rows."""

import os

import numpy as np

FEATURES = 20
FILES = 8
EVAL_ROWS = 100_000


def generate(directory: str, rows: int) -> tuple[str, str]:
  """The table's 8 training files (a glob) and its evaluation file, written
  unless present: y = tanh(x w) + noise, x standard normal."""
  import pyarrow as pa  # noqa: PLC0415
  import pyarrow.parquet as pq  # noqa: PLC0415
  os.makedirs(directory, exist_ok=True)
  w = np.random.default_rng(0).standard_normal(FEATURES) / np.sqrt(FEATURES)
  names = [f'x{i}' for i in range(FEATURES)]

  def write(path: str, n: int, seed: int) -> None:
    if os.path.exists(path):
      return
    rng = np.random.default_rng(seed)
    writer = None
    for start in range(0, n, 1 << 20):
      x = rng.standard_normal((min(1 << 20, n - start), FEATURES), np.float32)
      y = (np.tanh(x @ w) + 0.1 * rng.standard_normal(len(x))).astype(
          np.float32)
      table = pa.table({**{c: x[:, i] for i, c in enumerate(names)}, 'y': y})
      if writer is None:
        writer = pq.ParquetWriter(path + '.tmp', table.schema)
      writer.write_table(table, row_group_size=1 << 20)
    writer.close()
    os.replace(path + '.tmp', path)

  bounds = np.linspace(0, rows, FILES + 1).astype(int)
  for i in range(FILES):
    write(os.path.join(directory, f'train-{i:02d}.parquet'),
          int(bounds[i + 1] - bounds[i]), 1 + i)
  write(os.path.join(directory, 'eval.parquet'), EVAL_ROWS, 100)
  return (os.path.join(directory, 'train-*.parquet'),
          os.path.join(directory, 'eval.parquet'))
