"""input_pipeline.order: the example order, and reading ahead in a thread."""

import numpy as np
import pytest

from input_pipeline import order


def test_permutation_is_keyed_on_seed_and_epoch():
  a = order.epoch_permutation(0, 0, 50)
  assert np.array_equal(a, order.epoch_permutation(0, 0, 50))
  assert sorted(a) == list(range(50))
  assert not np.array_equal(a, order.epoch_permutation(0, 1, 50))
  assert not np.array_equal(a, order.epoch_permutation(1, 0, 50))


def test_rows_are_the_stream_across_epoch_boundaries():
  examples = order.ExampleOrder(num_examples=10, batch_size=4, seed=5)
  stream = np.concatenate([order.epoch_permutation(5, e, 10)
                           for e in range(3)])
  rows_KxB = examples.rows(position=8, num_batches=3)
  np.testing.assert_array_equal(rows_KxB.ravel(), stream[8:20])
  # A block of columns is that block of each batch.
  np.testing.assert_array_equal(examples.rows(8, 3, slice(1, 3)),
                                rows_KxB[:, 1:3])


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
