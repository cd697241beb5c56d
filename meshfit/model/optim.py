"""Optimizers and learning-rate schedules (optax), from config.optimizer.

An ensemble's members may each have their own learning rate and weight
decay (a sweep: config.sweep). They are arrays of the train state
(`Hyperparameters`), and each member's optimizer is built from its own,
traced values inside the vmapped step; the optimizer state has the same
structure whatever the values, so one `init` serves every member.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from meshfit.config import Config, OptimizerConfig
from meshfit.parallel import programs
from meshfit.models.mlp import FITTED, VOCABULARY


@struct.dataclass
class Hyperparameters:
  """Each member's own values (M of each), kept in the train state.

  Attributes:
    learning_rate_M: peak learning rate.
    weight_decay_M: decoupled weight decay (adamw).
    dropout_rate_M: dropout after each hidden activation.
  """
  learning_rate_M: jax.Array
  weight_decay_M: jax.Array
  dropout_rate_M: jax.Array

  @classmethod
  def of(cls, config: Config) -> 'Hyperparameters':
    """Member m takes combination m % G of the sweep's G (host arrays);
    with F validation folds, (m // F) % G: the F members of a combination
    hold out each fold once."""
    sweep, members = config.sweep, config.model.ensemble_size
    folds = max(config.dataset.validation_folds, 1)
    grids = [sweep.learning_rates or (config.optimizer.learning_rate,),
             sweep.weight_decays or (config.optimizer.weight_decay,),
             sweep.dropout_rates or (config.model.dropout_rate,)]
    combos = np.array(np.meshgrid(*grids, indexing='ij')).reshape(3, -1).T
    chosen = combos[np.arange(members) // folds % len(combos)].astype(
        np.float32)
    return cls(*chosen.T)

  def varying(self) -> list[str]:
    """The names of the values that differ between members."""
    return [name for name, values in self.member_values().items()
            if len(np.unique(values)) > 1]

  def member_values(self) -> dict[str, np.ndarray]:
    """{name: M values}."""
    return {'learning_rate': np.asarray(self.learning_rate_M),
            'weight_decay': np.asarray(self.weight_decay_M),
            'dropout_rate': np.asarray(self.dropout_rate_M)}

  def member(self, m: int) -> dict[str, float]:
    """Member m's values, for messages."""
    return {name: float(values[m])
            for name, values in self.member_values().items()}


def learning_rate_schedule(opt: OptimizerConfig, num_train_steps: int,
                           peak: float | jax.Array | None = None
                           ) -> optax.Schedule:
  """The learning rate at each step (optax reads the step from opt_state).

  Args:
    opt: the optimizer section.
    num_train_steps: the run's length (the cosine decays over it).
    peak: the peak learning rate (a member's own); default the config's.
  """
  peak = opt.learning_rate if peak is None else peak
  if opt.schedule == 'constant':
    return lambda count: jnp.asarray(peak, jnp.float32) * jnp.ones_like(
        count, jnp.float32)
  warmup = min(opt.warmup_steps, num_train_steps)  # 'warmup_cosine'
  if opt.cosine_cycles > 1:
    return _cosine_cycles(opt, num_train_steps, warmup, peak)
  if not warmup:
    # The same values as optax's warmup_cosine with 0 warmup steps, whose
    # empty linear part logs a 'non-positive transition_steps' notice.
    unit = optax.cosine_decay_schedule(
        init_value=1.0, decay_steps=max(num_train_steps, 1),
        alpha=opt.end_learning_rate_factor)
    return lambda count: unit(count) * peak
  unit = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=1.0, warmup_steps=warmup,
      decay_steps=max(num_train_steps, warmup + 1),
      end_value=opt.end_learning_rate_factor)
  return lambda count: unit(count) * peak


@programs.memoize
def jit_learning_rate_schedule(opt: OptimizerConfig, num_train_steps: int,
                               peak: float) -> optax.Schedule:
  """`learning_rate_schedule` jitted, once per schedule (the loop logs it
  every log step; op by op it cost more than the rest of a log)."""
  return jax.jit(learning_rate_schedule(opt, num_train_steps, peak))


def _cosine_cycles(opt: OptimizerConfig, num_train_steps: int, warmup: int,
                   peak: float | jax.Array) -> optax.Schedule:
  """Linear warmup, then `opt.cosine_cycles` cosine decays from the peak
  to its end factor, each over an equal share of the steps left (SGDR,
  Loshchilov & Hutter 2017, without the growing cycles): every cycle's end
  is a low-learning-rate point for the best step to land on, where one
  long cosine leaves a run that stops early at nearly its peak rate."""
  cycle = max((num_train_steps - warmup) // opt.cosine_cycles, 1)
  end = opt.end_learning_rate_factor

  def schedule(count):
    count = jnp.asarray(count, jnp.float32)
    phase = jnp.mod(jnp.maximum(count - warmup, 0.0), cycle) / cycle
    unit = end + (1.0 - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * phase))
    ramp = count / max(warmup, 1)
    return jnp.where(count < warmup, ramp, unit) * peak
  return schedule


def trained(params: Any) -> Any:
  """True for every parameter the optimizer trains: all but a fitted ridge
  part's (models/ridge.py) and a member's vocabulary, which training never
  changes (their gradient is zero, and weight decay must not shrink them
  either)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: not any(getattr(k, 'key', None) in (FITTED, VOCABULARY)
                              for k in path), params)


def make_optimizer(opt: OptimizerConfig, num_train_steps: int,
                   learning_rate: float | jax.Array | None = None,
                   weight_decay: float | jax.Array | None = None,
                   fitted: bool = False) -> optax.GradientTransformation:
  """Gradient clipping (optional) followed by sgd, adam or adamw.

  Args:
    opt: the optimizer section.
    num_train_steps: the run's length.
    learning_rate: a member's peak learning rate; default the config's.
    weight_decay: a member's weight decay (adamw); default the config's.
    fitted: the parameters hold a fitted ridge part or member
      vocabulary, left out of the weight decay (`trained`).
  """
  lr = learning_rate_schedule(opt, num_train_steps, learning_rate)
  decay = opt.weight_decay if weight_decay is None else weight_decay
  base = {
      'sgd': lambda: optax.sgd(lr, momentum=opt.momentum or None),
      'adam': lambda: optax.adam(lr),
      'adamw': lambda: optax.adamw(lr, weight_decay=decay,
                                   mask=trained if fitted else None),
  }[opt.name]()
  if opt.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), base)
  return base


def member_optimizer(opt: OptimizerConfig, num_train_steps: int,
                     hparams: Hyperparameters, fitted: bool = False
                     ) -> optax.GradientTransformation:
  """One member's optimizer, from its own values (scalars, traced inside
  the step's vmap over members)."""
  return make_optimizer(opt, num_train_steps, hparams.learning_rate_M,
                        hparams.weight_decay_M, fitted)
