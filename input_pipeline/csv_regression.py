"""Dataset `csv_regression`: a user's own CSV or Parquet tables, as they come.

The config keys `dataset.train_path` (a file, a glob, or several of them
separated by commas: a table that comes sharded), `dataset.eval_path`,
`dataset.target_columns`, `dataset.feature_columns` and
`dataset.categorical_columns` choose the data. Preparing fits the column
plan (input_pipeline/column_plan.py) on the training files, encodes every
file with it, a chunk of CHUNK_ROWS rows at a time (pyarrow's Parquet
reader, pandas' chunked CSV reader), and keeps the result in
`<data_dir>/csv_regression/<key>/`: one part per file of float32 rows
(input_pipeline/store.py), `train-NNNNN.f32` for the training files in
order and `test-00000.f32` for the evaluation file (none without one: a
run then estimates its error on its validation rows), each with a
`<part>.json` of its counts, and `manifest.json`, written last (the plan,
the parts, the row counts, the training data's content key). The key is a
sha256 of every file's digest (input_pipeline/file_keys.py) and the
selection, so a prepared dataset is found again while the files are
unchanged (wherever they are moved) and a changed file is prepared afresh.
No process ever holds a whole file, and with several processes each hashes
only its share of the files.

The files and data_dir may be local or gs:// URLs (input_pipeline/paths.py):
every file goes through the `storage` layer, a table on gs:// is read by
ranged reads, and every file of the prepared copy is written whole (objects
appear whole on upload), so what exists is complete there too.

The plan is fit on the training rows when they number at most
PLAN_SAMPLE_ROWS, else on the first rows of each file (an equal share of
PLAN_SAMPLE_ROWS each): kinds, date parts and category vocabularies come
from that sample (a category value it lacks is unknown to the model, as a
rare one is).

With several processes, training file i is encoded by process i % P and the
evaluation file by process 0; process 0 fits the plan (`plan.json`) and
writes the manifest. A process that finds a piece missing after the others
made it (its data_dir is not shared with them) makes it itself, so the result
is the same files whatever the number of processes.

Rows whose target is missing are left out of both splits, counted in the
manifest and in one warning line.
"""

import collections
import contextlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from absl import logging

from meshfit import storage
from meshfit.input_pipeline import (cells, column_kinds, column_plan, file_keys,
                            table_files)
from meshfit.input_pipeline.column_plan import ColumnPlan
from meshfit.input_pipeline.errors import DataError
from meshfit.input_pipeline.paths import named
from meshfit.input_pipeline.store import Part, Store, write_part
from meshfit.input_pipeline.tables import Table

NAME = 'csv_regression'
SPLITS = ('train', 'test')
MANIFEST = 'manifest.json'
PLAN = 'plan.json'
# Rows read, encoded and written at a time: bounds a process's memory.
CHUNK_ROWS = 1 << 18
# The column plan is fit on at most about this many training rows.
PLAN_SAMPLE_ROWS = 1 << 20

Barrier = Callable[[str], None]


def prepared_dir(data_dir: str, key: str) -> str:
  """Where the dataset of content key `key` is prepared."""
  return storage.join(data_dir, NAME, key)


