"""The members' ridge parts: their closed-form fit, penalty and placement."""

import dataclasses

import jax
import numpy as np
import pandas as pd
import pytest

from meshfit.configs import default
from meshfit.input_pipeline.tables import Table, generated_plan
from meshfit import config as config_lib
from meshfit.checkpoints import reading
from meshfit.data import features, splits as splits_lib
from meshfit.data.features import FeatureStats, InputLayout
from meshfit.model import inference, optim, ridge_fit, state as state_lib
from meshfit.model.setup import make_setup
from meshfit.models import mlp

N = 600


def _table(seed: int = 0, noise: float = 0.3, signal: float = 1.0):
  """Two numbers (the second missing in a tenth of the rows) and a
  category of codes 2..5 (6 codes: unknown, missing and four values)."""
  rng = np.random.default_rng(seed)
  x_NxF = np.concatenate([rng.normal(size=(N, 2)),
                          rng.integers(2, 6, size=(N, 1))], axis=1)
  x_NxF[rng.random(N) < 0.1, 1] = np.nan
  y_N = signal * (2 * x_NxF[:, 0] + 1.5 * (x_NxF[:, 2] == 3)
                  - np.nan_to_num(x_NxF[:, 1])) + noise * rng.normal(size=N)
  layout = InputLayout.of((0, 0, 6), (False, True, False), 'quantile',
                          raw_numbers=True)
  x_NxF, y_NxT = x_NxF.astype(np.float32), y_N[:, None].astype(np.float32)
  stats = FeatureStats.fit(layout, x_NxF, y_NxT)
  z_NxT = (y_NxT.astype(np.float64) - stats.y_mean_T) / stats.y_std_T
  return layout, stats, x_NxF, y_NxT, z_NxT


def _direct(design_NxD, z_NxT, train_N, penalty):
  """The ridge solution by a plain solve: mean squared error plus penalty
  |w|^2, the intercept unpenalised."""
  x, z = design_NxD[train_N], z_NxT[train_N]
  mean_x, mean_z = x.mean(axis=0), z.mean(axis=0)
  xc = x - mean_x
  w = np.linalg.solve(xc.T @ xc / len(x) + penalty * np.eye(x.shape[1]),
                      xc.T @ (z - mean_z) / len(x))
  return w, mean_z - mean_x @ w


@pytest.mark.parametrize('scaling', ['quantile', 'none'])
def test_the_design_is_what_the_ridge_part_reads(scaling):
  # The fit encodes raw numbers on the host; the model's ridge part reads
  # them from features.model_inputs: the two must agree, the scaled
  # numbers left at zero (float32 both, XLA's division rounding as it may).
  layout, _, x, y, _ = _table()
  layout = dataclasses.replace(layout, scaling=scaling)
  stats = FeatureStats.fit(layout, x, y)
  inputs = jax.device_get(features.model_inputs(stats, layout, x))
  expected = np.concatenate([
      np.zeros_like(inputs['numbers']), inputs['raw'], inputs['missing'],
      np.eye(6)[inputs['codes'][:, 0]]], axis=1)
  np.testing.assert_allclose(ridge_fit.design(stats, layout, x), expected,
                             rtol=0, atol=1e-6)


def test_each_fold_is_the_ridge_solution_and_scored_out_of_fold():
  layout, stats, x, _, z = _table()
  fold_N = np.random.default_rng(1).integers(0, 4, N)
  fit = ridge_fit.fit(stats, layout, x, z, fold_N, fits=4)
  design = ridge_fit.design(stats, layout, x)
  # 2 quantile-scaled numbers, 2 raw, 1 flag; then 6 one-hot codes.
  assert design.shape == (N, 11)
  assert fit.kernel_KxDxT.shape == (4, 5, 1)
  assert fit.table_KxVxT.shape == (4, 6, 1)
  np.testing.assert_array_equal(design[:, 5:].sum(axis=1), 1.0)
  sse = 0.0
  for k in range(4):
    w, b = _direct(design, z, fold_N != k, fit.penalty_T[0])
    got = np.concatenate([fit.kernel_KxDxT[k], fit.table_KxVxT[k]])
    np.testing.assert_allclose(got, w, atol=1e-7)
    np.testing.assert_allclose(fit.bias_KxT[k], b, atol=1e-7)
    own = fold_N == k
    sse += np.sum((design[own] @ got + fit.bias_KxT[k] - z[own])**2)
  # Its validation score is each row predicted by the fit that left it out.
  assert fit.validation_mse_T[0] == pytest.approx(sse / N, rel=1e-9)
  assert fit.validation_mse_T[0] < 0.05  # the table is linear in these
  assert fit.rows == N


