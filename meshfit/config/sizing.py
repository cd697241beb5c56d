"""Batch size, length and evaluation period sized to the training table.

A config may leave `batch_size`, `num_train_steps`, `eval_every_steps` and
`log_every_steps` at 0: they are then decided here from the number of rows
trained on, once that is known (after preparing the data, before anything
is built), and the run goes on with the resolved values (config.json and
every checkpoint hold them). The same table always gives the same values, so
a resumed run resolves what it resolved before.

The rules (docs/tables.md has the measurements that chose them):

- batch: the power of two nearest 2 * sqrt(rows), within
  [MIN_BATCH, MAX_BATCH]: a few hundred rows take small batches, so that an
  epoch is several steps and the best step can be picked within a few
  epochs; a large table takes large ones, so that its epochs are not tens of
  thousands of steps. Rounded up to a multiple of the mesh's data devices.
- steps: `train_epochs` epochs, at most MAX_STEPS (a million rows then
  trains ~25 epochs).
- evaluations (and logs): about once an epoch, and at least
  MIN_EVALUATIONS in the run, so the best step is looked for at the
  granularity where a small table's overfitting happens; but never so often
  that validating costs more than training: the steps between two
  evaluations train on at least EVAL_COST_RATIO times the validation rows
  (a validation row costs about a third of a training row; the eval split,
  scored for monitoring only, does not count: it must not make the best
  step coarser). A 50-step run of a 10M-row table validated on 99k rows was
  evaluated every 2 steps, 25 times; now at step 33 and at the end.
"""

import dataclasses
import math

from meshfit.config import Config

MIN_BATCH, MAX_BATCH = 32, 1024
MAX_STEPS = 20_000
MIN_EVALUATIONS = 25
# Training rows between evaluations per row an evaluation reads, at least:
# a forward pass is about a third of a training step's work, so 1/3 keeps
# evaluating at most about as costly as training.
EVAL_COST_RATIO = 1 / 3


def batch_for(num_rows: int, data_devices: int = 1) -> int:
  """The sized batch of a table of `num_rows` training rows."""
  target = 2.0 * math.sqrt(max(num_rows, 1))
  batch = 2**round(math.log2(target))
  batch = min(max(batch, MIN_BATCH), MAX_BATCH)
  return -(-batch // data_devices) * data_devices


def resolve(config: Config, num_rows: int, data_devices: int = 1,
            eval_rows: int = 0) -> tuple[Config, str | None]:
  """`config` with its sized keys (those at 0) decided for `num_rows`.

  Args:
    config: a parsed config.
    num_rows: the rows a member trains on (the validation rows left out).
    data_devices: devices of the mesh's 'data' axis (the batch must divide
      over them).
    eval_rows: the validation rows an evaluation reads.

  Returns:
    The resolved config, and a line saying what was sized (None if
    nothing was).
  """
  sized = {}
  batch = config.batch_size or batch_for(num_rows, data_devices)
  if not config.batch_size:
    sized['batch_size'] = batch
  steps_per_epoch = max(1, -(-num_rows // batch))
  steps = config.num_train_steps
  if not steps:
    steps = min(MAX_STEPS,
                max(1, round(config.train_epochs * steps_per_epoch)))
    sized['num_train_steps'] = steps
  period = max(1, min(steps_per_epoch, steps // MIN_EVALUATIONS))
  if not config.eval_every_steps:
    affordable = math.ceil(EVAL_COST_RATIO * eval_rows / batch)
    sized['eval_every_steps'] = min(steps, max(period, affordable))
  if not config.log_every_steps:
    sized['log_every_steps'] = period
  if not sized:
    return config, None
  described = ', '.join(f'{k}={v}' for k, v in sized.items())
  line = (f'Sized to the {num_rows} training rows: {described} '
          f'({steps / steps_per_epoch:.3g} epochs of {steps_per_epoch} '
          'steps).')
  return dataclasses.replace(config, **sized), line