def prepare(train_path: str | Sequence[str], eval_path: str | None,
            target_columns: Sequence[str], feature_columns: Sequence[str],
            categorical_columns: Sequence[str], data_dir: str, *,
            category_min_count: int = column_plan.MIN_COUNT,
            process_index: int = 0, process_count: int = 1,
            barrier: Barrier | None = None,
            gather: file_keys.Gather | None = None) -> str:
  """Where the dataset of these files is prepared, preparing it if needed.

  Every process of a job calls it (with `barrier`, which returns once all
  of them reached it); each prepares its share (see the module doc).

  Args:
    train_path: CSV or Parquet training file(s) with a header row: a path,
      a glob, or a sequence of them.
    eval_path: CSV or Parquet evaluation file with the same columns; ''
      or None: none (the prepared dataset has no test part).
    target_columns: one or more columns to predict.
    feature_columns: input columns; () means every other usable column.
    categorical_columns: columns to treat as categories whatever they hold.
    data_dir: where prepared datasets are kept; created if missing.
    category_min_count: a category value seen fewer times in training is
      unknown to the model.
    process_index: this process, 0..process_count - 1.
    process_count: the processes preparing together.
    barrier: waits for every process (None: a single process).
    gather: hands every process the others' arrays (None: a single
      process); each process hashes only its share of the files.

  Returns:
    The prepared dataset's directory, for `open_split` and `manifest`.

  Raises:
    DataError: a missing, unreadable or bad file (the message names the
      file, the column and the first bad row).
  """
  sources = ('dataset.train_path', 'dataset.eval_path')
  files = file_keys.train_files(train_path)
  evals = [eval_path] if eval_path else []
  digests = file_keys.digests([*files, *evals],
                     [sources[0]] * len(files) + [sources[1]] * len(evals),
                     process_index, process_count, gather)
  # No eval file keys as an empty digest: never a file's 32 bytes.
  digests, eval_digest = digests[:len(files)], b''.join(digests[len(files):])
  directory = prepared_dir(data_dir, file_keys.content_key(
      digests, eval_digest, target_columns, feature_columns,
      categorical_columns, category_min_count))
  with named('dataset.data_dir'):
    if storage.exists(storage.join(directory, MANIFEST)):
      return directory
  try:
    _prepare(directory, files, eval_path, digests,
             {'target_columns': target_columns,
              'feature_columns': feature_columns,
              'categorical_columns': categorical_columns,
              'min_count': category_min_count},
             process_index, process_count, barrier or (lambda name: None))
  except DataError:
    # A bad file leaves nothing behind (an incomplete directory has no
    # manifest and would only be prepared again).
    _remove(directory)
    raise
  return directory


def _remove(directory: str) -> None:
  """Deletes `directory`, and its parent if that is left empty."""
  with contextlib.suppress(OSError, storage.StorageError):
    storage.rmtree(directory)
  # gs:// has no empty directories. The layer has no rmdir, and removing
  # the parent only if empty must be one call: another process may be
  # preparing beside.
  if not storage.is_remote(directory):
    with contextlib.suppress(OSError):
      os.rmdir(os.path.dirname(directory))


def _prepare(directory: str, files: Sequence[str], eval_path: str | None,
             digests: Sequence[bytes], selection: dict[str, Any],
             process_index: int, process_count: int, wait: Barrier) -> None:
  """`prepare`'s work, its share of it for this process."""
  sources = ('dataset.train_path', 'dataset.eval_path')
  storage.makedirs(directory)
  train_parts = [(f'train-{i:05d}', path, sources[0]) for i, path in
                 enumerate(files)]
  eval_parts = [('test-00000', eval_path, sources[1])] if eval_path else []
  parts = train_parts + eval_parts
  mine = [p for i, p in enumerate(train_parts)
          if i % process_count == process_index]
  if process_index == 0:
    mine += eval_parts

  def step(name: str, work: Callable[[], None]) -> None:
    # A DataError is raised after the barrier: the others would wait there.
    error = None
    try:
      work()
    except DataError as e:
      error = e
    wait(f'meshfit:csv_regression:{name}')
    if error is not None:
      raise error

  step('plan', lambda: _write_plan(directory, files, sources[0], selection)
       if process_index == 0 else None)
  if not storage.exists(storage.join(directory, PLAN)):
    _write_plan(directory, files, sources[0], selection)  # not shared
  plan = _read_plan(directory)
  step('parts', lambda: [_encode_part(directory, plan, *p) for p in mine])
  for part in parts:
    if not storage.exists(storage.join(directory, f'{part[0]}.json')):
      _encode_part(directory, plan, *part)  # not shared
  step('manifest', lambda: _write_manifest(
      directory, plan, parts, digests, files, eval_path)
       if process_index == 0 else None)
  if not storage.exists(storage.join(directory, MANIFEST)):
    _write_manifest(directory, plan, parts, digests, files, eval_path)


