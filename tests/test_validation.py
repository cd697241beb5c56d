"""meshfit.validation and the held-out rows: the best step, when to stop."""

import dataclasses
import math

import numpy as np
import pytest

from cli_helpers import regression_frame
from meshfit.configs import csv as csv_config
from meshfit.input_pipeline import order, tables
from meshfit.input_pipeline.errors import DataError
from meshfit import config as config_lib
from meshfit.data import splits as splits_lib
from meshfit.train.validation import BestTracker


def test_the_best_is_the_lowest_and_patience_stops():
  tracker = BestTracker(patience=2)
  assert tracker.update(100, 0.5) and tracker.best_step == 100
  assert not tracker.update(200, 0.6) and not tracker.stopped
  assert tracker.update(300, 0.4)  # an improvement starts the count again
  assert not tracker.update(400, 0.4)  # equal is no improvement
  assert not tracker.update(500, 0.9)
  assert tracker.stopped and tracker.best_step == 300


def test_without_patience_training_never_stops():
  tracker = BestTracker()
  tracker.update(1, 1.0)
  for step in range(2, 50):
    tracker.update(step, 2.0)
  assert not tracker.stopped


def test_the_tracker_round_trips_through_a_checkpoint():
  tracker = BestTracker(3)
  tracker.update(10, 0.25)
  tracker.update(20, 0.3)
  again = BestTracker.from_json(tracker.to_json(), 3)
  assert again == tracker
  fresh = BestTracker.from_json(None, 3)
  assert fresh.best_step == 0 and math.isinf(fresh.best_loss)
  assert BestTracker.from_json(fresh.to_json(), 3) == fresh


def test_held_out_rows_are_seeded_and_disjoint():
  n = 50
  table = tables.Table(np.arange(n, dtype=np.float32)[:, None],
                       np.zeros((n, 1), np.float32),
                       tables.generated_plan(1, 1))
  rest, held = splits_lib.hold_out(table, 0.2, seed=3)
  # A small table's blocks are single rows.
  assert held.num_examples == 10 and rest.num_rows == 40
  rows = np.concatenate([rest.rows(), held.x_NxF[:, 0]])
  assert sorted(rows) == list(range(n))
  assert list(held.x_NxF[:, 0]) == sorted(held.x_NxF[:, 0])  # file order
  again, _ = splits_lib.hold_out(table, 0.2, seed=3)
  np.testing.assert_array_equal(again.rows(), rest.rows())
  other, _ = splits_lib.hold_out(table, 0.2, seed=4)
  assert not np.array_equal(other.rows(), rest.rows())
  with pytest.raises(DataError, match='too few to hold out'):
    splits_lib.hold_out(table.rows(np.arange(2)), 0.2, seed=0)


def test_cross_fitted_members_each_leave_out_their_own_fold():
  n = 50
  table = tables.Table(np.arange(n, dtype=np.float32)[:, None],
                       np.zeros((n, 1), np.float32),
                       tables.generated_plan(1, 1))
  splits = splits_lib.cross_fit(splits_lib.Splits(table, table), 5, seed=3,
                          resident_table_mb=1)
  # Every row validates, in its fold; member m trains on the rest.
  assert splits.validation is table
  assert np.bincount(splits.validation_fold_N).tolist() == [10] * 5
  for member in range(10):
    trained = splits.member_blocks(member).rows()
    held = np.flatnonzero(splits.validation_fold_N == member % 5)
    assert sorted(np.concatenate([trained, held])) == list(range(n))
  assert splits.member_rows == 40
  again = splits_lib.cross_fit(splits_lib.Splits(table, table), 5, seed=3,
                         resident_table_mb=1)
  np.testing.assert_array_equal(again.validation_fold_N,
                                splits.validation_fold_N)
  with pytest.raises(DataError, match='too few to deal into 5 folds'):
    splits_lib.cross_fit(splits_lib.Splits(table.rows(np.arange(3)), table), 5, seed=0,
                   resident_table_mb=1)


