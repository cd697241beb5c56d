"""Optimizers and learning-rate schedules (optax), from config.optimizer."""

import optax

from meshfit.config import OptimizerConfig


def learning_rate_schedule(opt: OptimizerConfig,
                           num_train_steps: int) -> optax.Schedule:
  """The learning rate at each step (optax reads the step from opt_state)."""
  if opt.schedule == 'constant':
    return optax.constant_schedule(opt.learning_rate)
  warmup = min(opt.warmup_steps, num_train_steps)  # 'warmup_cosine'
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=opt.learning_rate, warmup_steps=warmup,
      decay_steps=max(num_train_steps, warmup + 1),
      end_value=opt.learning_rate * opt.end_learning_rate_factor)


def make_optimizer(opt: OptimizerConfig,
                   num_train_steps: int) -> optax.GradientTransformation:
  """Gradient clipping (optional) followed by sgd, adam or adamw."""
  lr = learning_rate_schedule(opt, num_train_steps)
  base = {
      'sgd': lambda: optax.sgd(lr, momentum=opt.momentum or None),
      'adam': lambda: optax.adam(lr),
      'adamw': lambda: optax.adamw(lr, weight_decay=opt.weight_decay),
  }[opt.name]()
  if opt.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), base)
  return base
