"""Your own table: a CSV or Parquet file in, an MLP regressor out.

Point it at your files and name the column(s) to predict:

  python train.py --config=configs/csv.py --workdir=runs/mine \
      --config.dataset.train_path=train.csv \
      --config.dataset.eval_path=test.csv \
      --config.dataset.target_columns='("price",)'

Every other numeric column is a feature unless dataset.feature_columns names
them. Features and targets are standardised with the training file's
statistics. docs/uci.md has what these defaults reach on the UCI tables.
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  """Returns the config for a user's CSV or Parquet table."""
  config = default.get_config()
  config.dataset.name = 'csv_regression'
  config.dataset.data_dir = '~/tensorflow_datasets'
  config.model.hidden_sizes = (64, 64)
  config.model.activation = 'relu'
  config.optimizer.name = 'adamw'
  config.optimizer.learning_rate = 3e-3
  config.optimizer.schedule = 'warmup_cosine'
  config.optimizer.warmup_steps = 100
  config.optimizer.weight_decay = 1e-4
  # Small enough for many updates per epoch on a few hundred rows; a
  # multiple of the devices of any usual mesh (1, 2, 4, 8, 16, 32, 64).
  config.batch_size = 64
  # ~700 epochs of 1k rows, ~13 of 50k: the cosine decay keeps the small
  # table from overfitting late, and the large one still converges.
  config.num_train_steps = 10_000
  config.log_every_steps = 100
  config.eval_every_steps = 2000
  return config
