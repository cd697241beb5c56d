"""The JAX 101 parallelism tutorial's setting: y = 2x - 1 + noise.

A linear model trained with plain SGD at 0.005 for 1000 steps, the 128
training examples forming one global batch split over all devices.
"""

import ml_collections

from meshfit.configs import default


def get_config() -> ml_collections.ConfigDict:
  """Returns the linear-regression config."""
  config = default.get_config()
  config.dataset.name = 'synthetic_regression/linear'
  # The tutorial fits raw x and y; keep its units and dynamics.
  config.dataset.numeric_scaling = 'none'
  config.model.hidden_sizes = ()
  config.optimizer.name = 'sgd'
  config.optimizer.learning_rate = 0.005
  config.optimizer.schedule = 'constant'
  config.batch_size = 128
  config.num_train_steps = 1000
  config.log_every_steps = 50
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 500
  return config
