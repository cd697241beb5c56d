"""The run's tables: prepared once per job, then read by every process."""

import dataclasses

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from meshfit import storage
from meshfit.input_pipeline import column_plan, csv_regression, table_files, tables
from meshfit.input_pipeline.column_plan import ColumnPlan
from meshfit.input_pipeline.errors import DataError
from meshfit.input_pipeline.order import Blocks, fold_blocks, hold_out_blocks
from meshfit.input_pipeline.paths import expand, named
from meshfit.input_pipeline.store import Store
from meshfit.input_pipeline.tables import Table
from meshfit.config import Config, DatasetConfig

# Mixed into the seed of the validation split, so that it is drawn apart
# from the epochs' orders (which use the seed itself).
_VALIDATION_STREAM = 0x5EED
# The feature statistics (medians, quantiles, means) are computed from at
# most about this many training rows: every k-th block of a larger table.
# Their sampling error is ~0.1% of a standard deviation; numpy's quantiles
# of 2^20 rows took 3 of the 10 s to a 1M-row table's first step.
STATS_ROWS = 1 << 18
# Cross-fitting deals the training rows into folds in blocks of this many
# consecutive rows. Checkpoints record it: a run whose folds were dealt
# otherwise (meshfit before it dealt rows) does not resume on these.
FOLD_ROWS = 1
# A table too large to cross-fit (streamed from disk) validates on about
# this many held-out rows instead, at most MAX_FRACTION of it: enough that
# the best step's loss is not noise (its standard error ~0.5%), few enough
# to evaluate every epoch and hold in memory beside the streamed table.
VALIDATION_ROWS = 1 << 16
MAX_FRACTION = 0.2


@dataclasses.dataclass(frozen=True)
class Splits:
  """The tables of a run.

  Attributes:
    train: every row of the training split: in memory (`Table`), or, when
      larger than `dataset.resident_table_mb`, prepared on disk (`Store`)
      and read block by block.
    eval: the evaluation split; None for a user's table without an eval
      file (the validation rows' metrics estimate the model's error then).
    validation: rows held out of the training split to pick the best step,
      or None without validation.
    train_key: names the training data's content; every checkpoint records
      it, and a run resumes only on the same data.
    train_blocks: the blocks of `train` trained on (those not held out);
      None: all of it.
    folds: cross-fitting (`dataset.validation` folds): the training rows
      dealt into folds (a block per row); member m trains on every fold but
      fold m % F. `validation` is then the whole training table,
      `validation_fold_N` the fold of each of its rows and `train_blocks`
      every row.
    validation_fold_N: with folds, each validation row's fold.
    held_out_fraction: the fraction of `train` held out for validation (0:
      none, or folds).
  """
  train: Table | Store
  eval: Table | None
  validation: Table | None = None
  train_key: str = ''
  train_blocks: Blocks | None = None
  folds: tuple[Blocks, ...] = ()
  validation_fold_N: np.ndarray | None = None
  held_out_fraction: float = 0.0

  @property
  def blocks(self) -> Blocks:
    """The rows of `train` that training reads (with folds: every row, of
    which each member reads all but its own fold)."""
    return (self.train_blocks if self.train_blocks is not None
            else Blocks.of_table(self.train.num_examples))

  def member_blocks(self, member: int) -> Blocks:
    """The rows member `member` trains on."""
    if not self.folds:
      return self.blocks
    held = member % len(self.folds)
    return Blocks.union([b for f, b in enumerate(self.folds) if f != held])

  @property
  def member_rows(self) -> int:
    """The rows each member trains on (with folds, the smallest share)."""
    return min(self.member_blocks(f).num_rows
               for f in range(max(len(self.folds), 1)))


def _barrier(name: str) -> None:
  multihost_utils.sync_global_devices(name)


def _prepare(dataset: DatasetConfig) -> str:
  """The prepared dataset's directory, preparing it first if needed.

  Each path may be local (`~` expanded) or a gs:// URL.
  """
  data_dir = expand(dataset.data_dir, 'dataset.data_dir')
  if dataset.name == csv_regression.NAME:
    tables.check_data_dir(data_dir)
    source = 'dataset.train_path'
    train_path = expand(dataset.train_path, source)
    with named(source):
      is_file = storage.isfile(train_path)
    if not is_file:  # a glob, or several separated by commas
      train_path = tuple(expand(p.strip(), source)
                         for p in dataset.train_path.split(',') if p.strip())
    # Every process prepares its share of the training files.
    return csv_regression.prepare(
        train_path, dataset.eval_path and expand(dataset.eval_path,
                                                 'dataset.eval_path'),
        dataset.target_columns, dataset.feature_columns,
        dataset.categorical_columns, data_dir,
        category_min_count=dataset.category_min_count,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        barrier=_barrier if jax.process_count() > 1 else None,
        gather=(multihost_utils.process_allgather
                if jax.process_count() > 1 else None))
  return tables.prepare_generated(dataset.name, data_dir)