def _sample(files: Sequence[str], source: str):
  """The rows the plan is fit on: every training row up to
  PLAN_SAMPLE_ROWS, else each file's first PLAN_SAMPLE_ROWS / len(files)."""
  import pandas as pd  # noqa: PLC0415  (slow to import: see table_files)
  share = -(-PLAN_SAMPLE_ROWS // len(files))
  frames = []
  for path in files:
    taken = 0
    for frame, _ in table_files.iter_frames(path, source, CHUNK_ROWS):
      frames.append(frame.iloc[:share - taken])
      taken += len(frames[-1])
      if taken >= share:
        break
  return frames[0] if len(frames) == 1 else pd.concat(frames,
                                                      ignore_index=True)


def _write_plan(directory: str, files: Sequence[str], source: str,
                selection: dict[str, Any]) -> None:
  frame = _sample(files, source)
  name = files[0] if len(files) == 1 else ', '.join(files)
  try:
    plan = column_kinds.fit(frame, path=name, source=source, **selection)
  except DataError:
    if len(files) == 1:
      raise
    # Name the file and its row: fit each file's sample alone.
    for path in files:
      column_kinds.fit(_sample([path], source), path=path, source=source,
                       **selection)
    raise
  if (warning := column_kinds.left_out_warning(plan)) is not None:
    logging.warning('csv_regression: %s.', warning)
  _warn_of_tokens(files, plan)
  for target in plan.targets:
    values = cells.without_tokens(frame[target]).dropna()
    if len(values) and cells.is_constant(values):
      logging.warning(
          'csv_regression: target %r holds %s in every training row: the '
          'model can only learn to predict that, and r2 (which compares '
          'the error with the target\'s spread) is none, written null.',
          target, cells.as_text(values.iloc[0]))
  _write_json(storage.join(directory, PLAN), plan.to_json())


def _warn_of_tokens(files: Sequence[str], plan: ColumnPlan) -> None:
  """Warns of a category whose cells hold a token that means missing as
  often as a value (`NA` among country codes: Namibia's)."""
  categories = [c.name for c in plan.features if c.kind == 'category']
  counts = collections.Counter()
  for path in files:
    for column, tokens in table_files.missing_tokens(
        path, categories, -(-PLAN_SAMPLE_ROWS // len(files))).items():
      counts.update({(column, t): n for t, n in tokens.items()})
  for (column, token), n in sorted(counts.items()):
    if n >= plan.min_count:
      logging.warning(
          'csv_regression: column %r holds %r in %d cells, which meshfit '
          'reads as missing, as every token of docs/usage.md\'s list; if '
          'it is a value there (NA: Namibia), write it otherwise in the '
          'files (%r), or it stays missing in training and predictions.',
          column, token, n, f'{token}_')


def _read_plan(directory: str) -> ColumnPlan:
  try:
    with storage.open(storage.join(directory, PLAN)) as f:
      return ColumnPlan.from_json(json.load(f))
  except (OSError, json.JSONDecodeError, storage.StorageError) as e:
    raise DataError(f'cannot read the column plan in {directory!r} '
                    f'({type(e).__name__}: {e}); delete that directory and '
                    'run again to prepare it afresh') from None


def _encode_part(directory: str, plan: ColumnPlan, part: str, path: str,
                 source: str) -> None:
  """Encodes one file into part `part`: its rows, then `<part>.json`."""
  columns = len(plan.input_names) + len(plan.targets)
  counts = {'rows_in_file': 0, 'rows_without_target': 0, 'unseen': {}}
  missing = np.zeros(len(plan.input_names), bool)

  def chunks() -> Iterator[np.ndarray]:
    nonlocal missing
    for frame, first_row in table_files.iter_frames(path, source, CHUNK_ROWS):
      x_NxI, unseen = plan.encode(frame, path, source, first_row,
                                  training=True)
      y_NxT = plan.targets_of(frame, path, source, first_row)
      keep = ~np.isnan(y_NxT).any(axis=1)
      counts['rows_in_file'] += len(frame)
      counts['rows_without_target'] += int((~keep).sum())
      for column, n in unseen.items():
        counts['unseen'][column] = counts['unseen'].get(column, 0) + n
      missing |= np.isnan(x_NxI[keep]).any(axis=0)
      yield np.concatenate([x_NxI[keep], y_NxT[keep]], axis=1)

  rows = write_part(storage.join(directory, f'{part}.f32'), chunks(),
                    columns)
  dropped = counts['rows_without_target']
  training = part.startswith('train')
  if dropped:
    logging.warning('csv_regression: %d of the %d rows of %s have no %s and '
                    'are left out of %s.', dropped, counts['rows_in_file'],
                    path, ' or '.join(plan.targets),
                    'training' if training else 'evaluation')
  if counts['unseen'] and not training:
    logging.warning('csv_regression: %s.', column_plan.unseen_warning(
        counts['unseen'], path, plan.min_count))
  if not rows:
    raise DataError(f'{table_files.describe(path, source)} has no row with '
                    f'a value for {", ".join(plan.targets)}; give it rows '
                    'whose target is known')
  _write_json(storage.join(directory, f'{part}.json'), {
      'rows': rows, 'rows_without_target': dropped,
      'missing': missing.tolist(), 'path': storage.absolute(path)})


def _write_manifest(directory: str, plan: ColumnPlan,
                    parts: Sequence[tuple[str, str, str]],
                    digests: Sequence[bytes], files: Sequence[str],
                    eval_path: str | None) -> None:
  info = {}
  for part, _, _ in parts:
    with storage.open(storage.join(directory, f'{part}.json')) as f:
      info[part] = json.load(f)
  split_parts = {s: [p for p, _, _ in parts if p.startswith(s)]
                 for s in SPLITS}
  manifest_ = {
      'plan': plan.to_json(),
      'parts': {s: [Part(f'{p}.f32', info[p]['rows']).to_json()
                    for p in names] for s, names in split_parts.items()},
      'rows': {s: sum(info[p]['rows'] for p in names)
               for s, names in split_parts.items()},
      'rows_without_target': {
          s: sum(info[p]['rows_without_target'] for p in names)
          for s, names in split_parts.items()},
      'missing': np.any([info[p]['missing'] for p in split_parts['train']],
                        axis=0).tolist(),
      'train_key': file_keys.file_key(digests),
      'train_path': [storage.absolute(f) for f in files],
      'eval_path': storage.absolute(eval_path) if eval_path else None}
  rows = manifest_['rows']
  logging.info('csv_regression: %s; %s prepared into %s.', plan.describe(),
               f'{rows["train"]} train and {rows["test"]} test rows of '
               f'{", ".join(files)} and {eval_path}' if eval_path else
               f'{rows["train"]} train rows of {", ".join(files)} (no eval '
               'file)', directory)
  _write_json(storage.join(directory, MANIFEST), manifest_)


def _write_json(path: str, value: dict) -> None:
  """Atomically: a reader sees the whole file or none."""
  with storage.atomic_write(path) as f:
    json.dump(value, f, indent=1, sort_keys=True)


def manifest(directory: str) -> dict:
  """The manifest of a prepared dataset (plan, parts, rows, the train key)."""
  try:
    with storage.open(storage.join(directory, MANIFEST)) as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError, storage.StorageError) as e:
    raise DataError(f'cannot read the prepared dataset in {directory!r} '
                    f'({type(e).__name__}: {e}); delete that directory and '
                    'run again to prepare it afresh') from None


def open_split(directory: str, split: str) -> Store:
  """One split of a prepared dataset, on disk: read it in blocks.

  Raises:
    DataError: no such split, or the directory is damaged.
  """
  if split not in SPLITS:
    raise DataError(f'csv_regression has no split {split!r}; its splits are '
                    f'{" and ".join(SPLITS)} (the training and evaluation '
                    'files)')
  info = manifest(directory)
  if split == 'test' and info.get('eval_path', '') is None:
    raise DataError(f'the dataset prepared in {directory!r} has no eval file '
                    '(dataset.eval_path was empty); give one with '
                    '--config.dataset.eval_path=FILE')
  try:
    return Store(directory, [Part.from_json(p) for p in info['parts'][split]],
                 ColumnPlan.from_json(info['plan']),
                 info['missing'] if split == 'train' else None)
  except (KeyError, TypeError, ValueError) as e:
    raise DataError(f'cannot read the prepared dataset in {directory!r} '
                    f'({type(e).__name__}: {e}); delete that directory and '
                    'run again to prepare it afresh') from None


def read_split(directory: str, split: str) -> Table:
  """One split of a prepared dataset, whole, in memory.

  Raises:
    DataError: no such split, or the directory is damaged.
  """
  store = open_split(directory, split)
  try:
    x, y = store.read(0, store.num_examples)
  finally:
    store.close()
  return Table(x, y, store.plan)
