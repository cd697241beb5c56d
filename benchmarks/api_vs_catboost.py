"""meshfit from Python against CatBoost, in one warm process.

    XLA_FLAGS=--xla_force_host_platform_device_count=1 \
        python benchmarks/api_vs_catboost.py [--tables=penguins,babies] \
        [--cv_table=babies] [--no_cli] [--data_dir=../shared/datasets/tables]

Prints two tables:

1. `cross_val_score(meshfit.Regressor(), X, y, cv=5)` on a table of about
   1,000 rows (babies) against the same call with `CatBoostRegressor()` at
   its defaults: the first call of the process (meshfit compiles there), a
   second one (the same shapes: nothing to compile), and one after
   `jax.clear_caches()`, as in a restarted notebook (traced and lowered
   again, the compiled programs read from the persistent compilation cache
   the first call filled).
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
  """Table 1: cross_val_score's time, meshfit's against CatBoost's."""
  import jax  # noqa: PLC0415
  import meshfit  # noqa: PLC0415
  from sklearn.model_selection import cross_val_score  # noqa: PLC0415
  target, train, _, _, _ = read_table(data_dir, name)
  x, y = train.drop(columns=target), train[target]
  cat_features, (x_cb,) = catboost_inputs(x)
  settings = {'compilation_cache_dir': os.path.join(scratch, 'cv_cache'),
              'dataset.data_dir': os.path.join(scratch, 'cv_tables')}
  rows = []
  for call in ('first call', 'second call', 'restarted'):
    if call == 'restarted':
      # As a restarted notebook: every program traced and lowered again, and
      # read from the persistent compilation cache the first call filled.
      jax.clear_caches()
    mine, mine_r2 = timed(lambda: cross_val_score(
        meshfit.Regressor(config=settings), x, y, cv=5))
    theirs, theirs_r2 = timed(lambda: cross_val_score(
        catboost(cat_features), x_cb, y, cv=5))
    rows.append([f'{name} ({len(x)} rows), {call}', f'{mine:.1f}',
                 f'{theirs:.2f}', f'{mine / theirs:.1f}',
                 f'{np.mean(mine_r2):.3f}', f'{np.mean(theirs_r2):.3f}'])
    print(rows[-1], flush=True)
  return markdown_table(
      ['cross_val_score(cv=5)', 'meshfit.Regressor(), s',
       'CatBoostRegressor(), s', 'meshfit/CatBoost', 'meshfit mean R²',
       'CatBoost mean R²'], rows)


def jit_floor(train: pd.DataFrame, test: pd.DataFrame, target: str,
              steps: int, batch_size: int, members: int,
              hidden: tuple[int, ...]) -> float:
  """Seconds of a minimal hand-written JAX fit + predict of a network of
  meshfit's default shape on the same rows: the numbers standardised (text
  as category codes), `members` MLPs stacked and vmapped, Adam, `steps`
  steps in one jitted call drawing its batches on the device, one jitted
  predict. New functions each call: a first call compiles, as any JAX
  trainer's first fit of a new table does."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  import optax  # noqa: PLC0415

  def matrix(frame):
    x = frame.drop(columns=target)
    codes = {c: x[c].astype('category').cat.codes.astype(float)
             for c in x.columns if not pd.api.types.is_numeric_dtype(x[c])}
    return x.assign(**codes).to_numpy(np.float32)

  start = time.perf_counter()
  x, x_test = matrix(train), matrix(test)
  mean, std = np.nanmean(x, axis=0), np.nanstd(x, axis=0) + 1e-6
  x, x_test = (np.nan_to_num((a - mean) / std) for a in (x, x_test))
  y = train[target].to_numpy(np.float32)[:, None]
  y_mean, y_std = y.mean(), y.std() + 1e-6
  y = (y - y_mean) / y_std
  sizes = (x.shape[1], *hidden, 1)

  def init(key):
    keys = jax.random.split(key, len(sizes) - 1)
    return [(jax.random.normal(k, (a, b)) * np.sqrt(2 / a), jnp.zeros(b))
            for k, a, b in zip(keys, sizes[:-1], sizes[1:])]

  def forward(params, x):
    for w, b in params[:-1]:
      x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b

  tx = optax.adam(1e-3)

  @jax.jit
  def fit(x, y):
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
                               (members, batch_size), 0, x.shape[0])
      params, opt_state, _ = jax.vmap(member_step)(params, opt_state, idx)
      return params, opt_state
    return jax.lax.fori_loop(0, steps, body, (params, opt_state))[0]

  @jax.jit
  def predict(params, x):
    return jnp.mean(jax.vmap(forward, in_axes=(0, None))(params, x), axis=0)

  pred = np.asarray(predict(fit(x, y), x_test)) * y_std + y_mean
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
