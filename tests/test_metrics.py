"""Host-side metric sums, and the bound on device work in flight."""

import numpy as np

from meshfit.model import metrics, uncertainty
from meshfit.parallel import in_flight


def _sums(count: float) -> metrics.RegressionSums:
  one = np.ones(2, np.float32)
  return metrics.RegressionSums(
      count=np.float32(count), sse_T=one, sae_T=2 * one, sum_z_T=one,
      sum_z2_T=one, nll_z_T=one,
      covered_LxT=np.ones((len(uncertainty.COVERAGE_LEVELS), 2), np.float32))


def test_host_sum_adds_every_batch_with_at_most_two_in_flight(monkeypatch):
  fetched = []

  def device_get(x):
    fetched.append(x)
    return x

  monkeypatch.setattr(in_flight.jax, 'device_get', device_get)

  def dispatched():
    for i in range(10):
      # Batches 0..i-1 are dispatched; all but the newest two are fetched.
      assert i - len(fetched) <= 2, (i, len(fetched))
      yield _sums(i)

  assert in_flight.MAX_IN_FLIGHT == 2
  total = metrics.host_sum(dispatched(), 2)
  assert len(fetched) == 10
  assert total.count == sum(range(10)) and total.count.dtype == np.float64
  np.testing.assert_array_equal(total.sae_T, [20.0, 20.0])


def test_fetched_keeps_order_and_at_most_two_in_flight(monkeypatch):
  got = []
  monkeypatch.setattr(in_flight.jax, 'device_get',
                      lambda x: got.append(x) or x)

  def dispatched():
    for i in range(7):
      assert i - len(got) <= 2, (i, len(got))
      yield i

  assert list(in_flight.fetched(dispatched(), 2)) == list(range(7))
