"""Default config: an MLP on Friedman #1 (`python train.py` trains this).

Every key meshfit reads is declared here, once: its default, what it means,
the values it accepts and whether an evaluation or a resumed run may change
it (configs/settings.py says how). Other configs import this one and
override. Any key can be overridden on the command line, e.g.
`--config.model.hidden_sizes='(64, 64)'` or `--config.mesh.model=2`.
"""

import ml_collections

from meshfit.configs.settings import (EVAL, INVOKER, RESUME, Setting, boolean, config_dict,
                              directory, integer, is_int, is_number, must,
                              number, one_of, path, text, tuple_of)


def _datasets() -> tuple[str, ...]:
  from meshfit.input_pipeline import csv_regression, tables  # noqa: PLC0415
  return tables.GENERATED_DATASETS + (csv_regression.NAME,)


def _activations() -> tuple[str, ...]:
  from meshfit.models import mlp  # noqa: PLC0415  (jax: imported when checked)
  return tuple(mlp.ACTIVATIONS)


def _dtypes() -> tuple[str, ...]:
  from meshfit.models import mlp  # noqa: PLC0415
  return tuple(mlp.DTYPES)


def _is_validation(value) -> bool:
  return is_number(value) and (value == 0 or 0 < value < 1 or (
      value >= 2 and value == int(value)))


_SIZED = 'a positive integer, or 0 to size it to the training table'
_COLUMNS = tuple_of(lambda c: isinstance(c, str), 'column names',
                    '("a", "b")')

