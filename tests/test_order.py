"""meshfit.input_pipeline.order: the example order, and reading ahead in a thread."""

import numpy as np
import pytest

from meshfit.input_pipeline import order


def test_permutation_is_keyed_on_seed_and_epoch():
  a = order.epoch_permutation(0, 0, 50)
  assert np.array_equal(a, order.epoch_permutation(0, 0, 50))
  assert sorted(a) == list(range(50))
  assert not np.array_equal(a, order.epoch_permutation(0, 1, 50))
  assert not np.array_equal(a, order.epoch_permutation(1, 0, 50))


@pytest.mark.parametrize('n, expected', [(10, 1), (2047, 1), (2048, 2),
                                         (100_000, 64), (10**8, 4096)])
def test_blocks_are_a_power_of_two_up_to_4096_rows(n, expected):
  assert order.block_rows(n) == expected
  blocks = order.Blocks.of_table(n)
  # Consecutive blocks of `expected` rows (the last may be shorter).
  np.testing.assert_array_equal(blocks.start[1:], blocks.stop[:-1])
  assert set(blocks.stop[:-1] - blocks.start[:-1]) <= {expected}
  assert blocks.start[0] == 0 and blocks.num_rows == n
  assert blocks.stop[-1] == n
  if n < 10**6:
    np.testing.assert_array_equal(blocks.rows(), np.arange(n))


@pytest.mark.parametrize('n, batch, lanes', [(10, 4, 1), (100, 16, 4),
                                             (1000, 256, 32),
                                             (10**7, 256, 64),
                                             (10**7, 96, 48)])
def test_lanes_divide_the_batch_and_get_16_blocks_each(n, batch, lanes):
  assert order.ExampleOrder(n, batch, seed=0).lanes == lanes


@pytest.mark.parametrize('n', [1000, 5000, 300_000])
def test_each_lane_epoch_holds_its_rows_once_and_lanes_cover_the_table(n):
  examples = order.ExampleOrder(n, 64, seed=3)
  lanes, entries = examples.lanes, examples.lane_entries
  lane_rows = examples._lane_rows  # noqa: SLF001  (rows of each lane)
  assert lane_rows.sum() == n
  steps = -(-int(lane_rows.max()) * 2 // entries)  # two epochs of each lane
  rows_KxB = examples.rows(0, steps)
  seen = []
  for lane in range(lanes):
    stream = rows_KxB[:, lane * entries:(lane + 1) * entries].ravel()
    first, second = stream[:lane_rows[lane]], stream[
        lane_rows[lane]:2 * lane_rows[lane]]
    assert len(set(first)) == len(first) == lane_rows[lane]
    assert len(set(second)) == len(second)
    seen.append(first)
  np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(n))


def test_rows_at_a_position_are_the_stream_from_the_start():
  examples = order.ExampleOrder(5000, 32, seed=5)
  whole = examples.rows(0, 700)
  again = order.ExampleOrder(5000, 32, seed=5)
  np.testing.assert_array_equal(again.rows(300 * 32, 400), whole[300:])
  # A block of columns is that block of each batch, lanes cut or not.
  for columns in (slice(8, 16), slice(3, 29)):
    np.testing.assert_array_equal(again.rows(32 * 5, 7, columns),
                                  whole[5:12, columns])


def test_the_order_is_keyed_on_seed_and_member():
  a = order.ExampleOrder(5000, 32, seed=5).rows(0, 20)
  assert not np.array_equal(a, order.ExampleOrder(5000, 32, 6).rows(0, 20))
  assert not np.array_equal(
      a, order.ExampleOrder(5000, 32, 5, member=1).rows(0, 20))