def _prepared_dir(dataset: DatasetConfig) -> str:
  """Prepares the dataset if needed; a generated one by process 0 while the
  others wait (they would write the same files at once)."""
  if dataset.name == csv_regression.NAME:
    return _prepare(dataset)
  error = None
  if jax.process_index() == 0:
    try:
      _prepare(dataset)
    except DataError as e:
      # Raised after the barrier: the others would wait there forever.
      error = e
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('meshfit:prepare_dataset')
  if error is not None:
    raise error
  return _prepare(dataset)


def load_splits(dataset: DatasetConfig, seed: int) -> Splits:
  """The training and evaluation splits of `dataset`.

  A training table up to `dataset.resident_table_mb` is read into memory; a
  larger one stays on disk, read in blocks by the training feed. With
  a fraction `dataset.validation`, that fraction of the training table's
  blocks, drawn from `seed` (the same rows every run), is held out for
  validation and read into memory. A number of folds cross-fits a
  table in memory; a streamed one cannot be (every row is validated), and
  a fraction of it (`streamed_fraction`) is held out instead, with a
  warning: `with_validation` gives the config that says so.
  """
  directory = _prepared_dir(dataset)
  if dataset.name == csv_regression.NAME:
    train = csv_regression.open_split(directory, dataset.train_split)
    if train.nbytes <= dataset.resident_table_mb * 2**20:
      train = csv_regression.read_split(directory, dataset.train_split)
    evaluation = (csv_regression.read_split(directory, dataset.eval_split)
                  if has_eval_split(dataset) else None)
    key = csv_regression.manifest(directory)['train_key']
  else:
    train = tables.read_split(directory, dataset.train_split)
    evaluation = tables.read_split(directory, dataset.eval_split)
    key = f'{dataset.name}:{dataset.train_split}'
  fraction = dataset.validation_fraction
  if dataset.validation_folds:
    if isinstance(train, Table):
      return cross_fit(Splits(train, evaluation, None, key),
                       dataset.validation_folds, seed,
                       dataset.resident_table_mb)
    fraction = streamed_fraction(train.num_examples)
    logging.warning(
        'dataset.validation=%d cross-fits every training row in '
        'memory, but the training table (%d rows, %.3g MiB) is over '
        'dataset.resident_table_mb=%d and streamed from disk: validating on '
        'dataset.validation=%g of it instead (about %d rows held '
        'out; the rule: %d rows, at most %g of the table), as config.json '
        'records. To cross-fit, raise dataset.resident_table_mb above its '
        'size in a new workdir.', dataset.validation_folds,
        train.num_examples, train.nbytes / 2**20, dataset.resident_table_mb,
        fraction, round(fraction * train.num_examples), VALIDATION_ROWS,
        MAX_FRACTION)
  if not fraction:
    return Splits(train, evaluation, None, key)
  blocks, validation = hold_out(train, fraction, seed)
  return Splits(train, evaluation, validation, key, blocks,
                held_out_fraction=fraction)


def streamed_fraction(num_rows: int) -> float:
  """The fraction held out of a table too large to cross-fit: about
  VALIDATION_ROWS rows, at most MAX_FRACTION, rounded up to two significant
  digits (a value a user can read and type)."""
  fraction = min(MAX_FRACTION, VALIDATION_ROWS / max(num_rows, 1))
  digits = 1 - int(np.floor(np.log10(fraction)))
  return min(MAX_FRACTION, float(np.ceil(fraction * 10**digits) / 10**digits))


def with_validation(config: Config, splits: Splits) -> Config:
  """`config` with the validation `splits` holds: a run whose table was
  too large to cross-fit (`load_splits`) records the fraction it held out
  instead, so that config.json, every checkpoint and a resumed run (which
  decides the same for the same table) say what was done."""
  dataset = config.dataset
  if not dataset.validation_folds or splits.folds or not (
      splits.held_out_fraction):
    return config
  return dataclasses.replace(config, dataset=dataclasses.replace(
      dataset, validation=splits.held_out_fraction))