SETTINGS = (
    Setting('seed', 0, 'One integer seeds parameters, data order, dropout '
            'and everything random.', integer()),

    # config.dataset: which data, and how it is read.
    Setting('dataset.name', 'synthetic_regression/friedman1',
            'TFDS builder (and config) name: synthetic_regression/linear or '
            'synthetic_regression/friedman1, or csv_regression (your own '
            'tables: configs/csv.py).', one_of(_datasets)),
    Setting('dataset.data_dir', '~/tensorflow_datasets',
            'Where TFDS prepares and reads data (prepared locally, never '
            'downloaded).', path(), EVAL),
    Setting('dataset.train_path', '',
            'csv_regression: the training CSV or Parquet file with a header '
            'row (~ expanded; a glob or comma-separated files for a sharded '
            'table). It may move on resume: every checkpoint records its '
            'content, which must stay the same.', path(), RESUME),
    Setting('dataset.eval_path', '',
            'csv_regression: the CSV or Parquet file scored as the eval '
            'split.', path('the validation rows estimate the error'), EVAL),
    Setting('dataset.target_columns', (),
            'csv_regression: the column names to predict (one or more).',
            _COLUMNS, type=tuple[str, ...]),
    Setting('dataset.feature_columns', (),
            'csv_regression: the input columns; () takes every other usable '
            'one (ids and free text, with nearly one value per row, are left '
            'out).', _COLUMNS, type=tuple[str, ...]),
    Setting('dataset.categorical_columns', (),
            'csv_regression: columns to treat as categories whatever they '
            'hold, e.g. integer codes (text columns are categories anyway).',
            _COLUMNS, type=tuple[str, ...]),
    Setting('dataset.category_min_count', 2,
            'csv_regression: a category value seen fewer times than this in '
            'the training file shares the unknown code with the values never '
            'seen.',
            integer(1, why=': how many training rows a category value needs '
                    'to get a code of its own (1: every value seen)')),
    Setting('dataset.train_split', 'train', 'TFDS split to train on.',
            text()),
    Setting('dataset.eval_split', 'test', 'TFDS split to evaluate.', text(),
            EVAL),
    Setting('dataset.numeric_scaling', 'standardize',
            "How numbers are scaled with the training split's statistics "
            '(stored in the checkpoint): standardize (mean and std), '
            'quantile (to a normal through 128 training quantiles: robust to '
            'outliers and skew), or none: features and targets train as '
            'they are (and missing numbers fail). Otherwise targets are '
            'standardised, metrics stay in original units, and a missing '
            'number takes the training median and a learned indicator.',
            one_of(('standardize', 'quantile', 'none')),
            formerly=('dataset.standardize',)),
    Setting('dataset.validation', 0.0,
            'Validation rows, to pick the best step (its checkpoint is kept '
            'beside the newest; eval and predict use it): a fraction in '
            '(0, 1) of the training rows held out, or a number of folds '
            'k >= 2 to cross-fit, member m training on all but fold m % k and '
            'validated on it, so that every row validates and the ensemble '
            'learns from every row (model.ensemble_size a multiple of k; the '
            'table must fit in dataset.resident_table_mb). Seeded: the same '
            'rows every run. 0: no validation.',
            must(_is_validation, '0 (no validation), a fraction in (0, 1) '
                 'of the training rows to hold out, or a number of folds '
                 '>= 2 to cross-fit'),
            formerly=('dataset.validation_fraction',
                      'dataset.validation_folds')),
    Setting('dataset.prefetch_batches', 2,
            'Chunks of steps_per_call batches a thread prepares ahead when '
            'the table is streamed from the host (a resident table needs '
            'none: its chunks are row indices).', integer(1), EVAL),
    Setting('dataset.resident_table_mb', 1024,
            'A training table (features + targets, float32) up to this many '
            'MiB is read into host memory and copied once to every device '
            '(on CPU: all copies together), and batches are gathered there; '
            'a larger one stays on disk, each process reading only its rows. '
            '0 always streams.', integer(0), RESUME),

    # config.model: the network (models/mlp.py's MlpConfig).
    Setting('model.hidden_sizes', (128, 128),
            'Hidden layer widths; () is a linear model.',
            tuple_of(lambda h: is_int(h) and h > 0, 'positive integers',
                     '(64, 64)'),
            type=tuple[int, ...]),
    Setting('model.activation', 'relu', 'Hidden activation.',
            one_of(_activations)),
    Setting('model.dropout_rate', 0.0,
            'Dropout probability after each hidden activation in training.',
            number(0, 1)),
    Setting('model.dtype', 'float32',
            "Compute dtype of the matmuls' inputs: bfloat16 is mixed "
            'precision (products accumulate in float32, the loss is '
            'float32).', one_of(_dtypes)),
    Setting('model.param_dtype', 'float32',
            'Storage dtype of the parameters, optimizer moments and '
            'checkpoints.', one_of(_dtypes)),
    Setting('model.numeric_embedding', 'none',
            'How each number enters the network: none (its scaled value) or '
            'ple (piecewise-linear encoding over model.ple_bins bins, then a '
            'learned per-number layer of model.numeric_embedding_dim; '
            'Gorishniy et al. 2022).', one_of(('none', 'ple'))),
    # A linear path: quantiles and piecewise-linear bins bend a number, and
    # a relation that is mostly linear then needs many rows to be learnt
    # back.
    Setting('model.raw_numbers', False,
            'Also give the first layer each number as it is: standardised '
            '(training mean and std) and clipped to +-5, beside its scaled '
            'value or embedding.', boolean()),
    Setting('model.ple_bins', 16, 'Bins of the piecewise-linear encoding.',
            integer(1)),
    Setting('model.numeric_embedding_dim', 16,
            "Width of each number's learned embedding (ple).", integer(1)),
    Setting('model.category_embedding_dim', 8,
            "Width of the categories' learned embeddings.", integer(1)),
    Setting('model.category_onehot_max', 0,
            'A category with at most this many codes (its values plus the '
            'unknown and missing codes) enters one-hot instead of embedded; '
            '0: all embedded.', integer(0, words='a non-negative integer')),
    # Cross-fitted members train on different rows: without it a member
    # would score its validation rows with embeddings it never trained.
    Setting('model.category_member_min_count', 0,
            'A member reads a category value as unknown unless its own '
            'training rows hold it at least this often; 0: every member reads '
            'every value of the vocabulary.',
            integer(0, words='a non-negative integer')),
    Setting('model.ridge_blend', False,
            'Each member also holds a ridge regression of its encoded inputs '
            '(numbers, as they are with model.raw_numbers; missing flags; '
            'categories one-hot), fitted in closed form on its training rows, '
            "and predicts a blend of it and the network, the ridge's weight "
            "the one with the least expected error for the networks' average "
            'on the validation rows. Applies to runs that validate '
            '(dataset.validation) with likelihood=squared_error; others go '
            'without.',
            boolean()),
    Setting('model.ensemble_size', 1,
            'Models trained as one program (vmapped over a member axis), '
            'each with its own initialisation and data order from (seed, '
            'member); predictions combine them. 1: a single model.',
            integer(1)),
    Setting('model.likelihood', 'squared_error',
            'squared_error (each member predicts a value), or gaussian (a '
            'mean and a variance, trained on the Gaussian negative '
            'log-likelihood; the ensemble is their mixture, and predict can '
            'write a std and intervals).',
            one_of(('squared_error', 'gaussian'))),
    # 0 is plain NLL: twice the RMSE of beta 0.5 on UCI energy (docs/uci.md).
    Setting('model.nll_beta', 0.5,
            "gaussian only: beta of beta-NLL (Seitzer et al. 2022): each "
            "example's NLL is weighted by its predicted variance to the "
            'power beta (no gradient through the weight), so that the mean is '
            'not left underfit; 0 is plain NLL.',
            number(0, 1, high_open=False)),

    # config.optimizer: optax optimizer and learning-rate schedule.
    Setting('optimizer.name', 'adam', 'The optimizer.',
            one_of(('sgd', 'adam', 'adamw'))),
    Setting('optimizer.learning_rate', 3e-3, 'Peak learning rate.',
            number(0, low_open=True)),
    Setting('optimizer.schedule', 'warmup_cosine',
            'constant, or warmup_cosine (linear warmup then cosine decay to '
            'the end).', one_of(('constant', 'warmup_cosine'))),
    Setting('optimizer.warmup_steps', 200,
            'Linear warmup length in steps (warmup_cosine only).',
            integer(0, words='>= 0')),
    Setting('optimizer.end_learning_rate_factor', 0.01,
            'Final learning rate as a fraction of the peak (warmup_cosine '
            'only).', number(0, 1, high_open=False)),
    Setting('optimizer.cosine_cycles', 1,
            'warmup_cosine: the cosine decay after the warmup repeats this '
            'many times, each cycle over an equal share of the steps '
            '(restarting at the peak); 1 is a single decay over the run.',
            integer(1)),
    Setting('optimizer.weight_decay', 1e-4,
            'Decoupled weight decay (adamw only).', number(0)),
    Setting('optimizer.momentum', 0.0, 'Momentum for sgd; 0 is plain SGD.',
            number(0, 1)),
    Setting('optimizer.grad_clip_norm', 0.0,
            'Clip gradients to this global norm; 0 disables clipping.',
            number(0, why=' (0 disables clipping)')),

    # How long a run trains, in what steps, and how it is watched.
    Setting('batch_size', 256,
            'Global batch size, summed over all devices and hosts. 0 sizes '
            'it to the training table (meshfit/config/sizing.py: a power of '
            'two near 2 sqrt(rows), 32 to 1024).', integer(0, words=_SIZED)),
    Setting('eval_batch_size', 1024,
            'Global batch size for evaluation (the last batch is padded and '
            'masked).', integer(1), EVAL),
    Setting('num_train_steps', 4000,
            'Total optimizer steps of the run (on resume it stretches or '
            'shrinks the warmup_cosine schedule from that step on). 0: '
            'train_epochs epochs of the training rows (at most 20,000 '
            'steps).', integer(0, words=_SIZED), RESUME),
    Setting('train_epochs', 100.0, 'Epochs of a run whose num_train_steps '
            'is 0.',
            number(0, low_open=True, words='a positive number',
                   why=' (the epochs of a run whose num_train_steps is 0)'),
            RESUME),
    Setting('steps_per_call', 0,
            'Optimizer steps per jitted call (a loop on the device): fewer '
            'host round trips. 0 sizes calls to the model (~20 GFLOP on '
            'CPU, up to 128 steps). Log, eval, profile and checkpoint steps '
            'end a call; SIGTERM is answered when the call in flight ends. '
            'Results do not depend on it.', integer(0), RESUME),
    Setting('log_every_steps', 100,
            'Period of the train metrics in steps. 0: about one epoch, and '
            'at least 25 in the run.', integer(0, words=_SIZED), RESUME),
    Setting('eval_every_steps', 1000,
            'Period of evaluations in steps. 0: about one epoch, and at '
            'least 25 in the run.', integer(0, words=_SIZED), RESUME),
    # With validation the eval split selects nothing, and on a small table
    # scoring it each time was much of the run.
    Setting('eval_during_training', True,
            'Score the eval split at every evaluation (eval/* in '
            "metrics.jsonl), or only the final model's at the end.",
            boolean(), RESUME),
    Setting('checkpoint_every_steps', 0,
            'A checkpoint at every multiple of this step (0: none by step '
            'count). Every one asked for is written (in the background on '
            'one host).', integer(0), RESUME),
    # Ten minutes costs one save per ten minutes.
    Setting('checkpoint_every_seconds', 600.0,
            'A checkpoint once this much time has passed since the last, so '
            'that a crash or a hard kill loses at most this much work '
            "whatever the model's speed (0: none by the clock). The final "
            'and SIGTERM checkpoints are always written.',
            number(0, words='a number of seconds >= 0',
                   why=' (0: no checkpoints by the clock)'), RESUME),
    Setting('max_checkpoints_to_keep', 3,
            'Checkpoints kept in workdir/checkpoints (the newest ones; with '
            'validation, the best one is kept beside them).', integer(1),
            RESUME),
    Setting('early_stopping_evals', 0,
            'With validation: stop once this many evaluations in a row have '
            'not improved on the best (0: train every step).', integer(0)),

    # config.sweep: per-member hyperparameters (a sweep in one program):
    # each non-empty grid replaces its config value, and member m takes grid
    # point m % G of the G combinations (model.ensemble_size a multiple of G).
    Setting('sweep.learning_rates', (),
            'Grid of optimizer.learning_rate values, one per member in turn.',
            tuple_of(lambda v: is_number(v) and v > 0,
                     'numbers in (0, inf)', '(0.001, 0.003)'),
            type=tuple[float, ...]),
    Setting('sweep.weight_decays', (),
            'Grid of optimizer.weight_decay values.',
            tuple_of(lambda v: is_number(v) and v >= 0,
                     'numbers in [0, inf)', '(0.0001, 0.001)'),
            type=tuple[float, ...]),
    Setting('sweep.dropout_rates', (), 'Grid of model.dropout_rate values.',
            tuple_of(lambda v: is_number(v) and 0 <= v < 1,
                     'numbers in [0, 1)', '(0.0, 0.1)'),
            type=tuple[float, ...]),
    Setting('sweep.select', 'all',
            'How the members, each scored on the validation rows, make the '
            'model: best (the best member), greedy (the ensemble of the best '
            "few: Caruana et al. 2004's selection with replacement) or all "
            '(every member alike).', one_of(('all', 'best', 'greedy'))),

    # config.mesh: the (members x data x model) device mesh.
    Setting('mesh.members', 1,
            'Devices the members spread over (a divisor of '
            'model.ensemble_size), with no collectives between them.',
            integer(1), EVAL),
    Setting('mesh.data', -1,
            'Devices of the data axis; -1: all remaining devices.',
            must(lambda v: is_int(v) and (v == -1 or v > 0),
                 'a positive size or -1 ("all remaining devices")'), EVAL),
    Setting('mesh.model', 1,
            'Devices of the model axis (hidden layers split over them); -1: '
            'all remaining devices.',
            must(lambda v: is_int(v) and (v == -1 or v > 0),
                 'a positive size or -1 ("all remaining devices")'), EVAL),

    Setting('compilation_cache_dir', '~/.cache/meshfit/jax',
            "JAX's persistent compilation cache: a restarted run loads its "
            'compiled steps from here instead of compiling them again.',
            directory('turn the cache off'), INVOKER),
    Setting('plots', True,
            'Draw loss_curve.png at the end of training and, in '
            '--mode=eval, eval/step_N_predictions.png.', boolean(), EVAL),
    Setting('profile_start_step', 0,
            'jax.profiler trace of steps profile_start_step to '
            '+profile_num_steps-1 into workdir/profile (TensorBoard, '
            'Perfetto); 0 turns it off.', integer(0), RESUME),
    Setting('profile_num_steps', 5, 'Steps the profile traces.', integer(1),
            RESUME),
)


def get_config() -> ml_collections.ConfigDict:
  """Returns the default config: every declared key at its default."""
  return config_dict(SETTINGS)