def test_windows_are_shuffled_alike_one_by_one_or_a_whole_epoch_at_once():
  """The streamed feed shuffles a window at a time; the resident one a
  whole epoch at once: both must give the same rows."""
  blocks = order.Blocks.of_table(300_000)
  # Without some blocks (held out), and windows of several blocks.
  kept = blocks.take(np.setdiff1d(np.arange(len(blocks)), [3, 70, 71]))
  examples = order.ExampleOrder(kept, 8, seed=1, member=2)
  steps = 2 * 300_000 // 8
  rows_KxB = examples.rows(0, steps)
  for lane in (0, examples.lanes - 1):
    pieces = examples.lane_pieces(lane, 0, steps)
    assert len({(p.epoch, p.window) for p in pieces}) > 2
    streamed = []
    for p in pieces:
      window = examples.window_blocks(p.epoch, lane, p.window)
      perm = examples.shuffle_windows(p.epoch, [window])[0]
      ids = order.Blocks(kept.start[window], kept.stop[window]).rows()[perm]
      streamed.append(ids[p.start:p.stop])
    e = examples.lane_entries
    np.testing.assert_array_equal(
        np.concatenate(streamed), rows_KxB[:, lane * e:(lane + 1) * e].ravel())


def test_a_window_holds_32768_rows_of_whole_blocks():
  examples = order.ExampleOrder(10**7, 256, seed=0)
  window = examples.window_blocks(0, 5, 0)
  assert len(window) == order.WINDOW_ROWS // 4096
  assert (np.asarray(window) % 1 == 0).all()
  # Blocks j of an epoch go to lane j % L.
  np.testing.assert_array_equal(window,
                                examples.block_order(0)[5::64][:8])


def test_held_out_blocks_are_seeded_and_disjoint_from_the_rest():
  rest, held = order.hold_out_blocks(100_000, 0.2, seed=3, stream=9)
  assert len(held) == round(0.2 * len(order.Blocks.of_table(100_000)))
  assert not set(rest.rows()) & set(held.rows())
  assert rest.num_rows + held.num_rows == 100_000
  again, _ = order.hold_out_blocks(100_000, 0.2, seed=3, stream=9)
  np.testing.assert_array_equal(again.start, rest.start)
  other, _ = order.hold_out_blocks(100_000, 0.2, seed=4, stream=9)
  assert not np.array_equal(other.start, rest.start)
  assert order.hold_out_blocks(3, 0.1, seed=0, stream=9) is None


def test_folds_deal_every_block_once_in_near_equal_shares():
  folds = order.fold_blocks(100_000, 5, seed=3, stream=9)
  all_blocks = order.Blocks.of_table(100_000)
  sizes = [len(f) for f in folds]
  assert sum(sizes) == len(all_blocks) and max(sizes) - min(sizes) <= 1
  rows = np.concatenate([f.rows() for f in folds])
  assert sorted(rows) == list(range(100_000))
  for f in folds:
    assert (np.diff(f.start) > 0).all()  # table order
  again = order.fold_blocks(100_000, 5, seed=3, stream=9)
  np.testing.assert_array_equal(again[2].start, folds[2].start)
  other = order.fold_blocks(100_000, 5, seed=4, stream=9)
  assert not np.array_equal(other[2].start, folds[2].start)
  assert order.fold_blocks(4, 5, seed=0, stream=9) is None
  # A member's rows: every fold but its own, in table order, which an
  # ExampleOrder takes (the table's short last block, if any, stays last).
  rest = order.Blocks.union([folds[0], folds[2], folds[3], folds[4]])
  assert (np.diff(rest.start) > 0).all()
  assert rest.num_rows == 100_000 - folds[1].num_rows
  assert order.ExampleOrder(rest, 256, seed=0).num_examples == rest.num_rows


def test_prefetcher_answers_requests_in_order_and_hands_over_errors():
  def produce(n):
    if n < 0:
      raise ValueError(f'bad request {n}')
    return n * n
  prefetcher = order.Prefetcher(produce, size=2)
  try:
    for n in (1, 2, 3, -1):
      prefetcher.request(n)
    assert [prefetcher.get() for _ in range(3)] == [1, 4, 9]
    with pytest.raises(ValueError, match='bad request -1'):
      prefetcher.get()
  finally:
    prefetcher.close()
