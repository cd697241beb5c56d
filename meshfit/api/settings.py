"""What `fit` is given, turned into what train.py would be given: a config
(a file, a ConfigDict or dotted keys over configs/csv.py) and table paths
(a DataFrame becomes a Parquet file, named by its content)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import ml_collections

from meshfit import storage
from meshfit.input_pipeline import table_files
from meshfit.input_pipeline.paths import expand
from meshfit import config as config_lib
from meshfit.errors import UsageError

if TYPE_CHECKING:
  import pandas as pd

# A DataFrame is written as <data_dir>/FRAMES_DIR/<hash of its Parquet
# bytes>.parquet: beside the prepared copies made from it, found again by a
# refit or a resume of the same frame, and there for --mode=eval later.
FRAMES_DIR = 'frames'
# The name a DataFrame is given in messages.
FRAME_NAME = 'the DataFrame'

Data = 'pd.DataFrame | str'


def load_config_file(path: str) -> ml_collections.ConfigDict:
  """`get_config()` of a config file, as `--config=path` loads it.

  Raises:
    UsageError: the file is missing or does not define get_config().
  """
  try:
    spec = importlib.util.spec_from_file_location('meshfit_user_config',
                                                  os.path.expanduser(path))
    if spec is None or spec.loader is None:
      raise ImportError(f'not a Python file: {path}')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()
  except Exception as e:  # noqa: BLE001 (user input: reported, not a crash)
    first_line = str(e).strip().splitlines()[0] if str(e).strip() else ''
    raise UsageError(f'cannot load config file {path}: {type(e).__name__}: '
                     f'{first_line}; check the path and that it defines '
                     'get_config()') from None


def resolve_config(config: str | ml_collections.ConfigDict | Mapping | None
                   ) -> ml_collections.ConfigDict:
  """The run config `fit` was given, as a new ConfigDict.

  Args:
    config: None for configs/csv.py; a config file's path; a ConfigDict; or
      a dict of dotted keys (`{'model.hidden_sizes': (64, 64)}`) over
      configs/csv.py.
  """
  from meshfit.configs import csv  # noqa: PLC0415
  if config is None:
    return csv.get_config()
  if isinstance(config, (str, os.PathLike)):
    return load_config_file(os.fspath(config))
  if isinstance(config, ml_collections.ConfigDict):
    return ml_collections.ConfigDict(config.to_dict())
  if isinstance(config, Mapping):
    return config_lib.with_overrides(csv.get_config(), config)
  raise UsageError(f'config must be a config file, a ConfigDict or a dict '
                   f'of dotted keys, not {type(config).__name__}')


def targets_of(target: str | Sequence[str]) -> tuple[str, ...]:
  """`target` as dataset.target_columns takes it."""
  if isinstance(target, str):
    return (target,)
  targets = tuple(target)
  if not targets or not all(isinstance(t, str) for t in targets):
    raise UsageError(f'target must be a column name or a tuple of them, not '
                     f'{target!r}')
  return targets


def is_frame(data: object) -> bool:
  """Whether `data` is a pandas DataFrame (pandas imported only if it is
  in use already)."""
  import sys  # noqa: PLC0415
  pd = sys.modules.get('pandas')
  return pd is not None and isinstance(data, pd.DataFrame)


def parquet_bytes(frame: pd.DataFrame) -> bytes:
  """The Parquet file `frame.to_parquet(path, index=False)` would write."""
  buffer = io.BytesIO()
  try:
    frame.to_parquet(buffer, index=False, engine='pyarrow')
  except (ValueError, TypeError, ImportError) as e:
    raise UsageError(f'cannot write {FRAME_NAME} as Parquet ({e}); give '
                     'its columns plain names and types') from None
  return buffer.getvalue()


def frame_of(data: Data, source: str) -> pd.DataFrame:
  """The table `data` holds, as meshfit reads a file: a DataFrame goes
  through Parquet (so it reads exactly as the same frame saved to a Parquet
  file), a path is read as --input reads it."""
  if is_frame(data):
    return table_files.parse(parquet_bytes(data), f'{FRAME_NAME}.parquet',
                             source)
  return table_files.read_frame(expand(_path(data), source), source)


def path_of(data: Data, data_dir: str, source: str) -> str:
  """A path train.py could be given for `data`: a path as it is, a
  DataFrame written once to `data_dir`/FRAMES_DIR."""
  if not is_frame(data):
    return _path(data)
  content = parquet_bytes(data)
  directory = storage.join(expand(data_dir, 'dataset.data_dir'), FRAMES_DIR)
  path = storage.join(directory,
                      hashlib.sha256(content).hexdigest()[:32] + '.parquet')
  if not storage.exists(path):
    storage.makedirs(directory)
    with storage.atomic_write(path, 'wb') as f:
      f.write(content)
  return path


def _path(data: object) -> str:
  if isinstance(data, os.PathLike):
    data = os.fspath(data)
  if not isinstance(data, str):
    raise UsageError(f'data must be a pandas DataFrame or the path of CSV or '
                     f'Parquet files, not {type(data).__name__}')
  return data