def test_the_penalty_is_the_one_every_row_scores_best():
  # Each fit scores a penalty on the rows it left out (their squared error)
  # and on those it trains on (generalised cross-validation: their squared
  # error over (1 - trace of the hat matrix / rows)^2).
  layout, stats, x, _, z = _table()
  fold_N = np.arange(N) % 3
  design = ridge_fit.design(stats, layout, x)
  chosen = ridge_fit.fit(stats, layout, x, z, fold_N, fits=3)

  def scores(penalty):
    held, every = 0.0, 0.0
    for k in range(3):
      train = fold_N != k
      w, b = _direct(design, z, train, penalty)
      held += np.sum((design[~train] @ w + b - z[~train])**2)
      xc = design[train] - design[train].mean(axis=0)
      hat = xc @ np.linalg.solve(xc.T @ xc + train.sum() * penalty
                                 * np.eye(xc.shape[1]), xc.T)
      df = np.trace(hat) + 1
      every += (np.sum((design[train] @ w + b - z[train])**2)
                / (1 - df / train.sum())**2)
    return held / N, held + every
  held, every = zip(*[scores(p) for p in ridge_fit.PENALTIES])
  best = int(np.argmin(every))
  assert chosen.penalty_T[0] == ridge_fit.PENALTIES[best]
  assert chosen.validation_mse_T[0] == pytest.approx(held[best], rel=1e-6)
  # A target that is noise alone is best predicted by its mean: the
  # largest penalty, and weights near zero.
  layout, stats, x, _, z = _table(signal=0.0, noise=1.0)
  noise = ridge_fit.fit(stats, layout, x, z, fold_N, fits=3)
  assert noise.penalty_T[0] >= 1.0
  assert np.abs(noise.kernel_KxDxT).max() < 0.1


def test_held_out_rows_score_the_fit_and_never_train_it():
  layout, stats, x, y, _ = _table()
  plan = generated_plan(3, 1)
  train, held = np.arange(N) < 450, np.arange(N) >= 450
  splits = splits_lib.Splits(Table(x[train], y[train], plan),
                       Table(x[held], y[held], plan),
                       validation=Table(x[held], y[held], plan))
  fit, fits = ridge_fit.fit_splits(stats, layout, splits)
  assert fits == 1 and fit.rows == N
  z = (y.astype(np.float64) - stats.y_mean_T) / stats.y_std_T
  design = ridge_fit.design(stats, layout, x)
  w, b = _direct(design, z, train, fit.penalty_T[0])
  np.testing.assert_allclose(
      np.concatenate([fit.kernel_KxDxT[0], fit.table_KxVxT[0]]), w,
      atol=1e-7)
  predicted = design[held] @ w + b
  assert fit.validation_mse_T[0] == pytest.approx(
      np.mean((predicted - z[held])**2), rel=1e-6)


