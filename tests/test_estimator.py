"""meshfit.Regressor as scikit-learn uses an estimator: clone, Pipeline,
cross_val_score, GridSearchCV, pickling, and scikit-learn's own checks.

The estimators here train a few steps of a small net (the checks fit
dozens of times); programs of the same shapes are compiled once.
"""

import pickle

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import meshfit

pytestmark = pytest.mark.slow

# Short runs of a small net: enough to learn a linear table well.
TINY = dict(hidden_sizes=(16,), num_train_steps=80, batch_size=32,
            ensemble_size=2, validation=2)


def _linear_table(rows: int = 120, seed: int = 0):
  rng = np.random.default_rng(seed)
  x_NxF = rng.normal(size=(rows, 4))
  y_N = x_NxF @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.1 * rng.normal(size=rows)
  return x_NxF, y_N


@pytest.fixture(scope='module')
def table():
  return _linear_table()


@pytest.fixture(scope='module')
def fitted(table):
  x_NxF, y_N = table
  return meshfit.Regressor(**TINY).fit(x_NxF, y_N)


def test_an_array_fit_learns_the_table_and_names_its_columns(fitted, table):
  x_NxF, y_N = table
  pred_N = fitted.predict(x_NxF)
  assert pred_N.shape == y_N.shape and pred_N.dtype == np.float64
  assert fitted.score(x_NxF, y_N) > 0.8
  assert fitted.n_features_in_ == 4
  assert not hasattr(fitted, 'feature_names_in_')
  assert list(fitted.model_.columns.index) == ['x0', 'x1', 'x2', 'x3']
  assert fitted.model_.targets == ('target',)


def test_the_parameters_set_the_run_config(fitted):
  config = fitted.model_.config
  assert tuple(config.model.hidden_sizes) == (16,)
  assert config.num_train_steps == 80 and config.batch_size == 32
  assert config.model.ensemble_size == 2
  # The rest is configs/csv.py's.
  assert config.optimizer.name == 'adamw'
  assert config.dataset.numeric_scaling == 'quantile'


def test_each_parameter_sets_the_key_of_its_name():
  from meshfit.api import estimator  # noqa: PLC0415
  keys = estimator.parameter_keys()
  assert keys['hidden_sizes'] == 'model.hidden_sizes'
  assert keys['learning_rate'] == 'optimizer.learning_rate'
  assert keys['validation'] == 'dataset.validation'
  assert keys['train_epochs'] == 'train_epochs'
  assert 'verbose' not in keys and 'config' not in keys


def test_defaults_are_configs_csv():
  from meshfit.configs import csv  # noqa: PLC0415
  config, params = csv.get_config(), meshfit.Regressor().get_params()
  assert params['hidden_sizes'] == tuple(config.model.hidden_sizes)
  assert params['learning_rate'] == config.optimizer.learning_rate
  assert params['ensemble_size'] == config.model.ensemble_size
  assert params['train_epochs'] == config.train_epochs
  assert params['numeric_scaling'] == config.dataset.numeric_scaling


def test_a_dataframe_keeps_its_columns_and_a_frame_y_gives_two_targets():
  rng = np.random.default_rng(1)
  rows = 120
  frame = pd.DataFrame({'size': rng.normal(size=rows),
                        'colour': rng.choice(['red', 'green', 'blue'], rows)})
  shift = frame['colour'].map({'red': 2.0, 'green': 0.0, 'blue': -2.0})
  y = pd.DataFrame({'a': frame['size'] + shift, 'b': 2 * frame['size']})
  model = meshfit.Regressor(**TINY).fit(frame, y)
  assert list(model.feature_names_in_) == ['size', 'colour']
  assert model.model_.columns.loc['colour', 'kind'] == 'category'
  pred_Nx2 = model.predict(frame)
  assert pred_Nx2.shape == (rows, 2)
  assert model.score(frame, y) > 0.8
  with pytest.raises(ValueError, match='feature names'):
    model.predict(frame[['colour', 'size']].rename(columns={'size': 'x'}))


def test_config_takes_other_keys_and_refuses_the_parameters(table):
  x_NxF, y_N = table
  model = meshfit.Regressor(**TINY, config={'optimizer.name': 'adam'})
  assert model.fit(x_NxF, y_N).model_.config.optimizer.name == 'adam'
  with pytest.raises(meshfit.UsageError, match='give hidden_sizes= instead'):
    meshfit.Regressor(config={'model.hidden_sizes': (8,)}).fit(x_NxF, y_N)
  with pytest.raises(meshfit.UsageError, match='model.no_such_key'):
    meshfit.Regressor(**TINY, config={'model.no_such_key': 1}).fit(x_NxF, y_N)


def test_clone_and_pickle_keep_what_was_fitted(fitted, table):
  x_NxF, _ = table
  copy = clone(fitted)
  assert copy.get_params() == fitted.get_params()
  assert not hasattr(copy, 'model_')
  restored = pickle.loads(pickle.dumps(fitted))
  assert restored.model_.workdir != fitted.model_.workdir
  np.testing.assert_array_equal(restored.predict(x_NxF),
                                fitted.predict(x_NxF))


def test_in_a_pipeline_cross_val_score_and_grid_search(table):
  x_NxF, y_N = table
  pipeline = make_pipeline(StandardScaler(), meshfit.Regressor(**TINY))
  scores = cross_val_score(pipeline, x_NxF, y_N,
                           cv=KFold(3, shuffle=True, random_state=0))
  assert scores.shape == (3,) and np.all(scores > 0.7)
  # The networks alone, which the rate moves (the ridge parts fit this
  # linear table whatever the rate).
  search = GridSearchCV(meshfit.Regressor(
      **TINY, config={'model.ridge_blend': False}),
                        {'learning_rate': [1e-5, 3e-3]}, cv=2)
  search.fit(x_NxF, y_N)
  # A rate that barely moves the weights in 80 steps loses.
  assert search.best_params_ == {'learning_rate': 3e-3}
  assert search.cv_results_['mean_test_score'][0] < 0.5
  assert search.best_estimator_.score(x_NxF, y_N) > 0.8


# Every check of scikit-learn's applies and passes, so none is listed as
# expected to fail (check_array_api_input skips itself unless
# SCIPY_ARRAY_API is set).
@parametrize_with_checks([meshfit.Regressor(**TINY)])
def test_scikit_learn_checks(estimator, check):
  check(estimator)
