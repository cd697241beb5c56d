"""`Regressor`: meshfit as a scikit-learn estimator, for `cross_val_score`,
`Pipeline` and `GridSearchCV`.

Each `fit` is a `meshfit.fit` of the rows given (a temporary run, kept by
the fitted estimator as `model_`), so the numbers are the library's and the
command line's; the parameters are the table settings a user tunes, their
defaults configs/csv.py's, and `config` takes any other key.
"""

from __future__ import annotations

import functools
import inspect
import io
import tarfile
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from meshfit.configs import csv, default
from meshfit.api import fitting
from meshfit.api.model import Model
from meshfit.errors import UsageError

_CSV = csv.get_config()

# The fitted estimator's target column(s) when y has no names of its own.
TARGET_NAME = 'target'


class Regressor(RegressorMixin, BaseEstimator):
  """An MLP regressor (an ensemble of them) over a table, as scikit-learn
  estimators are used: `fit(X, y)`, `predict(X)`, `score(X, y)` (R²).

  X is a DataFrame (taken as it comes: numbers, categories, booleans,
  dates, missing values, as `meshfit.fit` reads it) or an array (columns
  named x0, x1, ...); y one target (1-D) or several (2-D). Each parameter
  sets the key of configs/csv.py whose last part is its name, and that
  key's value there is its default.

  Args:
    hidden_sizes: model.hidden_sizes, the hidden layers' widths.
    activation: model.activation.
    learning_rate: optimizer.learning_rate, the peak learning rate.
    weight_decay: optimizer.weight_decay.
    batch_size: batch_size (0: sized to the table).
    train_epochs: train_epochs, the epochs of a run whose num_train_steps
      is 0.
    num_train_steps: num_train_steps (0: `train_epochs` of the rows).
    ensemble_size: model.ensemble_size, the members (a multiple of the
      folds of `validation`).
    validation: dataset.validation: a number of folds k >= 2 (each member
      validated on one, trained on the others), a fraction of the rows held
      out, or 0 (no validation).
    numeric_scaling: dataset.numeric_scaling (quantile or standardize).
    seed: seed, for parameters, data order and folds.
    verbose: 0 quiet but for warnings; 1 a progress display; 2 every
      logged scalar too (as `meshfit.fit`'s).
    config: any other keys, dotted (`{'model.dropout_rate': 0.1}`), over
      configs/csv.py; not the keys the parameters above set.

  Attributes:
    model_: the fitted `meshfit.Model` (its history, columns, plot, save).
    n_features_in_: the number of columns of X.
    feature_names_in_: X's column names, when X had string names.
  """

  def __init__(self, hidden_sizes: tuple[int, ...] = tuple(
                   _CSV.model.hidden_sizes),
               activation: str = _CSV.model.activation,
               learning_rate: float = _CSV.optimizer.learning_rate,
               weight_decay: float = _CSV.optimizer.weight_decay,
               batch_size: int = _CSV.batch_size,
               train_epochs: float = _CSV.train_epochs,
               num_train_steps: int = _CSV.num_train_steps,
               ensemble_size: int = _CSV.model.ensemble_size,
               validation: float = _CSV.dataset.validation,
               numeric_scaling: str = _CSV.dataset.numeric_scaling,
               seed: int = _CSV.seed, verbose: int = 0,
               config: Mapping[str, Any] | None = None):
    self.hidden_sizes = hidden_sizes
    self.activation = activation
    self.learning_rate = learning_rate
    self.weight_decay = weight_decay
    self.batch_size = batch_size
    self.train_epochs = train_epochs
    self.num_train_steps = num_train_steps
    self.ensemble_size = ensemble_size
    self.validation = validation
    self.numeric_scaling = numeric_scaling
    self.seed = seed
    self.verbose = verbose
    self.config = config

  def fit(self, X: Any, y: Any) -> Regressor:
    """Trains on the rows of X and y (a new run each call).

    Args:
      X: a DataFrame, or an array of shape (rows, columns).
      y: the target, of shape (rows,), or (rows, targets) for several.

    Returns:
      self, fitted.

    Raises:
      ValueError: X or y of the wrong shape, or empty.
      UsageError: a bad parameter or config key (a ValueError too).
      DataError: a table meshfit cannot use.
    """
    if y is None:
      raise ValueError('Regressor requires y to be passed, but the target y '
                       'is None')
    frame = self._frame(X, reset=True)
    y_NxT, one_target = _targets(y, len(frame))
    if len(frame) < 2:
      raise ValueError(f'n_samples = {len(frame)}: a Regressor needs at '
                       'least 2 rows')
    self.targets_ = _target_names(y, y_NxT.shape[1], frame.columns)
    self._one_target = one_target
    for t, name in enumerate(self.targets_):
      frame[name] = y_NxT[:, t]
    with tempfile.TemporaryDirectory(prefix='meshfit-tables-') as data_dir:
      self.model_ = fitting.fit(frame, self.targets_,
                                config=self._settings(data_dir),
                                verbose=self.verbose)
    return self

  def predict(self, X: Any) -> np.ndarray:
    """The ensemble's predictions for the rows of X.

    Returns:
      float64, of shape (rows,) for a model fitted on a 1-D y, else
      (rows, targets).
    """
    check_is_fitted(self, 'model_')
    frame = self._frame(X, reset=False)
    pred = self.model_.predict(frame)
    pred_NxT = pred[[f'{t}_pred' for t in self.targets_]].to_numpy(
        np.float64)
    return pred_NxT[:, 0] if self._one_target else pred_NxT

  def _settings(self, data_dir: str) -> dict[str, Any]:
    """The dotted keys of the run: `config`, the parameters, and what an
    estimator's run needs (its own table folder, no loss-curve file)."""
    given = dict(self.config or {})
    keys = parameter_keys()
    taken = sorted(set(given) & set(keys.values()))
    if taken:
      names = {v: k for k, v in keys.items()}
      raise UsageError(f'config sets {", ".join(taken)}: give '
                       f'{", ".join(names[k] + "=" for k in taken)} instead')
    settings = {'dataset.data_dir': data_dir, 'plots': False, **given}
    for name, key in keys.items():
      value = getattr(self, name)
      settings[key] = tuple(value) if name == 'hidden_sizes' else value
    return settings

  def _frame(self, X: Any, *, reset: bool) -> pd.DataFrame:
    """X as the table meshfit reads: a DataFrame as it is (names as
    strings), an array's columns named x0, x1, ..."""
    if isinstance(X, pd.DataFrame):
      validate_data(self, X, reset=reset, skip_check_array=True)
      if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f'X has shape {X.shape}: fit and predict need at '
                         'least one row and one column')
      frame = X.copy()
      frame.columns = [str(c) for c in X.columns]
      return frame.reset_index(drop=True)
    x_NxF = validate_data(self, X, reset=reset, dtype=None,
                          ensure_all_finite='allow-nan')
    if x_NxF.dtype == object:
      # Numbers held as objects are numbers; strings stay (categories), and
      # a cell that is neither is a TypeError, as scikit-learn's.
      try:
        x_NxF = check_array(x_NxF, dtype='numeric',
                            ensure_all_finite='allow-nan')
      except ValueError:
        pass
    return pd.DataFrame(x_NxF, columns=[f'x{i}'
                                        for i in range(x_NxF.shape[1])])

  # A fitted estimator pickles with its run (joblib's workers, `pickle`):
  # the workdir's files travel as a tar archive and unpack into a new
  # temporary workdir.

  def __getstate__(self) -> dict[str, Any]:
    state = self.__dict__.copy()
    model = state.pop('model_', None)
    if model is not None:
      model._written()  # noqa: SLF001 (the package's own model)
      buffer = io.BytesIO()
      with tarfile.open(fileobj=buffer, mode='w') as tar:
        tar.add(model.workdir, arcname='.')
      state['_run_tar'] = (buffer.getvalue(), model.step)
    return state

  def __setstate__(self, state: dict[str, Any]) -> None:
    run = state.pop('_run_tar', None)
    self.__dict__.update(state)
    if run is not None:
      content, step = run
      owned = tempfile.TemporaryDirectory(prefix='meshfit-')
      with tarfile.open(fileobj=io.BytesIO(content)) as tar:
        tar.extractall(owned.name, filter='data')
      self.model_ = Model(owned.name, step, owned=owned,
                          verbose=self.verbose)

  def __sklearn_tags__(self):
    tags = super().__sklearn_tags__()
    tags.input_tags.allow_nan = True  # missing numbers are filled and flagged
    tags.target_tags.multi_output = True
    tags.target_tags.single_output = True
    return tags


