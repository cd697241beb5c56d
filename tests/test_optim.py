"""Learning-rate schedules."""

import jax
import numpy as np
import optax

from meshfit.configs import default
from meshfit import config as config_lib
from meshfit.model import optim


def _optimizer_config(warmup_steps: int):
  config = default.get_config()
  config.optimizer.warmup_steps = warmup_steps
  return config_lib.parse(config).optimizer


def test_no_warmup_is_optax_warmup_cosine_of_0_steps_without_its_notice(
    absl_caplog):
  opt = _optimizer_config(0)
  steps = np.arange(0, 705, dtype=np.int32)
  ours = jax.jit(jax.vmap(optim.learning_rate_schedule(opt, 700, 3e-3)))
  got = np.asarray(ours(steps))
  absl_caplog.clear()
  theirs = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=1.0, warmup_steps=0, decay_steps=700,
      end_value=opt.end_learning_rate_factor)
  expected = np.asarray(jax.jit(jax.vmap(lambda c: theirs(c) * 3e-3))(steps))
  assert 'transition_steps' in absl_caplog.text  # what ours does not say
  np.testing.assert_array_equal(got, expected)  # bit for bit


def test_ours_logs_nothing(absl_caplog):
  for warmup in (0, 10):
    optim.make_optimizer(_optimizer_config(warmup), 100)
  assert absl_caplog.text == ''


def test_a_warmup_rises_then_decays():
  schedule = optim.learning_rate_schedule(_optimizer_config(10), 100, 1.0)
  rates = np.asarray([schedule(s) for s in range(101)])
  assert rates[0] == 0 and rates[10] == 1.0
  assert np.all(np.diff(rates[:11]) > 0) and np.all(np.diff(rates[10:]) < 0)


def test_cosine_cycles_repeat_the_decay_after_the_warmup():
  config = default.get_config()
  config.optimizer.warmup_steps = 20
  config.optimizer.cosine_cycles = 4
  opt = config_lib.parse(config).optimizer
  schedule = jax.jit(jax.vmap(optim.learning_rate_schedule(opt, 420, 2.0)))
  rates = np.asarray(schedule(np.arange(420, dtype=np.int32)))
  np.testing.assert_allclose(rates[:21], np.arange(21) / 20 * 2.0, rtol=1e-6)
  one = optax.cosine_decay_schedule(2.0, 100,
                                    alpha=opt.end_learning_rate_factor)
  single = np.asarray([one(s) for s in range(100)])
  for k in range(4):  # each cycle is one cosine decay of 100 steps
    np.testing.assert_allclose(rates[20 + 100 * k:120 + 100 * k], single,
                               rtol=1e-5)
