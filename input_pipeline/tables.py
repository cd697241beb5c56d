"""From a prepared TFDS split to an in-memory table of float32 arrays.

Regression tables are small enough to hold in host memory, so training
reads each split once, here, and slices batches out of numpy arrays after that.

A split is parsed with TensorFlow once (`load_table`); `read_split` then keeps
the table as a numpy file in the prepared dataset's directory and later runs
load that instead. Importing TensorFlow takes seconds, so a restart on
prepared, already read data imports neither TensorFlow nor TFDS.

A data_dir may be a gs:// URL: TFDS's files are then made and parsed in a
local temporary directory (input_pipeline/tfds_copies.py says why) and
kept in the data_dir, with the numpy files, so a later run reads a split
with one download and no TensorFlow.
"""

import contextlib
import dataclasses
import json
import os
import tempfile
import urllib.parse
import zipfile
from typing import TYPE_CHECKING

import numpy as np
from absl import logging

from meshfit import storage
from meshfit.input_pipeline import tfds_copies
from meshfit.input_pipeline.column_plan import ColumnPlan
from meshfit.input_pipeline.errors import DataError
from meshfit.input_pipeline.paths import named

if TYPE_CHECKING:
  import tensorflow_datasets as tfds

# Datasets that `prepare` generates from their name alone: the configs of
# synthetic_regression.SyntheticRegression and its version, written out here
# so that finding them prepared needs no TFDS (test_tables checks they agree).
GENERATED_DATASETS = ('synthetic_regression/linear',
                      'synthetic_regression/friedman1')
_GENERATED_VERSION = '1.0.0'
# Where `read_split` keeps parsed splits, inside a prepared dataset's
# directory. The number changes whenever `load_table` would read a split
# differently, so that tables parsed by an older meshfit are not used.
_PARSED_DIR = 'meshfit_tables.v2'
# TFDS writes it last: a directory that has it is prepared.
_INFO = 'dataset_info.json'


