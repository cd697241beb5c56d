"""Dataset `csv_regression`: a user's own CSV or Parquet tables, as they come.

The config keys `dataset.train_path`, `dataset.eval_path`,
`dataset.target_columns`, `dataset.feature_columns` and
`dataset.categorical_columns` choose the data. Preparing reads both files,
fits the column plan on the training file (input_pipeline/column_plan.py),
encodes both with it and keeps the result in
`<data_dir>/csv_regression/<key>/`: `manifest.json` (the plan, the row
counts, the training file's content key) and one `<split>.npz` per split,
`train` (the training file) and `test` (the evaluation file), rows in file
order. The key is a sha256 of both files' bytes and the selection, so a
prepared dataset is found again while the files are unchanged (wherever they
are moved) and a changed file is prepared afresh.

Rows whose target is missing are left out of both splits, counted in the
manifest and in one warning line.
"""

import hashlib
import json
import os
from collections.abc import Sequence

import numpy as np
from absl import logging

from input_pipeline import column_plan, table_files
from input_pipeline.column_plan import ColumnPlan
from input_pipeline.errors import DataError
from input_pipeline.tables import Table

NAME = 'csv_regression'
SPLITS = ('train', 'test')
MANIFEST = 'manifest.json'
# Changing how files are parsed, encoded or stored must change the key.
_KEY_SCHEMA = 'meshfit.csv_regression/2'


def content_key(train_data: bytes, eval_data: bytes,
                target_columns: Sequence[str],
                feature_columns: Sequence[str],
                categorical_columns: Sequence[str] = ()) -> str:
  """The prepared dataset's name for these file contents and selection."""
  digest = hashlib.sha256()
  selection = json.dumps([_KEY_SCHEMA, list(target_columns),
                          list(feature_columns), list(categorical_columns)])
  for part in (selection.encode(), train_data, eval_data):
    # Length prefixes: no two different inputs concatenate to the same bytes.
    digest.update(len(part).to_bytes(8, 'little'))
    digest.update(part)
  return f'sha256_{digest.hexdigest()[:32]}'


def file_key(data: bytes) -> str:
  """A short content key of one file (what a checkpoint was trained on)."""
  return f'sha256_{hashlib.sha256(data).hexdigest()[:16]}'


def prepared_dir(data_dir: str, key: str) -> str:
  """Where the dataset of content key `key` is prepared."""
  return os.path.join(data_dir, NAME, key)


def prepare(train_path: str, eval_path: str, target_columns: Sequence[str],
            feature_columns: Sequence[str],
            categorical_columns: Sequence[str], data_dir: str) -> str:
  """Where the dataset of these files is prepared, preparing it if needed.

  Args:
    train_path: CSV or Parquet training file with a header row.
    eval_path: CSV or Parquet evaluation file with the same columns.
    target_columns: one or more columns to predict.
    feature_columns: input columns; () means every other usable column.
    categorical_columns: columns to treat as categories whatever they hold.
    data_dir: where prepared datasets are kept; created if missing.

  Returns:
    The prepared dataset's directory, for `read_split` and `manifest`.

  Raises:
    DataError: a missing, unreadable or bad file (the message names the
      file, the column and the first bad row).
  """
  sources = ('dataset.train_path', 'dataset.eval_path')
  train_data = table_files.read_bytes(train_path, sources[0])
  eval_data = table_files.read_bytes(eval_path, sources[1])
  key = content_key(train_data, eval_data, target_columns, feature_columns,
                    categorical_columns)
  directory = prepared_dir(data_dir, key)
  if os.path.exists(os.path.join(directory, MANIFEST)):
    return directory
  train = table_files.parse(train_data, train_path, sources[0])
  test = table_files.parse(eval_data, eval_path, sources[1])
  plan = column_plan.fit(train, target_columns, feature_columns,
                         categorical_columns, train_path, sources[0])
  if (warning := column_plan.left_out_warning(plan)) is not None:
    logging.warning('csv_regression: %s.', warning)
  tables, dropped = {}, {}
  for split, frame, path, source in (('train', train, train_path, sources[0]),
                                     ('test', test, eval_path, sources[1])):
    x_NxI, unseen = plan.encode(frame, path, source)
    y_NxT = plan.targets_of(frame, path, source)
    keep = ~np.isnan(y_NxT).any(axis=1)
    dropped[split] = int((~keep).sum())
    if dropped[split]:
      logging.warning('csv_regression: %d of the %d rows of %s have no %s and '
                      'are left out of %s.', dropped[split], len(frame), path,
                      ' or '.join(plan.targets),
                      'training' if split == 'train' else 'evaluation')
    if unseen and split == 'test':
      logging.warning('csv_regression: %s of %s hold categories the '
                      'training file does not have (unknown to the model): '
                      '%s.', ', '.join(f'{n} rows' for n in unseen.values()),
                      path, ', '.join(unseen))
    tables[split] = Table(x_NxI[keep], y_NxT[keep], plan)
    if not keep.any():
      raise DataError(f'{table_files.describe(path, source)} has no row with '
                      f'a value for {", ".join(plan.targets)}; give it rows '
                      'whose target is known')
  logging.info('csv_regression: %s; %d train and %d test rows of %s and %s '
               'prepared into %s.', plan.describe(),
               tables['train'].num_examples, tables['test'].num_examples,
               train_path, eval_path, directory)
  _write(directory, tables, {
      'plan': plan.to_json(), 'rows': {s: tables[s].num_examples
                                       for s in SPLITS},
      'rows_without_target': dropped, 'train_key': file_key(train_data),
      'train_path': os.path.abspath(train_path),
      'eval_path': os.path.abspath(eval_path)})
  return directory


def _write(directory: str, tables: dict[str, Table], manifest: dict) -> None:
  """Writes the splits, then the manifest: its presence means complete."""
  os.makedirs(directory, exist_ok=True)
  for split, table in tables.items():
    tmp = os.path.join(directory, f'{split}.{os.getpid()}.tmp.npz')
    np.savez(tmp, x_NxF=table.x_NxF, y_NxT=table.y_NxT)
    os.replace(tmp, os.path.join(directory, f'{split}.npz'))
  tmp = os.path.join(directory, f'{MANIFEST}.{os.getpid()}.tmp')
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
  os.replace(tmp, os.path.join(directory, MANIFEST))


def manifest(directory: str) -> dict:
  """The manifest of a prepared dataset (plan, rows, the train file's key)."""
  try:
    with open(os.path.join(directory, MANIFEST), encoding='utf-8') as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise DataError(f'cannot read the prepared dataset in {directory!r} '
                    f'({type(e).__name__}: {e}); delete that directory and '
                    'run again to prepare it afresh') from None


def read_split(directory: str, split: str) -> Table:
  """One split of a prepared dataset, whole.

  Raises:
    DataError: no such split, or the directory is damaged.
  """
  if split not in SPLITS:
    raise DataError(f'csv_regression has no split {split!r}; its splits are '
                    f'{" and ".join(SPLITS)} (the training and evaluation '
                    'files)')
  plan = ColumnPlan.from_json(manifest(directory)['plan'])
  path = os.path.join(directory, f'{split}.npz')
  try:
    with np.load(path, allow_pickle=False) as arrays:
      return Table(arrays['x_NxF'], arrays['y_NxT'], plan)
  except (OSError, KeyError, ValueError) as e:
    raise DataError(f'cannot read {path!r} ({type(e).__name__}: {e}); delete '
                    f'{directory!r} and run again to prepare it afresh'
                    ) from None