def test_members_take_the_fit_of_the_rows_they_train_on():
  layout, stats, x, y, _ = _table()
  plan = generated_plan(3, 1)
  folds = 3
  table = Table(x, y, plan)
  splits = splits_lib.cross_fit(splits_lib.Splits(table, table), folds, seed=0,
                          resident_table_mb=1024)
  raw = default.get_config()
  raw.model.hidden_sizes = (8,)
  raw.model.ensemble_size = 6
  raw.model.ridge_blend = True
  raw.dataset.validation = folds
  config = config_lib.parse(raw)
  setup = make_setup(config, layout, 1)
  state = state_lib.create_train_state(setup.arch, setup.tx, setup.mesh, 0,
                                       stats, optim.Hyperparameters.of(config))
  fitted = ridge_fit.fit_into(state, setup, splits)
  fit, _ = ridge_fit.fit_splits(stats, layout, splits)
  part = jax.device_get(fitted.params[mlp.FITTED])
  for m in range(6):  # member m left out fold m % 3
    k = m % folds
    np.testing.assert_array_equal(part['kernel'][m],
                                  fit.kernel_KxDxT[k].astype(np.float32))
    np.testing.assert_array_equal(part['table'][m, :6],
                                  fit.table_KxVxT[k].astype(np.float32))
  assert not part['table'][:, 6:].any()  # the padding rows
  assert not part['weight'].any()  # weighed at the first evaluation
  # Placed where the state's shardings put them; the network untouched.
  assert (fitted.params[mlp.FITTED]['kernel'].sharding
          == setup.shardings.params[mlp.FITTED]['kernel'])
  for name in ('head', 'hidden'):
    jax.tree.map(np.testing.assert_array_equal,
                 jax.device_get(state.params[name]),
                 jax.device_get(fitted.params[name]))
  weighed = ridge_fit.with_weight(fitted, np.array([0.25]), setup.shardings)
  np.testing.assert_array_equal(
      jax.device_get(weighed.params[mlp.FITTED]['weight']),
      np.full((6, 1), 0.25, np.float32))
  assert inference.ridge_weights(weighed, table.target_names) == {'y': 0.25}


def test_a_table_without_numbers_fits_its_categories():
  rng = np.random.default_rng(3)
  codes = rng.integers(2, 5, size=(N, 2)).astype(np.float32)
  y = (codes[:, :1] == 3) * 2.0 + 0.1 * rng.normal(size=(N, 1))
  layout = InputLayout.of((5, 5), (False, False), 'standardize')
  stats = FeatureStats.fit(layout, codes, y.astype(np.float32))
  z = (y - stats.y_mean_T) / stats.y_std_T
  fit = ridge_fit.fit(stats, layout, codes, z, np.arange(N) % 2, fits=2)
  assert fit.kernel_KxDxT.shape == (2, 0, 1)
  assert fit.table_KxVxT.shape == (2, 10, 1)
  assert fit.validation_mse_T[0] < 0.02


def test_the_optimizer_leaves_the_ridge_part_alone():
  params = {'head': {'kernel': np.ones(3)},
            mlp.FITTED: {'kernel': np.ones(2), 'weight': np.ones(1)}}
  mask = optim.trained(params)
  assert mask == {'head': {'kernel': True},
                  mlp.FITTED: {'kernel': False, 'weight': False}}
  raw = default.get_config()
  raw.optimizer.name = 'adamw'
  raw.optimizer.weight_decay = 0.5
  opt = config_lib.parse(raw).optimizer
  tx = optim.make_optimizer(dataclasses.replace(opt, schedule='constant'),
                            10, fitted=True)
  grads = jax.tree.map(np.zeros_like, params)
  updates, _ = tx.update(grads, tx.init(params), params)
  # Decay shrinks the network's weights, never the fitted ones.
  assert np.all(updates['head']['kernel'] < 0)
  assert not np.any(updates[mlp.FITTED]['kernel'])
  assert not np.any(updates[mlp.FITTED]['weight'])


