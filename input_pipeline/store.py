"""Prepared tables on disk, read in blocks of rows by whichever process needs them.

A prepared split is a list of *parts*, each a file of raw little-endian
float32 rows (row-major: a row's model inputs, then its targets; NumPy's
`np.fromfile`/`np.memmap` layout, shape in the manifest), in table order.
Rows [a, b) of a split are a handful of contiguous byte ranges, so a process
reads a block of rows with one read per part it spans and never holds the
rest. Parts are written whole (`storage.atomic_write`: renamed into place
locally, uploaded as one object on gs://, where objects appear whole), so a
part that exists is complete.

We chose this over ArrayRecord (one record per block of rows, read through
Grain): a block here costs one `preadv` (one ranged GET on gs://) and no
decoding or per-record Python, and the order (input_pipeline/order.py)
already decides which blocks each process reads, which is what Grain's
index sampler would add. docs/performance.md measures the preparation and
reading speeds.
"""

import dataclasses
import os
from collections.abc import Iterable, Sequence

import numpy as np

from meshfit import storage
from meshfit.input_pipeline.column_plan import ColumnPlan
from meshfit.input_pipeline.errors import DataError

DTYPE = np.dtype('<f4')


@dataclasses.dataclass(frozen=True)
class Part:
  """One file of a prepared split: its name (in the store's directory) and
  how many rows it holds."""
  file: str
  rows: int

  def to_json(self) -> dict:
    return {'file': self.file, 'rows': self.rows}

  @classmethod
  def from_json(cls, data: dict) -> 'Part':
    return cls(str(data['file']), int(data['rows']))


def write_part(path: str, chunks: Iterable[np.ndarray], columns: int) -> int:
  """Writes the rows of `chunks` (each n x `columns` float32) to `path`.

  A reader never sees half a part (see the module doc); the processes of a
  job may write the same part at once, each replacing it whole.

  Returns:
    The number of rows written.
  """
  rows = 0
  with storage.atomic_write(path, 'wb') as f:
    for chunk in chunks:
      chunk = np.ascontiguousarray(chunk, DTYPE)
      if chunk.ndim != 2 or chunk.shape[1] != columns:
        raise ValueError(f'a chunk of shape {chunk.shape} for a part of '
                         f'{columns} columns')
      if chunk.size:  # a chunk of no rows (none has a target) has no view
        f.write(memoryview(chunk).cast('B'))
      rows += chunk.shape[0]
  return rows


class Store:
  """One prepared split: `read(a, b)` returns its rows [a, b)."""

  def __init__(self, directory: str, parts: Sequence[Part], plan: ColumnPlan,
               missing_I: Sequence[bool] | None = None):
    """Args:
      directory: where the parts' files are.
      parts: the split's parts, in table order.
      plan: the column plan (how many inputs and targets a row holds).
      missing_I: per model input, whether any row of the split lacks it
        (NaN), counted when the split was prepared.
    """
    self.directory = directory
    self.plan = plan
    self.parts = tuple(parts)
    self.num_inputs = len(plan.input_names)
    self.num_targets = len(plan.targets)
    self.columns = self.num_inputs + self.num_targets
    self._ends = np.cumsum([p.rows for p in self.parts], dtype=np.int64)
    self.missing_I = (np.zeros(self.num_inputs, bool) if missing_I is None
                      else np.asarray(missing_I, bool))
    self._readers = {}
    for part in self.parts:
      path = storage.join(directory, part.file)
      try:
        size = storage.size(path)
      except FileNotFoundError:
        size = -1
      if size != part.rows * self.columns * DTYPE.itemsize:
        raise DataError(
            f'the prepared file {path!r} should hold {part.rows} rows of '
            f'{self.columns} float32 columns but '
            f'{"is missing" if size < 0 else f"has {size} bytes"}; delete '
            f'{directory!r} and run again to prepare the data afresh')

  @property
  def num_examples(self) -> int:
    return int(self._ends[-1]) if len(self._ends) else 0

  @property
  def target_names(self) -> tuple[str, ...]:
    return self.plan.targets

  @property
  def nbytes(self) -> int:
    return self.num_examples * self.columns * DTYPE.itemsize

  def read_rows(self, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) as one (stop - start) x columns float32 array."""
    if not 0 <= start <= stop <= self.num_examples:
      raise IndexError(f'rows [{start}, {stop}) of a split of '
                       f'{self.num_examples}')
    out = np.empty((stop - start, self.columns), DTYPE)
    view = memoryview(out).cast('B')
    row_bytes = self.columns * DTYPE.itemsize
    at = start
    part = int(np.searchsorted(self._ends, start, side='right'))
    while at < stop:
      part_start = int(self._ends[part - 1]) if part else 0
      take = min(stop, int(self._ends[part])) - at
      done = (at - start) * row_bytes
      want = take * row_bytes
      if self._read_into(part, view[done:done + want],
                         (at - part_start) * row_bytes) != want:
        raise DataError(f'{self.parts[part].file} in {self.directory!r} is '
                        'shorter than its manifest says; delete that '
                        'directory and run again to prepare it afresh')
      at += take
      part += 1
    return out

  def read(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of rows [start, stop)."""
    rows = self.read_rows(start, stop)
    return (np.ascontiguousarray(rows[:, :self.num_inputs]),
            np.ascontiguousarray(rows[:, self.num_inputs:]))

  def _read_into(self, part: int, out: memoryview, offset: int) -> int:
    """Reads part `part` from `offset` into `out`; the bytes read.

    No shared file position either way, so threads may read at once.
    """
    reader = self._reader(part)
    if isinstance(reader, int):
      # preadv straight into the output: RangeReader's pread returns new
      # bytes, and copying those again slows page-cache reads markedly.
      return os.preadv(reader, [out], offset)
    data = reader.read_at(offset, len(out))
    out[:len(data)] = data
    return len(data)

  def _reader(self, part: int) -> int | storage.RangeReader:
    """A local part's descriptor, or a gs:// part's RangeReader."""
    if part not in self._readers:
      path = storage.join(self.directory, self.parts[part].file)
      self._readers[part] = (storage.RangeReader(path)
                             if storage.is_remote(path)
                             else os.open(path, os.O_RDONLY))
    return self._readers[part]

  def close(self) -> None:
    for reader in self._readers.values():
      if isinstance(reader, int):
        os.close(reader)
      else:
        reader.close()
    self._readers = {}