@dataclasses.dataclass(frozen=True)
class Table:
  """One split, whole, in file (or TFDS) order, encoded by its column plan.

  Attributes:
    x_NxF: the model's inputs, float32, one row per example, one column per
      input of `plan` (numbers with NaN where missing, category codes).
    y_NxT: targets, float32, one row per example.
    plan: what each column is: the file's columns for csv_regression,
      numbers 'x0', 'x1', ... and target 'y' (or 'y0', ...) otherwise.
  """

  x_NxF: np.ndarray
  y_NxT: np.ndarray
  plan: ColumnPlan

  def __post_init__(self):
    for name, array in (('x_NxF', self.x_NxF), ('y_NxT', self.y_NxT)):
      if array.ndim != 2 or array.dtype != np.float32:
        raise ValueError(
            f'{name} must be a 2-D float32 array, got shape {array.shape} '
            f'and dtype {array.dtype}.'
        )
    if self.x_NxF.shape[0] != self.y_NxT.shape[0]:
      raise ValueError(
          f'x_NxF has {self.x_NxF.shape[0]} rows but y_NxT has '
          f'{self.y_NxT.shape[0]}.'
      )
    if len(self.plan.input_names) != self.x_NxF.shape[1]:
      raise ValueError(
          f'{len(self.plan.input_names)} inputs in the plan for '
          f'{self.x_NxF.shape[1]} feature columns.'
      )
    if len(self.plan.targets) != self.y_NxT.shape[1]:
      raise ValueError(
          f'{len(self.plan.targets)} targets in the plan for '
          f'{self.y_NxT.shape[1]} target columns.'
      )

  @property
  def num_examples(self) -> int:
    return self.x_NxF.shape[0]

  @property
  def num_inputs(self) -> int:
    return self.x_NxF.shape[1]

  @property
  def num_targets(self) -> int:
    return self.y_NxT.shape[1]

  @property
  def columns(self) -> int:
    return self.num_inputs + self.num_targets

  @property
  def nbytes(self) -> int:
    return self.x_NxF.nbytes + self.y_NxT.nbytes

  @property
  def missing_I(self) -> np.ndarray:
    """Per input column, whether any row lacks it (NaN)."""
    return np.isnan(self.x_NxF).any(axis=0)

  def read_rows(self, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop): inputs then targets (as a prepared store's)."""
    return np.concatenate([self.x_NxF[start:stop], self.y_NxT[start:stop]],
                          axis=1)

  @property
  def feature_names(self) -> tuple[str, ...]:
    """The name of each input column (a datetime's parts apart)."""
    return self.plan.input_names

  @property
  def target_names(self) -> tuple[str, ...]:
    return self.plan.targets

  def rows(self, index: np.ndarray) -> 'Table':
    """The table of the rows `index` selects, in that order."""
    return Table(self.x_NxF[index], self.y_NxT[index], self.plan)


def generated_plan(num_features: int, num_targets: int) -> ColumnPlan:
  """The plan of a generated dataset: numbers x0, x1, ... -> y (or y0, ...)."""
  return ColumnPlan.numeric(
      tuple(f'x{i}' for i in range(num_features)),
      ('y',) if num_targets == 1 else tuple(f'y{i}' for i in range(num_targets)))


def check_data_dir(data_dir: str) -> None:
  """Raises DataError if `data_dir` exists but is not a directory, or is a
  URL that storage refuses (an unknown scheme, a missing bucket)."""
  with named('dataset.data_dir'):
    is_file = storage.exists(data_dir) and not storage.isdir(data_dir)
  if is_file:
    raise DataError(
        f'data_dir {data_dir!r} is a file; point it at a directory (it is '
        'created if missing).'
    )


def _check_generated(name: str, data_dir: str) -> None:
  if name not in GENERATED_DATASETS:
    raise DataError(
        f'unknown dataset {name!r}; use one of: '
        f'{", ".join(GENERATED_DATASETS)}.'
    )
  check_data_dir(data_dir)


def _import_tfds():
  """Imports TFDS (TensorFlow is imported later, by what reads records)."""
  # google-auth otherwise probes the GCE metadata server, which stalls for
  # seconds on machines without network before giving up.
  os.environ.setdefault('NO_GCE_CHECK', 'true')
  import tensorflow_datasets as tfds  # noqa: PLC0415  (see the module doc)
  return tfds


def prepare(name: str, data_dir: str) -> 'tfds.core.DatasetBuilder':
  """Returns the builder for `name`, generating its data first if needed.

  Nothing is downloaded: the known datasets are generated locally, and GCS is
  never asked for a pre-built copy.

  Args:
    name: 'synthetic_regression/<config>', one of `GENERATED_DATASETS`.
    data_dir: TFDS data directory; created if missing.

  Returns:
    A builder whose splits are ready for `load_table`.

  Raises:
    DataError: `name` is not a known dataset, or `data_dir` is a file.
  """
  _check_generated(name, data_dir)
  tfds = _import_tfds()
  # Registers the builder with TFDS.
  from meshfit.input_pipeline import synthetic_regression  # noqa: F401, PLC0415
  builder = tfds.builder(name, data_dir=data_dir)
  if not builder.is_prepared():
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False)
    )
  return builder


def prepare_generated(name: str, data_dir: str) -> str:
  """Where `name` is prepared in `data_dir`, generating it first if needed.

  Like `prepare`, but finding the dataset already prepared needs no TFDS.

  Args:
    name: 'synthetic_regression/<config>', one of `GENERATED_DATASETS`.
    data_dir: TFDS data directory; created if missing.

  Returns:
    The prepared dataset's directory, for `read_split`.

  Raises:
    DataError: `name` is not a known dataset, or `data_dir` is a file.
  """
  _check_generated(name, data_dir)
  # TFDS's own layout: <data_dir>/<builder>/<config>/<version>.
  directory = storage.join(data_dir, *name.split('/'), _GENERATED_VERSION)
  # TFDS writes dataset_info.json last, once the split files are complete.
  if not storage.exists(storage.join(directory, _INFO)):
    if storage.is_remote(data_dir):
      _upload_generated(name, directory)
    else:
      prepare(name, data_dir)
  return directory


