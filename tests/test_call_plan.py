"""meshfit.call_plan: how many steps each jitted call runs."""

import itertools

import pytest

from meshfit.train import call_plan


def _ends(first_step, *args, **kwargs) -> list[int]:
  """The step each planned call ends at."""
  return list(itertools.accumulate(
      call_plan.plan_calls(first_step, *args, **kwargs), initial=first_step
  ))[1:]


def test_plan_ends_calls_at_every_event_and_resumes_alike():
  ends = _ends(0, 70, 16, periods=(25, 30), stops=(41,))
  assert ends == [16, 25, 30, 32, 41, 48, 50, 60, 64, 70]
  assert all(0 < b - a <= 16 for a, b in zip([0] + ends, ends))
  # Resumed at any call's end, the rest is grouped as before.
  for i, end in enumerate(ends[:-1]):
    assert _ends(end, 70, 16, periods=(25, 30), stops=(41,)) == ends[i + 1:]


@pytest.mark.parametrize('num_steps,steps_per_call,periods', [
    (70, 16, (25, 30)), (100, 100, (100, 1000)), (1, 8, (3,)), (0, 4, ()),
    (10_000, 7, (50, 0, 120)), (64, 1, ()), (99, 128, (33,))])
def test_num_calls_counts_the_plans_calls(num_steps, steps_per_call, periods):
  assert call_plan.num_calls(num_steps, steps_per_call, periods) == len(
      list(call_plan.plan_calls(0, num_steps, steps_per_call, periods)))


def test_a_period_of_zero_ends_no_call():
  assert _ends(0, 100, 32, periods=(50, 0)) == [32, 50, 64, 96, 100]
  assert call_plan.choose_steps_per_call(0, 1e3, 'cpu', (0, 100)) == 100


# The small benchmark MLP (10 -> 64 -> 64 -> 1) at batch 256 on a CPU.
_SMALL_FLOPS = 6.0 * (10 * 64 + 64 + 64 * 64 + 64 + 64 + 1) * 256


@pytest.mark.parametrize('periods, expected', [
    ((100, 1000, 1000), 100),  # calls of 100: none cut short by a log
    ((100, 1000, 50), 50),
    ((100, 1000), 100),  # checkpoints written in the background end no call
    ((97, 1000, 1000), 97),   # a period: one call per log
    ((999, 999, 999), 128),   # no useful divisor: the most, a power of 2
])
def test_steps_per_call_prefers_a_divisor_of_the_periods(periods, expected):
  assert call_plan.choose_steps_per_call(0, _SMALL_FLOPS, 'cpu',
                                         periods) == expected
  assert call_plan.choose_steps_per_call(3, _SMALL_FLOPS, 'cpu', periods) == 3


def test_steps_per_call_is_sized_to_the_work_of_a_step():
  # A step of 1e10 flop: two per call on a CPU; one on an accelerator for a
  # step of 1e14.
  assert call_plan.choose_steps_per_call(0, 1e10, 'cpu', (1000,)) == 2
  assert call_plan.choose_steps_per_call(0, 1e14, 'tpu', (1000,)) == 1