def test_folds_are_dealt_by_row_whatever_the_files_order():
  # 8,000 rows make 4-row blocks for reading, but a fold is dealt row by
  # row: neighbours in the file (a sorted table's similar rows) fall in the
  # same fold a fifth of the time, as in a random split, not three times
  # in four.
  n = 8000
  table = tables.Table(np.zeros((n, 1), np.float32),
                       np.zeros((n, 1), np.float32),
                       tables.generated_plan(1, 1))
  assert order.block_rows(n) == 4
  splits = splits_lib.cross_fit(splits_lib.Splits(table, table), 5, seed=3,
                          resident_table_mb=1)
  fold_N = splits.validation_fold_N
  same = np.mean(fold_N[1:] == fold_N[:-1])
  assert 0.15 < same < 0.25, same
  assert np.bincount(fold_N).tolist() == [1600] * 5
  assert splits.blocks.num_rows == n and len(splits.blocks) == n
  for member in range(5):
    held = np.flatnonzero(fold_N == member)
    assert np.intersect1d(splits.member_blocks(member).rows(), held).size == 0


def test_folds_need_the_table_in_memory(tmp_path):
  class OnDisk:  # a Store stands for a table too large to read whole
    nbytes = 3 * 2**30
    num_examples = 10**8
  with pytest.raises(DataError, match='needs the table in memory.*'
                     'dataset.validation=0.01'):
    splits_lib.cross_fit(splits_lib.Splits(OnDisk(), None), 5, seed=0,
                   resident_table_mb=1024)


@pytest.mark.parametrize('rows,fraction', [
    (300, 0.2), (327_680, 0.2), (1_000_000, 0.066), (10_000_000, 0.0066),
    (10**9, 0.000066)])
def test_a_streamed_table_holds_out_about_2_16_rows_at_most_a_fifth(
    rows, fraction):
  got = splits_lib.streamed_fraction(rows)
  assert got == pytest.approx(fraction)
  assert min(splits_lib.VALIDATION_ROWS, 0.2 * rows) <= got * rows <= (
      1.02 * splits_lib.VALIDATION_ROWS if got < 0.2 else 0.2 * rows)


def test_a_table_too_large_to_cross_fit_holds_out_a_fraction_instead(
    tmp_path, absl_caplog):
  regression_frame(300, 0).to_csv(tmp_path / 'train.csv', index=False)
  raw = csv_config.get_config()
  raw.dataset.update(train_path=str(tmp_path / 'train.csv'),
                     target_columns=('y',), data_dir=str(tmp_path / 'tfds'))
  config = config_lib.parse(raw)
  assert config.dataset.validation_folds == 5
  in_memory = splits_lib.load_splits(config.dataset, seed=0)
  assert len(in_memory.folds) == 5 and in_memory.eval is None
  assert splits_lib.with_validation(config, in_memory) is config
  assert 'streamed from disk' not in absl_caplog.text

  streamed = dataclasses.replace(config, dataset=dataclasses.replace(
      config.dataset, resident_table_mb=0))
  splits = splits_lib.load_splits(streamed.dataset, seed=0)
  assert not splits.folds and splits.held_out_fraction == 0.2
  assert splits.validation.num_examples == 60 and splits.member_rows == 240
  [line] = [r.getMessage() for r in absl_caplog.records
            if 'streamed from disk' in r.getMessage()]
  assert 'validating on dataset.validation=0.2' in line, line
  resolved = splits_lib.with_validation(streamed, splits)
  assert resolved.dataset.validation_folds == 0
  assert resolved.dataset.validation_fraction == 0.2
  assert resolved.to_dict()['dataset']['validation'] == 0.2
  config_lib.parse(resolved.to_dict())  # what config.json holds is valid
  # A resumed run, given the resolved config, holds out the same rows.
  again = splits_lib.load_splits(resolved.dataset, seed=0)
  np.testing.assert_array_equal(again.blocks.rows(), splits.blocks.rows())
