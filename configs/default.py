"""Default config: an MLP on Friedman #1 (`python train.py` trains this).

Every key meshfit reads is declared here with a comment; other configs import
this one and override. Any key can be overridden on the command line, e.g.
`--config.model.hidden_sizes='(64, 64)'` or `--config.mesh.model=2`.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """Returns the default config."""
  config = ml_collections.ConfigDict()
  # One integer seeds parameters, data order, dropout and everything random.
  config.seed = 0

  config.dataset = ml_collections.ConfigDict()
  # TFDS builder (and config) name: synthetic_regression/{linear,friedman1}
  # or csv_regression (a user's own tables, see configs/csv.py).
  config.dataset.name = 'synthetic_regression/friedman1'
  # Where TFDS prepares and reads data (prepared locally, never downloaded).
  config.dataset.data_dir = '~/tensorflow_datasets'
  # csv_regression only: CSV or Parquet files with a header row (~ expanded).
  config.dataset.train_path = ''
  config.dataset.eval_path = ''
  # csv_regression only: tuple of the column names to predict (one or more).
  config.dataset.target_columns = ()
  # csv_regression only: tuple of input columns; () = every other usable one
  # (ids and free text, with nearly one value per row, are left out).
  config.dataset.feature_columns = ()
  # csv_regression only: columns to treat as categories whatever they hold,
  # e.g. integer codes (text columns are categories anyway).
  config.dataset.categorical_columns = ()
  # csv_regression only: a category value seen fewer times than this in the
  # training file shares the unknown code with the values never seen.
  config.dataset.category_min_count = 2
  # TFDS split names for training and evaluation.
  config.dataset.train_split = 'train'
  config.dataset.eval_split = 'test'
  # Train on features and targets scaled with the training split's
  # statistics (stored in the checkpoint); metrics stay in original units.
  # False trains on the raw numbers (and fails on missing ones).
  config.dataset.standardize = True
  # How numbers are scaled: standardize (mean and std) or quantile (to a
  # normal distribution through 128 training quantiles: robust to outliers
  # and skew). Missing numbers take the training median and get a learned
  # indicator input.
  config.dataset.numeric_scaling = 'standardize'
  # Fraction of the training split held out (seeded, the same every run) to
  # pick the best step: evaluated every eval_every_steps, its best
  # checkpoint is kept beside the newest ones and eval/predict use it.
  # 0: no validation.
  config.dataset.validation_fraction = 0.0
  # Cross-fitting instead: the training rows dealt into this many folds
  # (seeded, the same every run), member m trained on all but fold
  # m % folds and validated on it, so that every row validates and the
  # ensemble learns from every row. model.ensemble_size must be a multiple;
  # the table must fit in memory (dataset.resident_table_mb). 0: no folds.
  config.dataset.validation_folds = 0
  # Chunks of steps_per_call batches that a thread prepares ahead when the
  # table is streamed from the host (a resident table's chunks are made
  # when needed: they are only row indices).
  config.dataset.prefetch_batches = 2
  # A training table (features + targets, float32) up to this many MiB is
  # read into host memory and copied once to every device (on CPU: all
  # copies together), and batches are gathered there; a larger one stays on
  # disk, each process reading only its rows. 0 always streams.
  config.dataset.resident_table_mb = 1024

  config.model = ml_collections.ConfigDict()
  # Hidden layer widths; () is a linear model.
  config.model.hidden_sizes = (128, 128)
  # Hidden activation: relu, gelu, tanh, silu, elu, sigmoid or identity.
  config.model.activation = 'relu'
  # Dropout probability after each hidden activation during training.
  config.model.dropout_rate = 0.0
  # Compute dtype of the matmuls' inputs: float32, or bfloat16 (mixed
  # precision: products accumulate in float32, the loss is float32).
  config.model.dtype = 'float32'
  # Storage dtype of the parameters, optimizer moments and checkpoints.
  config.model.param_dtype = 'float32'
  # How each number enters the network: none (the scaled value itself) or
  # ple (piecewise-linear encoding over ple_bins bins, then a learned
  # per-number layer of numeric_embedding_dim; Gorishniy et al. 2022).
  config.model.numeric_embedding = 'none'
  # Also give the first layer each number as it is: standardised (training
  # mean and std) and clipped to +-5, beside its scaled value or embedding.
  # A linear path: quantiles and piecewise-linear bins bend a number, and a
  # relation that is mostly linear then needs many rows to be learnt back.
  config.model.raw_numbers = False
  config.model.ple_bins = 16
  config.model.numeric_embedding_dim = 16
  # Width of the categories' learned embeddings.
  config.model.category_embedding_dim = 8
  # A category with at most this many codes (its values plus the unknown and
  # missing codes) enters one-hot instead of embedded; 0: all embedded.
  config.model.category_onehot_max = 0
  # Cross-fitted members train on different rows: a member reads a category
  # value as unknown unless its own training rows hold it at least this
  # often, so that no member scores rows with an embedding it never trained.
  # 0: every member reads every value of the vocabulary.
  config.model.category_member_min_count = 0
  # Each member also holds a ridge regression of its encoded inputs
  # (numbers, missing flags, categories one-hot), fitted in closed form on
  # its training rows, and predicts a blend of it and the network, the
  # ridge's weight chosen on the validation rows (so it needs them:
  # dataset.validation_folds or validation_fraction). squared_error only.
  config.model.ridge_blend = False
  # Models trained as one program (vmapped over a member axis), each with
  # its own initialisation and data order from (seed, member); predictions
  # combine them. 1: a single model.
  config.model.ensemble_size = 1
  # squared_error (each member predicts a value), or gaussian (a mean and a
  # variance, trained on the Gaussian negative log-likelihood; the ensemble
  # is their mixture, and predict can write a std and intervals).
  config.model.likelihood = 'squared_error'
  # gaussian only: beta of beta-NLL (Seitzer et al. 2022): each example's
  # NLL is weighted by its predicted variance ** beta (no gradient through
  # the weight), so that the mean is not left underfit; 0 is plain NLL
  # (twice the RMSE of beta 0.5 on UCI energy: docs/uci.md).
  config.model.nll_beta = 0.5

  config.optimizer = ml_collections.ConfigDict()
  # sgd, adam or adamw.
  config.optimizer.name = 'adam'
  # Peak learning rate.
  config.optimizer.learning_rate = 3e-3
  # constant, or warmup_cosine (linear warmup then cosine decay to the end).
  config.optimizer.schedule = 'warmup_cosine'
  # Linear warmup length in steps (warmup_cosine only).
  config.optimizer.warmup_steps = 200
  # Final learning rate as a fraction of the peak (warmup_cosine only).
  config.optimizer.end_learning_rate_factor = 0.01
  # warmup_cosine: the cosine decay after the warmup repeats this many
  # times, each cycle over an equal share of the steps (restarting at the
  # peak); 1 is a single decay over the run.
  config.optimizer.cosine_cycles = 1
  # Decoupled weight decay (adamw only).
  config.optimizer.weight_decay = 1e-4
  # Momentum for sgd; 0 is plain SGD.
  config.optimizer.momentum = 0.0
  # Clip gradients to this global norm; 0 disables clipping.
  config.optimizer.grad_clip_norm = 0.0

  # Global batch size, summed over all devices and hosts. 0 sizes it to the
  # training table (meshfit/config/sizing.py: a power of two near 2 sqrt(rows),
  # 32 to 1024).
  config.batch_size = 256
  # Global batch size for evaluation (the last batch is padded and masked).
  config.eval_batch_size = 1024
  # Total optimizer steps of the run. 0: train_epochs epochs of the training
  # rows (at most 20,000 steps).
  config.num_train_steps = 4000
  # Epochs of a run whose num_train_steps is 0.
  config.train_epochs = 100.0
  # Optimizer steps per jitted call (a loop on the device): fewer host round
  # trips. 0 sizes calls to the model (~20 GFLOP on CPU, up to 128 steps).
  # Log, eval, profile and checkpoint steps end a call; SIGTERM
  # is answered when the call in flight ends. Results do not depend on it.
  config.steps_per_call = 0
  # Periods in steps: train metrics, evaluation. 0: about one epoch, and at
  # least 25 in the run.
  config.log_every_steps = 100
  config.eval_every_steps = 1000
  # Score the eval split at every evaluation (eval/* in metrics.jsonl), or
  # only the final model's at the end: with validation it selects nothing,
  # and on a small table scoring it each time was much of the run.
  config.eval_during_training = True
  # A checkpoint at every multiple of this step (0: none by step count).
  # Every one asked for is written (in the background on one host).
  config.checkpoint_every_steps = 0
  # A checkpoint once this much time has passed since the last, so that a
  # crash or a hard kill loses at most this much work whatever the model's
  # speed (0: none by the clock). Ten minutes costs one save per ten minutes.
  # The final and SIGTERM checkpoints are always written.
  config.checkpoint_every_seconds = 600.0
  # Checkpoints kept in workdir/checkpoints (the newest ones; with
  # validation, the best one is kept beside them).
  config.max_checkpoints_to_keep = 3
  # With validation: stop once this many evaluations in a row have not
  # improved on the best (0: train every step).
  config.early_stopping_evals = 0

  # Per-member hyperparameters (a sweep in one program): each non-empty grid
  # replaces its config value, and member m takes grid point m % G of the G
  # combinations (model.ensemble_size must be a multiple of G). Every member
  # is scored on the validation rows, and `select` decides the model:
  # best (the best member), greedy (the ensemble of the best few: Caruana
  # et al. 2004's selection with replacement) or all (every member alike).
  config.sweep = ml_collections.ConfigDict()
  config.sweep.learning_rates = ()
  config.sweep.weight_decays = ()
  config.sweep.dropout_rates = ()
  config.sweep.select = 'all'

  config.mesh = ml_collections.ConfigDict()
  # Device mesh shape (members x data x model); -1 means "all remaining
  # devices" (data or model). Members spread over `members` devices (a
  # divisor of model.ensemble_size) with no collectives between them.
  config.mesh.members = 1
  config.mesh.data = -1
  config.mesh.model = 1

  # JAX's persistent compilation cache: a restarted run loads its compiled
  # steps from here instead of compiling them again. '' turns it off.
  config.compilation_cache_dir = '~/.cache/meshfit/jax'
  # Draw loss_curve.png at the end of training and, in --mode=eval,
  # eval/step_N_predictions.png.
  config.plots = True
  # jax.profiler trace of steps profile_start_step..+profile_num_steps-1 into
  # workdir/profile (TensorBoard's profile plugin, Perfetto); 0 turns it off.
  config.profile_start_step = 0
  config.profile_num_steps = 5
  return config
