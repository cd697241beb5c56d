"""Your own table: a CSV or Parquet file in, an MLP regressor out.

Point it at your files and name the column(s) to predict:

  python train.py --config=configs/csv.py --workdir=runs/mine \
      --config.dataset.train_path=train.csv \
      --config.dataset.eval_path=test.csv \
      --config.dataset.target_columns='("price",)'

Every other usable column is a feature unless dataset.feature_columns names
them (numbers, categories, booleans, dates; missing values filled and
flagged). Numbers are scaled through the training file's quantiles, targets
standardised; five members, each validated on the fifth of the rows it did
not train on (and reading the category values it did not train as
unknown), pick the best step and stop 15 evaluations after it; batch and
length are sized to the table. Without dataset.eval_path the run reports
its out-of-fold error instead of an eval file's.
docs/tables.md has what these defaults reach on real tables.
"""

import ml_collections

from meshfit.configs import default


def get_config() -> ml_collections.ConfigDict:
  """Returns the config for a user's CSV or Parquet table."""
  config = default.get_config()
  config.dataset.name = 'csv_regression'
  config.dataset.data_dir = '~/tensorflow_datasets'
  # Numbers through their training quantiles, then piecewise-linear
  # encoding (Gorishniy et al. 2022): robust to skew and outliers, and it
  # lets a small MLP bend where linear inputs cannot; beside it each number
  # as it is (standardised, clipped), the linear path a small table needs.
  # Chosen on the dev tables of benchmarks/tables.py (docs/tables.md).
  config.dataset.numeric_scaling = 'quantile'
  config.model.numeric_embedding = 'ple'
  config.model.raw_numbers = True
  # Beside each member's network, a ridge regression of the numbers as
  # they are (and flags, categories one-hot), fitted in closed form; its
  # share of the prediction is weighed against the networks' average, so
  # it takes a few hundred rows of collinear numbers (spectra) and leaves
  # tables the networks fit alone. A run that predicts distributions
  # (model.likelihood=gaussian) or validates on no rows goes without.
  config.model.ridge_blend = True
  # Five members cross-fitted over five folds: each trains on four fifths
  # of the rows and picks the best step on the fifth it did not see, so the
  # ensemble learns from every row and is judged on every row.
  config.dataset.validation = 5
  config.model.ensemble_size = 5
  # Each member reads a category value as unknown unless its own training
  # rows hold it twice (as the plan asks of the whole file), so that its
  # validation rows are never scored with an embedding it did not train;
  # higher counts bought nothing on the dev tables (docs/tables.md).
  config.model.category_member_min_count = 2
  config.model.hidden_sizes = (128, 128, 128)
  config.model.activation = 'relu'
  # No dropout: in a regression it scales the hidden units' variance
  # differently in training and in prediction, and on the dev tables it
  # cost more than it regularised (docs/tables.md); the members, weight
  # decay and the best step regularise instead.
  config.model.dropout_rate = 0.0
  config.optimizer.name = 'adamw'
  # 3e-3: the larger dev tables get further in their steps (validation
  # 0.99x of 2e-3's) and the smaller ones are unchanged when each validation
  # row is scored by two members, as predictions are by several; lower
  # rates were worse, and 5e-3 cost the smaller tables (docs/tables.md).
  config.optimizer.learning_rate = 3e-3
  config.optimizer.schedule = 'warmup_cosine'
  config.optimizer.warmup_steps = 0
  config.optimizer.weight_decay = 1e-4
  # Sized to the table (meshfit/config/sizing.py): a batch near 2 sqrt(rows), 100
  # epochs (at most 20,000 steps), evaluated every epoch; a small table's
  # best step comes within a few epochs, a large one's late.
  config.batch_size = 0
  config.num_train_steps = 0
  config.train_epochs = 100.0
  config.log_every_steps = 0
  config.eval_every_steps = 0
  # Stop once 15 evaluations (about 15 epochs) in a row have not improved
  # the validation loss: on the dev and shared tables no run's best step
  # came later than that after a better one (docs/tables.md), and a small
  # table's best comes within a few epochs of the 100 it would otherwise
  # train.
  config.early_stopping_evals = 15
  # The eval file selects nothing: it is scored once, for the final model.
  config.eval_during_training = False
  return config
