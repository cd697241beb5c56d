"""Your own table: a CSV or Parquet file in, an MLP regressor out.

Point it at your files and name the column(s) to predict:

  python train.py --config=configs/csv.py --workdir=runs/mine \
      --config.dataset.train_path=train.csv \
      --config.dataset.eval_path=test.csv \
      --config.dataset.target_columns='("price",)'

Every other usable column is a feature unless dataset.feature_columns names
them (numbers, categories, booleans, dates; missing values filled and
flagged). Numbers are scaled through the training file's quantiles, targets
standardised; a fifth of the training file picks the best step.
docs/tables.md has what these defaults reach on real tables.
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  """Returns the config for a user's CSV or Parquet table."""
  config = default.get_config()
  config.dataset.name = 'csv_regression'
  config.dataset.data_dir = '~/tensorflow_datasets'
  # Numbers through their training quantiles, then piecewise-linear
  # encoding (Gorishniy et al. 2022): robust to skew and outliers, and it
  # lets a small MLP bend where linear inputs cannot. Chosen on the
  # validation rows of tables other than docs/tables.md's (docs/tables.md).
  config.dataset.numeric_scaling = 'quantile'
  config.model.numeric_embedding = 'ple'
  # A fifth of the training file chooses the best step: a small table's
  # test error is lowest long before the last step.
  config.dataset.validation_fraction = 0.2
  config.model.hidden_sizes = (128, 128, 128)
  config.model.activation = 'relu'
  config.model.dropout_rate = 0.1
  # Two members averaged: a cheap ensemble that measured better than one
  # model at the same cost per member.
  config.model.ensemble_size = 2
  config.optimizer.name = 'adamw'
  config.optimizer.learning_rate = 1e-3
  config.optimizer.schedule = 'warmup_cosine'
  config.optimizer.warmup_steps = 100
  config.optimizer.weight_decay = 1e-4
  # A multiple of the devices of any usual mesh (1, 2, 4, 8, 16, 32, 64).
  config.batch_size = 256
  # ~20 epochs of 25k rows, far more of a small table, whose best step
  # the validation rows pick.
  config.num_train_steps = 2000
  config.log_every_steps = 100
  config.eval_every_steps = 100
  return config
