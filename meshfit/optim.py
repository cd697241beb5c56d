"""Optimizers and learning-rate schedules (optax), from the config."""

import ml_collections
import optax

from meshfit.errors import UsageError

OPTIMIZERS = ('sgd', 'adam', 'adamw')
SCHEDULES = ('constant', 'warmup_cosine')


def learning_rate_schedule(config: ml_collections.ConfigDict,
                           num_train_steps: int) -> optax.Schedule:
  """The learning rate at each step (optax reads the step from opt_state)."""
  opt = config.optimizer
  if opt.schedule == 'constant':
    return optax.constant_schedule(opt.learning_rate)
  if opt.schedule == 'warmup_cosine':
    warmup = min(opt.warmup_steps, num_train_steps)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=opt.learning_rate, warmup_steps=warmup,
        decay_steps=max(num_train_steps, warmup + 1),
        end_value=opt.learning_rate * opt.end_learning_rate_factor)
  raise UsageError(f'optimizer.schedule {opt.schedule!r} is unknown; choose '
                   f'one of {", ".join(SCHEDULES)}')


def make_optimizer(config: ml_collections.ConfigDict,
                   num_train_steps: int) -> optax.GradientTransformation:
  """Gradient clipping (optional) followed by sgd, adam or adamw."""
  opt = config.optimizer
  lr = learning_rate_schedule(config, num_train_steps)
  if opt.name == 'sgd':
    base = optax.sgd(lr, momentum=opt.momentum or None)
  elif opt.name == 'adam':
    base = optax.adam(lr)
  elif opt.name == 'adamw':
    base = optax.adamw(lr, weight_decay=opt.weight_decay)
  else:
    raise UsageError(f'optimizer.name {opt.name!r} is unknown; choose one of '
                     f'{", ".join(OPTIMIZERS)}')
  if opt.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), base)
  return base