def _upload_generated(name: str, directory: str) -> None:
  """Generates `name` locally, then uploads it to `directory` on gs://."""
  with tempfile.TemporaryDirectory(prefix='meshfit-tfds-') as local:
    tfds_copies.upload(prepare_generated(name, local), directory, _INFO)


def open_prepared(directory: str) -> 'tfds.core.DatasetBuilder':
  """A builder that reads the dataset prepared in `directory`.

  Args:
    directory: a prepared dataset's directory, as `prepare_generated` and
      `csv_regression.prepare` return.

  Returns:
    A builder for `load_table`.

  Raises:
    DataError: the directory holds no intact prepared dataset.
  """
  tfds = _import_tfds()
  try:
    return tfds.builder_from_directory(directory)
  except Exception as e:  # A damaged directory; its contents vary.
    raise DataError(f'cannot read the prepared dataset in {directory!r} '
                     f'({type(e).__name__}: {e}); delete that directory and '
                     'run again to prepare it afresh') from e


def _float_vector_feature(
    builder: 'tfds.core.DatasetBuilder', key: str
) -> 'tfds.features.Tensor':
  """Returns feature `key` of `builder`, checked to be a float32 vector."""
  tfds = _import_tfds()
  features = builder.info.features
  feature = features[key] if key in features else None
  if (
      not isinstance(feature, tfds.features.Tensor)
      or feature.np_dtype != np.float32
      or len(feature.shape) != 1
  ):
    raise DataError(
        f'dataset {builder.info.full_name} needs a float32 vector feature '
        f'{key!r}, but its features are {features}; use one of: '
        f'{", ".join(GENERATED_DATASETS)}.'
    )
  return feature


def load_table(builder: 'tfds.core.DatasetBuilder', split: str) -> Table:
  """Reads one whole split of a prepared dataset into memory.

  Records are read in stored order (shards in order, no shuffling), so every
  call returns the same rows in the same order. All records of the split are
  parsed by one vectorised `tf.io.parse_example` call: decoding them one by
  one through `builder.as_dataset` is far slower.

  Args:
    builder: a prepared builder, as returned by `prepare`.
    split: a split name ('train', 'test'), or a TFDS slice of one such as
      'train[:10%]'.

  Returns:
    The split's `x` and `y` features as a `Table`.

  Raises:
    DataError: the split does not exist, the dataset is not prepared, its
      features are not float32 vectors 'x' and 'y', or its files are damaged.
  """
  if not builder.is_prepared():
    raise DataError(
        f'dataset {builder.info.full_name} is not prepared in '
        f'{builder.data_dir!s}; call prepare() on it first.'
    )
  try:
    split_info = builder.info.splits[split]
  except (KeyError, ValueError) as e:
    available = ', '.join(builder.info.splits.keys())
    raise DataError(
        f'dataset {builder.info.full_name} has no split {split!r}; use one '
        f'of: {available} (or a slice such as "train[:10%]").'
    ) from e
  # Imported here, not with the module: see the module doc.
  import tensorflow as tf  # noqa: PLC0415
  x_feature = _float_vector_feature(builder, 'x')
  y_feature = _float_vector_feature(builder, 'y')
  num_examples = split_info.num_examples
  spec = builder.info.features.tf_example_spec
  spec = {'x': spec['x'], 'y': spec['y']}

  records = None
  for instruction in split_info.file_instructions:
    part = (
        tf.data.TFRecordDataset(os.fspath(instruction.filename))
        .skip(instruction.skip)
        .take(instruction.take)
    )
    records = part if records is None else records.concatenate(part)
  if num_examples == 0 or records is None:
    x_NxF = np.zeros((0, x_feature.shape[0]), np.float32)
    y_NxT = np.zeros((0, y_feature.shape[0]), np.float32)
  else:
    try:
      serialized_N = records.batch(num_examples).get_single_element()
      parsed = tf.io.parse_example(serialized_N, spec)
    except tf.errors.OpError as e:
      raise DataError(
          f'cannot read split {split!r} of {builder.info.full_name} from '
          f'{builder.data_dir!s} ({type(e).__name__}: {e.message}); delete '
          'that directory and prepare the dataset again.'
      ) from e
    x_NxF = parsed['x'].numpy()
    y_NxT = parsed['y'].numpy()
  if x_NxF.shape[0] != num_examples:
    raise DataError(
        f'split {split!r} of {builder.info.full_name} should have '
        f'{num_examples} rows but its files in {builder.data_dir!s} hold '
        f'{x_NxF.shape[0]}; delete that directory and prepare the dataset '
        'again.'
    )
  return Table(x_NxF=x_NxF, y_NxT=y_NxT,
               plan=generated_plan(x_NxF.shape[1], y_NxT.shape[1]))


