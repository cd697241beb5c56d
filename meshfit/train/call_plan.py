"""How a run's steps are grouped into jitted calls.

A call runs several optimizer steps in a loop on the device, so the host
pays its cost (dispatch, placing the chunk, the loss check) once for many
steps. A call ends wherever the loop must act in between: at a log,
evaluation, profile or checkpoint step, and at the last step. Boundaries are
absolute step numbers, so a run resumed at any call's end groups the rest of
its steps as the uninterrupted run does; and grouping changes no bit of the
result (`steps.train_call`), so any grouping resumes exactly.
"""

from collections.abc import Iterable, Iterator, Sequence

import numpy as np

# What an automatic call length aims at: enough work to hide the host's cost
# of a call, little enough that SIGTERM is answered soon (the call in flight
# finishes first). CPUs run ~1e11 flop/s, accelerators 1e14 and more.
CALL_FLOPS = {'cpu': 2e10}
CALL_FLOPS_ACCELERATOR = 2e13
MAX_AUTO_STEPS_PER_CALL = 128


def choose_steps_per_call(requested: int, flops_per_step: float,
                          platform: str, periods: Sequence[int]) -> int:
  """The most steps of a call: `requested`, or for 0 one sized to the model.

  Calls of about CALL_FLOPS of work, at most MAX_AUTO_STEPS_PER_CALL steps;
  among those lengths (the largest power of two, divisors of a period), the
  one that needs the fewest calls, given that the steps of `periods` end
  calls too. It depends on the config, the model and the platform only, so
  it is the same on every host, as it must be: every host runs the same
  calls.

  Args:
    requested: config.steps_per_call; 0 chooses.
    flops_per_step: the work of one optimizer step.
    platform: the devices' platform ('cpu', 'tpu', 'gpu').
    periods: the periods in steps whose multiples end a call (0: none).
  """
  if requested:
    return requested
  periods = [p for p in periods if p > 0]
  target = CALL_FLOPS.get(platform, CALL_FLOPS_ACCELERATOR)
  most = min(MAX_AUTO_STEPS_PER_CALL, max(1, int(target // flops_per_step)))
  candidates = {1 << (most.bit_length() - 1)} | {
      d for d in range(1, most + 1) if any(p % d == 0 for p in periods)}
  # Counted over a stretch long enough to see the pattern; ties go to the
  # shorter call (the least padding).
  return min(sorted(candidates),
             key=lambda k: num_calls(10_000, k, periods))


def plan_calls(first_step: int, last_step: int, steps_per_call: int,
               periods: Iterable[int] = (), stops: Iterable[int] = ()
               ) -> Iterator[int]:
  """How many steps each call of steps first_step+1..last_step runs.

  A call ends at the next multiple of `steps_per_call`, of any of `periods`
  (logging, evaluation, checkpoints; 0 is none), at any of `stops`, or at
  `last_step`, whichever comes first.

  Yields:
    The steps of each call, in order.
  """
  periods = [p for p in (steps_per_call, *periods) if p > 0]
  stops = sorted(s for s in stops if first_step < s < last_step)
  step = first_step
  while step < last_step:
    end = min([last_step] + [(step // p + 1) * p for p in periods] +
              [s for s in stops if s > step][:1])
    yield end - step
    step = end


def num_calls(num_steps: int, steps_per_call: int,
              periods: Iterable[int] = ()) -> int:
  """How many calls `plan_calls(0, num_steps, steps_per_call, periods)`
  yields, counted without walking it (a start weighs a hundred lengths)."""
  if num_steps <= 0:
    return 0
  ends = np.zeros(num_steps, bool)  # ends[s]: a call ends after step s
  for p in (steps_per_call, *periods):
    if p > 0:
      ends[p::p] = True
  return int(ends.sum()) + 1  # and the last call, at num_steps