@functools.cache
def parameter_keys() -> dict[str, str]:
  """{Regressor's parameter: the config key it sets}: the declared key
  whose last part is the parameter's name."""
  keys = {}
  for name in inspect.signature(Regressor.__init__).parameters:
    if name in ('self', 'verbose', 'config'):
      continue
    (keys[name],) = [s.key for s in default.SETTINGS
                     if s.key.rsplit('.', 1)[-1] == name]
  return keys


def _targets(y: Any, rows: int) -> tuple[np.ndarray, bool]:
  """y as a (rows, targets) float array, and whether it was 1-D."""
  y_array = check_array(y, ensure_2d=False, dtype=np.float64,
                        input_name='y')
  if y_array.ndim not in (1, 2):
    raise ValueError(f'y has shape {y_array.shape}: give (rows,) or '
                     '(rows, targets)')
  if len(y_array) != rows:
    raise ValueError(f'X has {rows} rows but y has {len(y_array)}')
  one_target = y_array.ndim == 1
  return (y_array[:, None] if one_target else y_array), one_target


def _target_names(y: Any, count: int, columns: pd.Index) -> tuple[str, ...]:
  """The target columns' names: y's own (a named Series, a DataFrame's
  columns) unless X has them, else target, target_1, ..."""
  if isinstance(y, pd.Series) and isinstance(y.name, str):
    names = (y.name,)
  elif isinstance(y, pd.DataFrame):
    names = tuple(str(c) for c in y.columns)
  else:
    names = ((TARGET_NAME,) if count == 1 else
             tuple(f'{TARGET_NAME}_{t}' for t in range(count)))
  taken = set(columns)
  if taken & set(names) or len(set(names)) != len(names):
    names = tuple(f'{TARGET_NAME}_{t}' for t in range(count))
    while taken & set(names):
      names = tuple('_' + n for n in names)
  return names