def _parsed_path(directory: str, split: str) -> str:
  """Where `read_split` keeps `split` of the dataset in `directory`."""
  # Quoted: split names may hold slices such as 'train[:10%]'.
  return storage.join(directory, _PARSED_DIR,
                      urllib.parse.quote(split, safe='') + '.npz')


def _load_parsed(path: str) -> Table | None:
  """The table kept at `path`, or None if there is none or it is unusable."""
  try:
    with storage.open(path, 'rb') as f, np.load(f, allow_pickle=False
                                                 ) as arrays:
      return Table(x_NxF=arrays['x_NxF'], y_NxT=arrays['y_NxT'],
                   plan=ColumnPlan.from_json(json.loads(str(arrays['plan']))))
  except FileNotFoundError:
    return None
  except (OSError, KeyError, ValueError, zipfile.BadZipFile,
          storage.StorageError) as e:
    # Written atomically, so only outside damage gets here: parse again.
    logging.warning('Ignoring %s, which cannot be read (%s: %s); the split '
                    'is parsed again.', path, type(e).__name__, e)
    return None


def _save_parsed(path: str, table: Table) -> None:
  """Keeps `table` at `path`, atomically; failing to only costs time later."""
  # The processes of a job may share a data_dir and all write the same
  # table at once; atomic_write has each replace the file whole.
  try:
    storage.makedirs(storage.dirname(path))
    with storage.atomic_write(path, 'wb') as f:
      np.savez(f, x_NxF=table.x_NxF, y_NxT=table.y_NxT,
               plan=np.array(json.dumps(table.plan.to_json())))
  except (OSError, storage.StorageError) as e:  # read-only, a full disk
    logging.warning('Could not keep the parsed split in %s (%s); later runs '
                    'parse it again.', path, e)


def read_split(directory: str, split: str) -> Table:
  """`load_table` of the dataset prepared in `directory`, kept as numpy.

  The first read of a split parses it with TensorFlow and keeps the table in
  `directory`; later reads load that copy without TensorFlow or TFDS. A
  prepared directory never changes (a changed CSV file is prepared into
  another), so the copy stays valid; deleting the directory deletes it too.

  Args:
    directory: a prepared dataset, as `prepare_generated` and
      `csv_regression.prepare` return.
    split: a split name ('train', 'test'), or a TFDS slice of one such as
      'train[:10%]'.

  Returns:
    The same table as `load_table` returns for this split.

  Raises:
    DataError: as `load_table` and `open_prepared`.
  """
  path = _parsed_path(directory, split)
  table = _load_parsed(path)
  if table is None:
    with (tfds_copies.downloaded(directory, _PARSED_DIR)
          if storage.is_remote(directory)
          else contextlib.nullcontext(directory)) as local:
      table = load_table(open_prepared(local), split)
    _save_parsed(path, table)
  return table