@pytest.mark.slow
def test_training_moves_the_network_alike_and_the_ridge_part_never(
    small_config, tmp_path):
  from meshfit.report import writers
  from meshfit.train import loop  # noqa: PLC0415
  small_config.dataset.validation = 0.2
  small_config.optimizer.name = 'adamw'
  small_config.optimizer.weight_decay = 0.1
  small_config.plots = False
  runs = {}
  for blend in (False, True):
    small_config.model.ridge_blend = blend
    workdir = str(tmp_path / str(blend))
    final = loop.train_and_evaluate(small_config, workdir)
    records = writers.read_jsonl(f'{workdir}/metrics.jsonl')
    runs[blend] = (workdir, final, records)
  losses = {b: [r['train/loss'] for r in runs[b][2] if 'train/loss' in r]
            for b in runs}
  # The network fits the same targets from the same start: bit for bit.
  assert losses[True] == losses[False] and len(losses[True]) == 6
  workdir, final, records = runs[True]
  assert 0 < final['ridge_weight']['y'] <= 1
  assert [r['val/ridge_weight'] for r in records if 'val/ridge_weight' in r]
  assert 'ridge_weight' not in runs[False][1]
  # The last checkpoint's ridge part is still the closed-form fit.
  parsed = config_lib.parse(small_config)
  splits = splits_lib.load_splits(parsed.dataset, parsed.seed)
  with reading.SavedModel(workdir, 60) as saved:
    _, state = saved.restore(parsed)
  fit, _ = ridge_fit.fit_splits(jax.device_get(state.stats), saved.layout,
                                splits)
  np.testing.assert_array_equal(
      jax.device_get(state.params[mlp.FITTED]['kernel'])[0],
      fit.kernel_KxDxT[0].astype(np.float32))


def _spectra(rows: int, channels: int, seed: int) -> pd.DataFrame:
  """Absorbance spectra: four smooth overlapping bands mixed in random
  amounts, a baseline and noise; y is the first band's amount."""
  rng = np.random.default_rng(seed)
  grid = np.linspace(0, 1, channels)
  bands = np.exp(-0.5 * ((grid[None] - rng.uniform(0.2, 0.8, (4, 1)))
                         / rng.uniform(0.1, 0.25, (4, 1)))**2)
  amounts = rng.uniform(size=(rows, 4))
  x = (amounts @ bands + rng.normal(0, 0.2, (rows, 1))
       + rng.normal(0, 0.002, (rows, channels)))
  frame = pd.DataFrame(x, columns=[f'x{c}' for c in range(channels)])
  frame['y'] = amounts[:, 0] + rng.normal(0, 0.02, rows)
  return frame


@pytest.mark.slow
def test_the_default_run_matches_ridge_on_collinear_spectra(tmp_path):
  # A few hundred rows of collinear channels and a linear target: the
  # networks alone reach several times RidgeCV's error; the members' ridge
  # parts must carry configs/csv.py's run to within 5% of it.
  from sklearn.linear_model import RidgeCV  # noqa: PLC0415
  from sklearn.pipeline import make_pipeline  # noqa: PLC0415
  from sklearn.preprocessing import StandardScaler  # noqa: PLC0415

  from meshfit.configs import csv as csv_config  # noqa: PLC0415
  from meshfit.train import loop  # noqa: PLC0415
  frame = _spectra(200, 60, seed=0)
  train, test = frame[:160], frame[160:]
  train.to_csv(tmp_path / 'train.csv', index=False)
  test.to_csv(tmp_path / 'test.csv', index=False)
  config = csv_config.get_config()
  config.dataset.train_path = str(tmp_path / 'train.csv')
  config.dataset.eval_path = str(tmp_path / 'test.csv')
  config.dataset.target_columns = ('y',)
  config.dataset.data_dir = str(tmp_path / 'tfds')
  config.plots = False
  # The ridge parts are fitted before the first step; the networks' best
  # step here comes within a few epochs (kept short for the test's time).
  config.train_epochs = 20.0
  final = loop.train_and_evaluate(config, str(tmp_path / 'run'))
  ridge = make_pipeline(StandardScaler(), RidgeCV(
      alphas=np.logspace(-3, 3, 13))).fit(train.drop(columns='y'), train.y)
  ridge_rmse = np.sqrt(np.mean((ridge.predict(test.drop(columns='y'))
                                - test.y)**2))
  assert final['ridge_weight']['y'] > 0.5
  assert final['rmse'] <= 1.05 * ridge_rmse, (final['rmse'], ridge_rmse)
