"""meshfit from Python against CatBoost, in one warm process.

    XLA_FLAGS=--xla_force_host_platform_device_count=1 \
        python benchmarks/api_vs_catboost.py [--tables=penguins,babies] \
        [--cv_table=babies] [--no_cli] [--data_dir=../shared/datasets/tables]

Prints two tables:

1. `cross_val_score(meshfit.Regressor(), X, y, cv=5)` on a table of about
   1,000 rows (babies) against the same call with `CatBoostRegressor()` at
   its defaults and with the jax.jit floor (below) of as many steps: the
   first call of the process (meshfit compiles there), a second one (the
   same shapes: nothing to compile), and one after `jax.clear_caches()`, as
   in a restarted notebook (traced and lowered again, the compiled programs
   read from the persistent compilation cache the first call filled). The
   calls are `cross_validate`, what `cross_val_score` runs, keeping the
   estimators to read their steps.
2. Per shared table (split 0): `meshfit.fit(train) + predict(test)` at
   configs/csv.py's defaults, the table's first fit in the process and a
   refit, against CatBoost's fit + predict of the same files (text columns
   of up to max(50, 20% of rows) levels as categories, as the tables'
   README fits it), and the command line's cold train + predict (fresh
   processes, an empty compilation cache) beside them. The "jax.jit floor"
   is what a first fit costs any JAX trainer: a minimal hand-written
   jitted fit + predict of a network of the same shape (members, layers,
   batch size, steps as meshfit's run), compiled anew (`jit_floor`).

The process's imports are paid before anything is timed (a small fit of
another table); every meshfit run gets a fresh compilation cache and
prepared-data folder, so that nothing from an earlier process helps it.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin

from bench_common import markdown_table

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLES = os.path.join(REPO, '..', 'shared', 'datasets', 'tables')


def read_table(data_dir: str, name: str) -> tuple[str, pd.DataFrame,
                                                 pd.DataFrame, str, str]:
  """(target, train, test, train path, test path) of split 0, rows without
  a target left out (as the tables' README scores them)."""
  with open(os.path.join(data_dir, 'refs.json'), encoding='utf-8') as f:
    target = json.load(f)[name]['target']
  paths = [os.path.join(data_dir, name, '0', f'{s}.csv')
           for s in ('train', 'test')]
  train, test = (pd.read_csv(p) for p in paths)
  return (target, train[train[target].notna()].reset_index(drop=True),
          test[test[target].notna()].reset_index(drop=True), *paths)


def catboost_inputs(x: pd.DataFrame, *others: pd.DataFrame
                    ) -> tuple[list[str], list[pd.DataFrame]]:
  """CatBoost's categorical columns and the frames as it takes them: text
  columns of up to max(50, 20% of rows) levels as strings (a missing one
  its own level), other text columns left out."""
  texts = [c for c in x.columns if not pd.api.types.is_numeric_dtype(x[c])]
  max_levels = max(50, 0.2 * len(x))
  kept = [c for c in texts if x[c].nunique() <= max_levels]
  dropped = [c for c in texts if c not in kept]

  def prepared(frame):
    frame = frame.drop(columns=dropped)
    return frame.assign(**{c: frame[c].astype(object).where(
        frame[c].notna(), '<missing>').astype(str) for c in kept})
  return kept, [prepared(f) for f in (x, *others)]


def catboost(cat_features: list[str]):
  import catboost as cb  # noqa: PLC0415  (a benchmark-only dependency)
  # No catboost_info/ folder of training logs in the working directory.
  return cb.CatBoostRegressor(random_seed=0, verbose=False,
                              allow_writing_files=False,
                              cat_features=cat_features or None)


def timed(function) -> tuple[float, object]:
  start = time.perf_counter()
  result = function()
  return time.perf_counter() - start, result


def cross_validation(data_dir: str, name: str, scratch: str) -> str:
  """Table 1: cross_val_score's time, meshfit's against CatBoost's and the
  jax.jit floor's (as many steps as meshfit's longest fold took)."""
  import jax  # noqa: PLC0415
  import meshfit  # noqa: PLC0415
  from sklearn.model_selection import cross_validate  # noqa: PLC0415
  target, train, _, _, _ = read_table(data_dir, name)
  x, y = train.drop(columns=target), train[target]
  cat_features, (x_cb,) = catboost_inputs(x)
  settings = {'compilation_cache_dir': os.path.join(scratch, 'cv_cache'),
              'dataset.data_dir': os.path.join(scratch, 'cv_tables')}
  rows, floor_programs = [], {}
  for call in ('first call', 'second call', 'restarted'):
    if call == 'restarted':
      # As a restarted notebook: every program traced and lowered again, and
      # read from the persistent compilation cache the first call filled.
      jax.clear_caches()
    mine, mine_cv = timed(lambda: cross_validate(
        meshfit.Regressor(config=settings), x, y, cv=5,
        return_estimator=True))
    theirs, theirs_cv = timed(lambda: cross_validate(
        catboost(cat_features), x_cb, y, cv=5))
    fitted = mine_cv['estimator'][0].model_.config
    steps = max(int(e.model_.history.index.max())
                for e in mine_cv['estimator'])
    floor, floor_cv = timed(lambda: cross_validate(FloorRegressor(
        steps, fitted.batch_size, fitted.model.ensemble_size,
        tuple(fitted.model.hidden_sizes), floor_programs), x, y, cv=5))
    rows.append([f'{name} ({len(x)} rows), {call}', f'{mine:.1f}',
                 f'{theirs:.2f}', f'{floor:.1f}', f'{mine / theirs:.1f}',
                 f'{floor / theirs:.1f}',
                 *(f'{np.mean(r["test_score"]):.3f}'
                   for r in (mine_cv, theirs_cv, floor_cv))])
    print(rows[-1], flush=True)
  return markdown_table(
      ['cross_val_score(cv=5)', 'meshfit.Regressor(), s',
       'CatBoostRegressor(), s', 'jax.jit floor, s', 'meshfit/CatBoost',
       'floor/CatBoost', 'meshfit mean R²', 'CatBoost mean R²',
       'floor mean R²'], rows)


def _floor_programs(steps: int, batch_size: int, members: int,
                    hidden: tuple[int, ...]):
  """(fit, predict) of the jax.jit floor, newly jitted: a minimal
  hand-written JAX trainer of a network of meshfit's default shape.
  `fit(x_NxF, y_Nx1, rows)` trains `members` MLPs stacked and vmapped, Adam,
  `steps` steps in one jitted call drawing its batches on the device from
  the first `rows` rows (the table may be padded past them); `predict`
  averages them."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  import optax  # noqa: PLC0415

  def forward(params, x):
    for w, b in params[:-1]:
      x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b

  tx = optax.adam(1e-3)

  @jax.jit
  def fit(x, y, rows):
    sizes = (x.shape[1], *hidden, 1)

    def init(key):
      keys = jax.random.split(key, len(sizes) - 1)
      return [(jax.random.normal(k, (a, b)) * np.sqrt(2 / a), jnp.zeros(b))
              for k, a, b in zip(keys, sizes[:-1], sizes[1:])]
    params = jax.vmap(init)(jax.random.split(jax.random.key(0), members))
    opt_state = jax.vmap(tx.init)(params)

    def member_step(params, opt_state, idx):
      loss, grads = jax.value_and_grad(
          lambda p: jnp.mean((forward(p, x[idx]) - y[idx])**2))(params)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss

    def body(i, carry):
      params, opt_state = carry
      idx = jax.random.randint(jax.random.fold_in(jax.random.key(1), i),
                               (members, batch_size), 0, rows)
      params, opt_state, _ = jax.vmap(member_step)(params, opt_state, idx)
      return params, opt_state
    return jax.lax.fori_loop(0, steps, body, (params, opt_state))[0]

  @jax.jit
  def predict(params, x):
    return jnp.mean(jax.vmap(forward, in_axes=(0, None))(params, x), axis=0)
  return fit, predict


class FloorRegressor(RegressorMixin, BaseEstimator):
  """The jax.jit floor as a scikit-learn estimator, for cross_val_score:
  numbers standardised (text as category codes, missing as the mean), the
  target standardised, rows padded to a multiple of 64 so that the folds
  share one compiled program, as meshfit's do. Clones share their compiled
  programs (`programs`, a dict keyed by the network's steps and shape), as
  meshfit.Regressor's clones share theirs within a process."""

  def __init__(self, steps: int, batch_size: int, members: int,
               hidden: tuple[int, ...], programs: dict):
    self.steps, self.batch_size, self.members = steps, batch_size, members
    self.hidden, self.programs = hidden, programs

  def __sklearn_clone__(self) -> 'FloorRegressor':
    # scikit-learn's clone deep-copies parameters: the dict would be lost.
    return FloorRegressor(**self.get_params())

  def _programs(self) -> tuple:
    """(fit, predict) of this network, made at its first fit."""
    key = (self.steps, self.batch_size, self.members, tuple(self.hidden))
    if key not in self.programs:
      self.programs[key] = _floor_programs(*key)
    return self.programs[key]

  def _standardised(self, numbers: np.ndarray) -> np.ndarray:
    return np.nan_to_num((numbers - self.mean_) / self.std_)

  def fit(self, x: pd.DataFrame, y: pd.Series) -> 'FloorRegressor':
    numbers = _numbers(x)
    self.mean_ = np.nanmean(numbers, 0)
    self.std_ = np.nanstd(numbers, 0) + 1e-6
    y = np.asarray(y, np.float32)[:, None]
    self.y_mean_, self.y_std_ = y.mean(), y.std() + 1e-6
    fit, _ = self._programs()
    self.params_ = fit(_padded(self._standardised(numbers)),
                       _padded((y - self.y_mean_) / self.y_std_),
                       np.int32(len(y)))
    return self

  def predict(self, x: pd.DataFrame) -> np.ndarray:
    _, predict = self._programs()
    z = np.asarray(predict(self.params_,
                           _padded(self._standardised(_numbers(x)))))
    return z[:len(x), 0] * self.y_std_ + self.y_mean_


def _numbers(x: pd.DataFrame) -> np.ndarray:
  """`x` as float32, text columns as their category codes (a floor's
  shortcut: a frame's codes follow its own levels)."""
  codes = {c: x[c].astype('category').cat.codes.astype(float)
           for c in x.columns if not pd.api.types.is_numeric_dtype(x[c])}
  return x.assign(**codes).to_numpy(np.float32)


def _padded(a: np.ndarray, multiple: int = 64) -> np.ndarray:
  """`a` with zero rows up to a multiple of `multiple` rows."""
  return np.pad(a, ((0, -len(a) % multiple), (0, 0)))


def jit_floor(train: pd.DataFrame, test: pd.DataFrame, target: str,
              steps: int, batch_size: int, members: int,
              hidden: tuple[int, ...]) -> float:
  """Seconds of the jax.jit floor's fit + predict (`FloorRegressor`) on the
  same rows, its programs new: a first call compiles, as any JAX trainer's
  first fit of a new table does."""
  start = time.perf_counter()
  pred = FloorRegressor(steps, batch_size, members, hidden, {}).fit(
      train.drop(columns=target), train[target]).predict(
          test.drop(columns=target))
  assert np.isfinite(pred).all()
  return time.perf_counter() - start


def cli_train_predict(train_path: str, test_path: str, target: str,
                      scratch: str) -> float:
  """Seconds of `train.py` then `--mode=predict`, fresh processes, an empty
  compilation cache and prepared-data folder."""
  workdir = os.path.join(scratch, 'workdir')
  env = dict(os.environ, NO_GCE_CHECK='true', TF_CPP_MIN_LOG_LEVEL='2')
  start = time.perf_counter()
  for command in (
      ['--config=configs/csv.py', f'--workdir={workdir}',
       f'--config.dataset.train_path={train_path}',
       f'--config.dataset.target_columns=({json.dumps(target)},)',
       f'--config.dataset.data_dir={os.path.join(scratch, "tfds")}',
       f'--config.compilation_cache_dir={os.path.join(scratch, "cache")}'],
      ['--mode=predict', f'--workdir={workdir}', f'--input={test_path}',
       f'--output={os.path.join(scratch, "pred.csv")}']):
    subprocess.run([sys.executable, 'train.py', *command], cwd=REPO, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
  return time.perf_counter() - start


def fit_predict(data_dir: str, names: list[str], scratch: str,
                cli: bool) -> str:
  """Table 2: fit + predict per table, meshfit's API against CatBoost."""
  import meshfit  # noqa: PLC0415
  rows, ratios = [], {'first': [], 'refit': [], 'floor': []}
  for name in names:
    target, train, test, train_path, test_path = read_table(data_dir, name)
    settings = {'compilation_cache_dir': os.path.join(scratch, name, 'cache'),
                'dataset.data_dir': os.path.join(scratch, name, 'tables')}
    y_test = test[target].to_numpy(float)
    seconds, rmse = {}, {}
    def fit_and_predict():
      model = meshfit.fit(train, target, config=settings, verbose=0)
      return model, model.predict(test)
    for run in ('first', 'refit'):
      seconds[run], (model, pred) = timed(fit_and_predict)
      rmse[run] = float(np.sqrt(np.mean(
          (pred[f'{target}_pred'].to_numpy() - y_test)**2)))
    config = model.config
    seconds['floor'] = jit_floor(
        train, test, target, int(model.history.index.max()),
        config.batch_size, config.model.ensemble_size,
        tuple(config.model.hidden_sizes))
    x = train.drop(columns=target)
    cat_features, (x_cb, x_test_cb) = catboost_inputs(
        x, test.drop(columns=target))
    theirs, pred = timed(lambda: catboost(cat_features).fit(
        x_cb, train[target]).predict(x_test_cb))
    rmse_cb = float(np.sqrt(np.mean((pred - y_test)**2)))
    cold = (cli_train_predict(train_path, test_path, target,
                              os.path.join(scratch, name, 'cli'))
            if cli else None)
    for run in ratios:
      ratios[run].append(seconds[run] / theirs)
    rows.append([name, len(train), f'{seconds["first"]:.1f}',
                 f'{seconds["refit"]:.1f}', f'{seconds["floor"]:.1f}',
                 f'{theirs:.2f}',
                 f'{seconds["first"] / theirs:.1f}',
                 f'{seconds["refit"] / theirs:.1f}',
                 f'{seconds["floor"] / theirs:.1f}',
                 f'{cold:.1f}' if cold else '–',
                 f'{cold / theirs:.1f}' if cold else '–',
                 f'{rmse["first"]:.4g}', f'{rmse_cb:.4g}'])
    print(rows[-1], flush=True)
  rows.append([f'median ({len(names)} tables)', '', '', '', '', '',
               f'{np.median(ratios["first"]):.1f}',
               f'{np.median(ratios["refit"]):.1f}',
               f'{np.median(ratios["floor"]):.1f}', '',
               (f'{np.median([float(r[10]) for r in rows]):.1f}'
                if cli else '–'), '', ''])
  return markdown_table(
      ['table', 'rows', 'meshfit fit + predict, s', 'refit, s',
       'jax.jit floor, s', 'CatBoost, s', 'meshfit/CatBoost',
       'refit/CatBoost', 'floor/CatBoost', 'CLI cold, s', 'CLI/CatBoost',
       'meshfit RMSE', 'CatBoost RMSE'], rows)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--data_dir', default=TABLES)
  parser.add_argument('--tables', default='',
                      help='comma-separated names (default: all)')
  parser.add_argument('--cv_table', default='babies')
  parser.add_argument('--no_cli', action='store_true',
                      help='leave out the command line\'s cold runs')
  args = parser.parse_args()
  with open(os.path.join(args.data_dir, 'refs.json'), encoding='utf-8') as f:
    names = args.tables.split(',') if args.tables else list(json.load(f))
  with tempfile.TemporaryDirectory(prefix='api-vs-catboost-') as scratch:
    import meshfit  # noqa: PLC0415
    # The imports and the process's set-up, paid before anything is timed.
    target, train, _, _, _ = read_table(args.data_dir, 'penguins')
    meshfit.fit(train, target, verbose=0, config={
        'num_train_steps': 5,
        'compilation_cache_dir': os.path.join(scratch, 'warm-up'),
        'dataset.data_dir': os.path.join(scratch, 'warm-up')})
    catboost([]).fit(np.random.default_rng(0).normal(size=(20, 2)),
                     np.arange(20.0))
    cv = cross_validation(args.data_dir, args.cv_table, scratch)
    tables = fit_predict(args.data_dir, names, scratch, not args.no_cli)
  print(cv, tables, sep='\n\n')


if __name__ == '__main__':
  main()
