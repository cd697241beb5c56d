"""meshfit.sizing: batch, length and periods sized to the training table."""

import json
import os

import pytest

from cli_helpers import override
from meshfit import config as config_lib
from meshfit.errors import UsageError
from meshfit.config import sizing
from meshfit.report import writers
from meshfit.train import loop


@pytest.mark.parametrize('rows, batch', [
    (50, 32), (341, 32), (1_000, 64), (5_000, 128), (27_600, 256),
    (100_000, 512), (300_000, 1024), (10_000_000, 1024)])
def test_the_batch_grows_with_the_square_root_of_the_rows(rows, batch):
  assert sizing.batch_for(rows) == batch


def test_the_batch_divides_over_the_data_devices():
  assert sizing.batch_for(100, data_devices=8) == 32
  assert sizing.batch_for(100, data_devices=48) == 48
  assert sizing.batch_for(100_000, data_devices=3) == 513


def _parsed(small_config, **overrides):
  config = small_config.copy_and_resolve_references()
  override(config, overrides)
  return config_lib.parse(config)


def test_keys_left_at_zero_are_sized_and_the_others_kept(small_config):
  config = _parsed(small_config, batch_size=0, num_train_steps=0,
                   eval_every_steps=0, log_every_steps=0, train_epochs=50.0)
  sized, line = sizing.resolve(config, 1_000)
  # 64 rows a batch: 16 steps an epoch, 50 epochs, evaluated every epoch.
  assert (sized.batch_size, sized.num_train_steps, sized.eval_every_steps,
          sized.log_every_steps) == (64, 800, 16, 16)
  assert '50 epochs of 16 steps' in line
  explicit = _parsed(small_config, num_train_steps=0)
  sized, line = sizing.resolve(explicit, 1_000)
  # 64 rows a batch (kept): 16 steps an epoch, 100 epochs.
  assert (sized.batch_size, sized.eval_every_steps) == (64, 30)
  assert sized.num_train_steps == 100 * 16 and 'num_train_steps=1600' in line
  assert sizing.resolve(config_lib.parse(small_config), 1_000) == (
      config_lib.parse(small_config), None)


def test_a_large_table_is_capped_and_evaluated_often_enough(small_config):
  config = _parsed(small_config, batch_size=0, num_train_steps=0,
                   eval_every_steps=0, log_every_steps=0)
  sized, _ = sizing.resolve(config, 1_000_000)
  assert sized.batch_size == 1024
  assert sized.num_train_steps == sizing.MAX_STEPS
  # An epoch is 977 steps: evaluations come every 800 so there are 25.
  assert sized.eval_every_steps == sizing.MAX_STEPS // sizing.MIN_EVALUATIONS


def test_zero_is_the_only_non_positive_value(small_config):
  for key, value in (('batch_size', -1), ('num_train_steps', -5),
                     ('eval_every_steps', -1)):
    with pytest.raises(UsageError, match=f'{key}=.*or 0 to size'):
      _parsed(small_config, **{key: value})
  with pytest.raises(UsageError, match='train_epochs=0'):
    _parsed(small_config, train_epochs=0)


@pytest.mark.slow
def test_a_sized_run_saves_what_it_resolved_and_resumes(small_config,
                                                         tmp_path):
  config = small_config
  config.dataset.name = 'synthetic_regression/linear'  # 128 rows
  config.batch_size = 0
  config.num_train_steps = 0
  config.eval_every_steps = 0
  config.log_every_steps = 0
  config.checkpoint_every_steps = 0
  config.train_epochs = 25.0
  config.plots = False
  workdir = str(tmp_path)
  final = loop.train_and_evaluate(config, workdir)
  # 32 rows a batch over the 8 devices: 4 steps an epoch, 25 epochs, and
  # an evaluation every epoch makes the 25 wanted at least.
  with open(os.path.join(workdir, 'config.json')) as f:
    saved = json.load(f)
  assert (saved['batch_size'], saved['num_train_steps'],
          saved['eval_every_steps'], saved['train_epochs']) == (32, 100, 4, 25.0)
  assert final['step'] == 100
  steps = [r['step'] for r in writers.read_jsonl(
      os.path.join(workdir, 'metrics.jsonl')) if 'eval/rmse' in r]
  assert steps == list(range(4, 101, 4))
  # The same command again resolves the same values: it resumes (and has
  # nothing left to train) instead of refusing a changed config.
  again = loop.train_and_evaluate(config, workdir)
  assert again['step'] == 100 and again['rmse'] == pytest.approx(final['rmse'])


def test_evaluations_never_cost_more_than_training(small_config):
  config = _parsed(small_config, batch_size=0, num_train_steps=50,
                   eval_every_steps=0, log_every_steps=0)
  # 10M rows, 99k of them validated, batches of 1024: evaluating every 2
  # steps (25 times in 50 steps) read 40x the rows trained on; now at step
  # 33 and at the end.
  sized, _ = sizing.resolve(config, 9_900_000, eval_rows=99_000)
  assert sized.eval_every_steps == 33 and sized.log_every_steps == 2
  # A small table's evaluation is cheap: still once an epoch.
  config = _parsed(small_config, batch_size=0, num_train_steps=0,
                   eval_every_steps=0, log_every_steps=0)
  sized, _ = sizing.resolve(config, 790, eval_rows=988)
  assert sized.eval_every_steps == sized.log_every_steps == 13