def cross_fit(splits: Splits, folds: int, seed: int,
              resident_table_mb: int) -> Splits:
  """`splits` with its training rows dealt into `folds` folds (drawn from
  `seed`, the same every run), every row a validation row of its fold.

  Raises:
    DataError: the table is too large to hold in memory (every row is
      validated) or has fewer blocks than folds.
  """
  train = splits.train
  if not isinstance(train, Table):
    raise DataError(
        f'dataset.validation={folds} folds validate on every training row, '
        f'which needs the table in memory, but it is {train.nbytes / 2**20:.0f}'
        f' MiB, over dataset.resident_table_mb={resident_table_mb}; validate '
        'on a fraction of it instead (dataset.validation=0.01) or raise the '
        'limit')
  # Rows, not blocks of consecutive rows, are dealt: the table is in memory,
  # and a file sorted by time or group would otherwise hold out whole runs
  # of neighbouring rows, a validation that depends on the file's order and
  # judges unlike a random split (storms, 6-hourly tracks in file order:
  # test RMSE 3.0 with 8-row blocks against 2.5 with its rows shuffled).
  dealt = fold_blocks(train.num_examples, folds, seed, _VALIDATION_STREAM,
                      rows=FOLD_ROWS)
  if dealt is None:
    raise DataError(f'the training split has {train.num_examples} rows: too '
                    f'few to deal into {folds} folds; give more rows or set '
                    'dataset.validation=0')
  fold_N = np.empty(train.num_examples, np.int32)
  for f, blocks in enumerate(dealt):
    fold_N[blocks.rows()] = f
  return dataclasses.replace(splits, validation=train, folds=tuple(dealt),
                             train_blocks=Blocks.union(dealt),
                             validation_fold_N=fold_N)


def hold_out(table: Table | Store, fraction: float, seed: int
             ) -> tuple[Blocks, Table]:
  """(the blocks to train on, the held-out rows): `fraction` of the table's
  blocks (of about 1/1024 of it, one row for a small table), drawn from
  `seed`, rows in table order.

  Raises:
    DataError: too few rows to hold any out and keep some to train on.
  """
  n = table.num_examples
  chosen = hold_out_blocks(n, fraction, seed, _VALIDATION_STREAM)
  if chosen is None:
    raise DataError(f'the training split has {n} rows: too few to hold out '
                    f'{fraction:g} of them for validation and train on the '
                    'rest; give more rows or set dataset.validation=0')
  rest, held = chosen
  return rest, rows_of(table, held)


def rows_of(table: Table | Store, blocks: Blocks) -> Table:
  """The rows of `blocks` of `table`, in memory, in block order."""
  if isinstance(table, Table):
    return table.rows(blocks.rows())
  rows = np.concatenate([table.read_rows(int(a), int(b))
                         for a, b in zip(blocks.start, blocks.stop)])
  return Table(rows[:, :table.num_inputs], rows[:, table.num_inputs:],
               table.plan)


def training_sample(splits: Splits, max_rows: int = STATS_ROWS) -> Table:
  """The training rows the feature statistics are computed from: all of
  them up to `max_rows`, else every k-th block (spread over the table)."""
  blocks = splits.blocks
  every = -(-blocks.num_rows // max_rows)
  return rows_of(splits.train, blocks.take(np.arange(0, len(blocks), every)))


def has_eval_split(dataset: DatasetConfig) -> bool:
  """Whether `dataset` has rows to evaluate on: a user's table without an
  eval file has none (its validation rows estimate the error instead)."""
  return dataset.name != csv_regression.NAME or bool(dataset.eval_path)


def load_eval_split(dataset: DatasetConfig,
                    plan: ColumnPlan | None = None) -> Table:
  """The evaluation split, encoded with a trained model's column plan.

  A user's evaluation file is read and encoded anew with the checkpoint's
  plan (never re-fit on a training file that may have changed since); rows
  without a target are left out, with a warning.
  """
  if dataset.name != csv_regression.NAME:
    return tables.read_split(_prepared_dir(dataset), dataset.eval_split)
  if not has_eval_split(dataset):
    raise DataError('the run has no eval file (dataset.eval_path is empty); '
                    'give one with --config.dataset.eval_path=FILE')
  path = expand(dataset.eval_path, 'dataset.eval_path')
  frame = table_files.read_frame(path, 'dataset.eval_path')
  x_NxF, unseen = plan.encode(frame, path, 'dataset.eval_path')
  y_NxT = plan.targets_of(frame, path, 'dataset.eval_path')
  keep = ~np.isnan(y_NxT).any(axis=1)
  if not keep.all():
    logging.warning('%d of the %d rows of %s have no %s and are left out of '
                    'the evaluation.', int((~keep).sum()), len(frame), path,
                    ' or '.join(plan.targets))
  if unseen:
    logging.warning('%s', column_plan.unseen_warning(unseen, path,
                                                     plan.min_count))
  return Table(x_NxF[keep], y_NxT[keep], plan)
