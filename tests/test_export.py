"""--mode=export as a client uses it: the artifacts served without meshfit.

Two runs (Friedman #1 on a 4 x 2 mesh, and a CSV table with two targets and
awkward column names on a 2 x 2 mesh) are exported by the CLI. Their
SavedModels are then called from a process that imports TensorFlow and no
meshfit (nor flax), and their jax.export artifacts from one that imports JAX
and no meshfit (nor TensorFlow, nor flax); both must reproduce
--mode=predict's file.
"""

import concurrent.futures
import importlib.metadata
import json
import keyword
import os
import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pandas as pd
import pytest

from cli_helpers import regression_frame, run_train
from model_helpers import shrunk_config
from test_column_plan import AWKWARD_DATES
from meshfit.configs import csv as csv_config
from meshfit.input_pipeline import column_plan
from meshfit.input_pipeline.column_plan import ColumnPlan
from meshfit import config as config_lib
from meshfit.checkpoints import reading
from meshfit.data import splits as splits_lib
from meshfit.serve import evaluate, export, export_tf
from meshfit.train import loop

# Every test here trains (or runs train.py): left out of `make test-fast`.
pytestmark = pytest.mark.slow

# Feature names TensorFlow would reject or silently rename in a signature.
AWKWARD = {'a': 'size (m²)', 'b': 'in', 'c': '1st'}
RTOL = 1e-5


def _json(proc):
  return json.loads(proc.stdout[proc.stdout.index('{'):])


def _tree(workdir) -> dict[str, tuple[int, int]]:
  """Every file under `workdir`: (size, mtime in ns), to see it unchanged."""
  out = {}
  for root, _, files in os.walk(workdir):
    for f in files:
      path = os.path.join(root, f)
      out[os.path.relpath(path, workdir)] = (os.path.getsize(path),
                                             os.stat(path).st_mtime_ns)
  return out


def _train_csv(tmp) -> str:
  """Two targets, awkward feature names, trained by the CLI on a 2 x 2 mesh;
  checkpoints 100 and 200, no eval file."""
  regression_frame(300, 0).rename(columns=AWKWARD).to_csv(tmp / 'train.csv',
                                                          index=False)
  # 77 rows: not a multiple of any batch size, nor of the export's probe.
  regression_frame(77, 1).rename(columns=AWKWARD).to_csv(tmp / 'eval.csv',
                                                         index=False)
  workdir = str(tmp / 'csv_run')
  run_train('--config=configs/csv.py', f'--workdir={workdir}',
            f'--config.dataset.data_dir={tmp}/tfds',
            f'--config.dataset.train_path={tmp}/train.csv',
            f'--config.dataset.eval_path={tmp}/eval.csv',
            "--config.dataset.target_columns=('y', 'z')",
            '--config.num_train_steps=200', '--config.plots=False',
            '--config.checkpoint_every_steps=100',
            '--config.eval_every_steps=200', '--config.log_every_steps=100',
            '--config.eval_batch_size=32', '--config.mesh.model=2',
            devices=4, check=0)
  return workdir


def _train_synthetic(tmp, data_dir: str) -> str:
  """Friedman #1 trained in this process on a 4 x 2 mesh, then evaluated
  (eval/step_60.json)."""
  config = shrunk_config(data_dir, {'eval_every_steps': 60,
                                    'checkpoint_every_steps': 0,
                                    'mesh.model': 2, 'plots': False})
  workdir = str(tmp / 'synthetic_run')
  loop.train_and_evaluate(config, workdir)
  evaluate.evaluate(config, workdir)
  test = splits_lib.load_eval_split(config_lib.parse(config).dataset)
  frame = pd.DataFrame(test.x_NxF, columns=test.feature_names)
  frame['y'] = test.y_NxT[:, 0]
  frame.to_csv(tmp / 'synthetic_eval.csv', index=False)
  return workdir


def _train_mixed(tmp) -> str:
  """A table as they come: a number with missing cells, a category (one
  value in two rows), a boolean and a date; its eval file adds a category
  never seen."""
  rng = np.random.default_rng(3)
  n = 160
  frame = pd.DataFrame({
      'area': rng.normal(50, 10, n),
      'city': rng.choice(['paris', 'rome', 'oslo'], n),
      'new': rng.choice(['true', 'false'], n),
      'sold': (pd.Timestamp('2020-01-01') + pd.to_timedelta(
          rng.integers(0, 700, n), 'D')).strftime('%Y-%m-%d')})
  frame['price'] = (frame['area'] * 3 + 40 * (frame['city'] == 'rome')
                    + rng.normal(0, 5, n))
  frame.loc[[3, 30], 'area'] = np.nan
  frame.loc[7, 'city'] = None
  # Two rows: a value some members read as unknown (their vocabularies go
  # into the artifacts too).
  frame.loc[[10, 11], 'city'] = 'bergen'
  evaluation = frame.iloc[120:].copy()
  evaluation.loc[125, 'city'] = 'lima'
  evaluation.loc[128, 'city'] = 'bergen'
  evaluation.loc[126, 'area'] = np.nan
  evaluation.loc[127, 'sold'] = None
  frame.iloc[:120].to_csv(tmp / 'mixed_train.csv', index=False)
  evaluation.to_csv(tmp / 'mixed_eval.csv', index=False)
  config = csv_config.get_config()
  config.dataset.data_dir = str(tmp / 'mixed_data')
  config.dataset.train_path = str(tmp / 'mixed_train.csv')
  config.dataset.eval_path = str(tmp / 'mixed_eval.csv')
  config.dataset.target_columns = ('price',)
  config.num_train_steps = 150
  # Its members' ridge parts go into the artifacts too.
  config.model.ridge_blend = True
  config.plots = False
  workdir = str(tmp / 'mixed_run')
  loop.train_and_evaluate(config, workdir)
  return workdir


@pytest.fixture(scope='module')
def runs(tmp_path_factory, data_dir):
  """{name: (workdir, eval csv, export dir, predictions csv, summary)}.

  Each run is exported and predicted by the CLI, the two runs side by side
  (each CLI start spends seconds importing, mostly waiting on one core).
  """
  tmp = tmp_path_factory.mktemp('export')
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    csv_workdir = pool.submit(_train_csv, tmp)
    synthetic_workdir = _train_synthetic(tmp, data_dir)
    mixed_workdir = _train_mixed(tmp)
    workdirs = {'csv': csv_workdir.result(),
                'synthetic': synthetic_workdir, 'mixed': mixed_workdir}
    evals = {'csv': tmp / 'eval.csv', 'synthetic': tmp / 'synthetic_eval.csv',
             'mixed': tmp / 'mixed_eval.csv'}

    def export_and_predict(name):
      workdir, out = workdirs[name], tmp / f'{name}_export' / 'model'
      before = _tree(workdir)
      summary = _json(run_train('--mode=export', f'--workdir={workdir}',
                                f'--output={out}', check=0))
      run_train('--mode=predict', f'--workdir={workdir}',
                f'--input={evals[name]}', f'--output={tmp}/{name}_pred.csv',
                devices=1, check=0)
      assert _tree(workdir) == before  # export only reads the workdir
      return (workdir, evals[name], out, tmp / f'{name}_pred.csv', summary)
    done = {name: pool.submit(export_and_predict, name)
            for name in workdirs}
    return {name: future.result() for name, future in done.items()}


def _bare_python(code: str, *args: str) -> list:
  """Runs `code` in a fresh interpreter, away from the repository; returns
  the JSON its last line prints."""
  proc = subprocess.run(
      [sys.executable, '-c', textwrap.dedent(code), *args],
      cwd='/', capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS='cpu', TF_CPP_MIN_LOG_LEVEL='2'))
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _predicted(pred_csv, card) -> np.ndarray:
  """predict's output file as pred_NxT, targets in model.json's order."""
  frame = pd.read_csv(pred_csv)
  return frame[[t['signature_output'] for t in card['targets']]].to_numpy(
      np.float32)


def _card(out) -> dict:
  with open(os.path.join(out, 'model.json'), encoding='utf-8') as f:
    return json.load(f)


def test_the_saved_model_serves_predicts_numbers_without_meshfit(runs):
  # One process for every run: TensorFlow takes seconds to import.
  jobs = [(str(out), str(eval_csv), str(out) + '_tf.npy')
          for _, eval_csv, out, _, _ in runs.values()]
  modules = _bare_python('''
      import json, sys
      import numpy as np, pandas as pd, tensorflow as tf
      for out, eval_csv, result in json.loads(sys.argv[1]):
        card = json.load(open(out + '/model.json'))
        serve = tf.saved_model.load(out + '/saved_model').signatures[
            card['saved_model']['signature']]
        frame = pd.read_csv(eval_csv)
        def column(f):  # as a client holds them: text, and floats with NaN
          values = frame[f['name']]
          if f['dtype'] == 'string':
            return tf.constant(values.fillna('').astype(str).to_numpy())
          if f['kind'] == 'boolean':
            values = values.map({True: 1.0, False: 0.0, 'true': 1.0,
                                 'false': 0.0})
          return tf.constant(values.to_numpy(np.float32))
        columns = serve(**{f['signature_input']: column(f)
                           for f in card['features']})
        np.save(result, np.stack([columns[t['signature_output']].numpy()
                                  for t in card['targets']], axis=1))
      # (TensorFlow imports jax itself when it is installed, for TF Lite.)
      print(json.dumps([m for m in ('meshfit', 'flax') if m in sys.modules]))
      ''', json.dumps(jobs))
  assert modules == []
  for (_, _, out, pred_csv, _), (_, _, result) in zip(runs.values(), jobs):
    card = _card(out)
    want = _predicted(pred_csv, card)
    got = np.load(result)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-5)


def test_the_jax_export_artifact_runs_in_bare_jax_at_any_batch_size(runs):
  jobs = []
  numeric = {k: v for k, v in runs.items() if k != 'mixed'}
  for _, eval_csv, out, _, _ in numeric.values():
    # One array per column, by name: the bare process orders them itself.
    frame = pd.read_csv(eval_csv)
    np.savez(str(out) + '_columns.npz',
             **{c: frame[c].to_numpy(np.float32) for c in frame.columns
                if c != 'id'})
    jobs.append((str(out), str(out) + '_columns.npz', str(out) + '_jax.npy'))
  result = _bare_python('''
      import json, sys
      import jax, numpy as np
      shapes = []
      for out, columns, result in json.loads(sys.argv[1]):
        card = json.load(open(out + '/model.json'))
        with open(out + '/' + card['jax_export']['file'], 'rb') as f:
          exported = jax.export.deserialize(bytearray(f.read()))
        npz = np.load(columns)
        x_NxF = np.stack([npz[f['name']] for f in card['features']], axis=1)
        # Two calls of other batch sizes than the export ever used.
        head = exported.call(x_NxF[:5])
        pred_NxT = np.concatenate([head, exported.call(x_NxF[5:])])
        np.save(result, pred_NxT)
        shapes.append([str(exported.in_avals[0].shape), exported.nr_devices])
      print(json.dumps([shapes, [m for m in ('meshfit', 'tensorflow', 'flax')
                                 if m in sys.modules]]))
      ''', json.dumps(jobs))
  shapes, modules = result
  assert modules == []
  for (_, _, out, pred_csv, _), (_, _, path), (shape, devices) in zip(
      numeric.values(), jobs, shapes):
    card = _card(out)
    assert devices == 1  # trained on 4 and 8 devices, exported for one
    assert shape == f"(b, {len(card['features'])})"
    want = _predicted(pred_csv, card)
    got = np.load(path)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-5)


def test_the_jax_export_artifact_takes_the_column_plans_inputs(runs):
  workdir, eval_csv, out, pred_csv, _ = runs['mixed']
  card = _card(out)
  plan, _ = reading.read_model(_meta(workdir), 0, workdir)
  x_NxI, _ = plan.encode(pd.read_csv(eval_csv), str(eval_csv))
  assert card['jax_export']['inputs'] == list(plan.input_names)
  with open(os.path.join(out, card['jax_export']['file']), 'rb') as f:
    exported = jax.export.deserialize(bytearray(f.read()))
  np.testing.assert_allclose(np.asarray(exported.call(x_NxI)),
                             _predicted(pred_csv, card), rtol=RTOL,
                             atol=1e-5)
  kinds = {f['name']: (f['kind'], f['dtype']) for f in card['features']}
  assert kinds == {'area': ('number', 'float32'),
                   'city': ('category', 'string'),
                   'new': ('boolean', 'float32'),
                   'sold': ('datetime', 'string')}
  city = next(f for f in card['features'] if f['name'] == 'city')
  assert sorted(city['vocabulary']) == ['bergen', 'oslo', 'paris', 'rome']


def _meta(workdir) -> dict:
  step = max(int(s) for s in os.listdir(os.path.join(workdir, 'checkpoints')))
  with open(os.path.join(workdir, 'checkpoints', str(step), 'meta',
                         'metadata'), encoding='utf-8') as f:
    return json.load(f)


def test_the_model_card_says_what_goes_in_and_comes_out(runs):
  workdir, eval_csv, out, _, summary = runs['csv']
  card = _card(out)
  header = pd.read_csv(eval_csv, nrows=0).columns
  assert [f['name'] for f in card['features']] == [
      c for c in header if c not in ('id', 'y', 'z')]
  assert {f['name']: f['signature_input'] for f in card['features']} == {
      'size (m²)': 'size_m', 'in': 'in_', '1st': 'f_1st'}
  assert [(t['name'], t['signature_output']) for t in card['targets']] == [
      ('y', 'y_pred'), ('z', 'z_pred')]
  for column in card['features'] + card['targets']:
    assert column['kind'] == 'number' and column['dtype'] == 'float32'
    assert column['units'] == 'original units of the training file'
  assert card['step'] == summary['step'] == 200
  assert card['workdir'] == os.path.abspath(workdir)
  assert card['dataset'] == 'csv_regression'
  # A client sends these as missing, as predict and the SavedModel read them.
  assert {'NA', 'null', '?'} <= set(card['saved_model']['missing_tokens'])
  try:
    meshfit_version = importlib.metadata.version('meshfit')
  except importlib.metadata.PackageNotFoundError:
    meshfit_version = 'unknown'
  assert card['versions']['meshfit'] == meshfit_version
  assert card['versions']['jax'] == jax.__version__
  assert card['versions']['jaxlib'] == importlib.metadata.version('jaxlib')
  assert re.fullmatch(r'2\.\d+\.\d+', card['versions']['tensorflow'])
  assert sorted(summary['files']) == sorted(
      os.path.relpath(os.path.join(root, f), out)
      for root, _, files in os.walk(out) for f in files)
  assert {'model.json', 'model.jax_export',
          'saved_model/saved_model.pb'} <= set(summary['files'])
  assert max(summary['check'].values()) < 1e-4


def test_without_an_eval_file_the_card_has_the_checkpoints_eval(runs):
  workdir, _, out, _, _ = runs['csv']
  card = _card(out)
  assert not os.path.exists(os.path.join(workdir, 'eval'))
  # Computed at export as --mode=eval would: the training's final eval.
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    final = [r for r in map(json.loads, f) if 'eval/rmse' in r][-1]
  assert final['step'] == card['step'] == card['eval']['step'] == 200
  assert card['eval']['num_examples'] == 77
  assert card['eval']['split'] == 'test'
  for k in ('mse', 'rmse', 'mae', 'r2'):
    assert card['eval'][k] == pytest.approx(final[f'eval/{k}'], rel=1e-5)


def test_with_an_eval_file_the_card_has_it_as_written(runs):
  workdir, _, out, _, _ = runs['synthetic']
  card = _card(out)
  assert [f['name'] for f in card['features']] == [f'x{i}' for i in range(10)]
  assert [f['signature_input'] for f in card['features']] == [
      f'x{i}' for i in range(10)]
  assert card['dataset'] == 'synthetic_regression/friedman1'
  with open(os.path.join(workdir, 'eval', 'step_60.json')) as f:
    assert card['eval'] == {'source': 'eval/step_60.json', **json.load(f)}


def _assert_usage_error(proc, message):
  assert proc.returncode == 2, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and message in last, last
  assert 'Traceback' not in proc.stderr
  assert proc.stderr.count('error: ') == 1


@pytest.mark.parametrize('case, message', [
    ('no_output', '--mode=export needs --output=DIR'),
    ('input_given', '--input: only for --mode=predict, not --mode=export'),
    ('output_in_eval', '--output: only for --mode=predict and --mode=export'),
    ('non_empty_output', 'is a directory that is not empty'),
    ('output_is_a_file', 'is a file; export writes a directory'),
    ('missing_step', 'no checkpoint of step 7'),
    ('damaged_step', 'the checkpoint of step 100 in'),
])
def test_bad_export_requests_exit_2_and_change_nothing(runs, tmp_path, case,
                                                       message):
  workdir = runs['csv'][0]
  out = tmp_path / 'out'
  args = {'no_output': ['--mode=export'],
          'input_given': ['--mode=export', f'--output={out}',
                          '--input=x.csv'],
          'output_in_eval': ['--mode=eval', f'--output={out}'],
          'missing_step': ['--mode=export', f'--output={out}', '--step=7'],
          'damaged_step': ['--mode=export', f'--output={out}', '--step=100'],
          }.get(case, ['--mode=export', f'--output={out}'])
  if case == 'non_empty_output':
    out.mkdir()
    (out / 'notes.txt').write_text('mine')
  elif case == 'output_is_a_file':
    out.write_text('mine')
  elif case == 'damaged_step':
    # A copy: the other tests share the run.
    workdir = str(tmp_path / 'damaged_run')
    subprocess.run(['cp', '-r', runs['csv'][0], workdir], check=True)
    state = os.path.join(workdir, 'checkpoints', '100', 'state')
    for root, _, files in os.walk(state):
      for f in files:
        if not f.startswith('_'):  # array data, not Orbax's metadata
          with open(os.path.join(root, f), 'r+b') as handle:
            handle.truncate(0)
  before = _tree(workdir)
  leftovers = sorted(os.listdir(tmp_path))
  _assert_usage_error(run_train(f'--workdir={workdir}', *args, devices=1),
                      message)
  assert _tree(workdir) == before
  assert sorted(os.listdir(tmp_path)) == leftovers  # no temporary directory
  if case == 'non_empty_output':
    assert os.listdir(out) == ['notes.txt']
    assert (out / 'notes.txt').read_text() == 'mine'
  elif case == 'output_is_a_file':
    assert out.read_text() == 'mine'


def test_signature_names_are_identifiers_tensorflow_keeps():
  names = ['a', 'price ($)', '1st', '温度', 'in', '_a', 'a_', 'x/y', 'x.y',
           'x_y', '', 'self']
  got = export_tf.signature_names(names)
  # A name TensorFlow keeps ('a_', 'x_y') is never renamed for another.
  assert got == ('a', 'price', 'f_1st', 'column_3', 'in_', 'a_5', 'a_',
                 'x_y_7', 'x_y_8', 'x_y', 'column_10', 'self_')
  assert len(set(got)) == len(got)
  for name in got:
    assert re.fullmatch(r'[A-Za-z][A-Za-z0-9_]*', name)
    assert not keyword.iskeyword(name) and name != 'self'


def test_tensorflow_keeps_every_signature_name_as_given(tmp_path):
  names = ('a', 'price ($)', '1st', '温度', 'in', '_a', 'a_', 'x/y', 'self')
  input_names = export_tf.signature_names(names)
  weights_F = np.arange(1, len(names) + 1, dtype=np.float32)

  def forward(x_BxF):  # every column weighted apart: a swap would show
    return x_BxF @ weights_F[:, None]
  plan = ColumnPlan.numeric(names, ('total (€)',))
  probe = pd.DataFrame(
      np.random.default_rng(0).normal(size=(3, len(names))), columns=names)
  # Raises if a name came back changed or a column went elsewhere.
  _, check = export.write_artifacts(str(tmp_path), forward, plan, probe,
                                    input_names, ('total (€)_pred',))
  assert max(check.values()) < 1e-6


def test_the_saved_model_reads_awkward_dates_as_predict_does(tmp_path):
  """Each of a date's numbers, from every form, invalid dates, blanks and
  garbage: the SavedModel's encoding must equal the plan's (predict's)."""
  plan = ColumnPlan((column_plan.Column(
      'when', 'datetime', parts=column_plan.DATETIME_PARTS + ('hour',)),),
                    ('y',))
  width = len(plan.input_names)
  outputs = tuple(f'p{i}' for i in range(width))
  cells = [c for c, _ in AWKWARD_DATES] + ['2020-07-24T00:00:00-00:30',
                                           '1969-12-31T23:59:59', '0001-1-1']
  probe = pd.DataFrame({'when': cells})
  export_tf.write_saved_model(lambda x_BxI: x_BxI, str(tmp_path / 'sm'),
                              plan, ('when',), outputs, ('cpu',))
  served = export_tf.serve_saved_model(
      str(tmp_path / 'sm'), {'when': np.array(cells, object)}, outputs)
  want, _ = plan.encode(probe, 'new.csv', '--input')
  np.testing.assert_array_equal(served, want)
  assert np.isnan(want).all(axis=1).sum() == 6  # the missing of the list


def test_the_saved_model_reads_tokens_and_unicode_spaces_as_predict_does(
    tmp_path):
  """Category cells that mean missing, and values padded with Unicode
  whitespace (a no-break, an em and an ideographic space): the SavedModel's
  codes must equal the plan's (predict's)."""
  plan = ColumnPlan((column_plan.Column(
      'city', 'category', has_missing=True, vocabulary=('red', 'NAM')),
      column_plan.Column('when', 'datetime', parts=('days',))), ('y',))
  cells = ['red', 'red\u00a0', '\u2003red', 'red\u3000', 'NA', ' null ',
           'None', 'n/a', '?', '', 'NAM', 'blue', '\u00a0']
  probe = pd.DataFrame({'city': cells, 'when': ['2020-01-02\u3000'] * len(
      cells)})
  export_tf.write_saved_model(lambda x_BxI: x_BxI, str(tmp_path / 'sm'),
                              plan, ('city', 'when'), ('c', 'd'), ('cpu',))
  served = export_tf.serve_saved_model(
      str(tmp_path / 'sm'), {c: probe[c].to_numpy(object) for c in probe},
      ('c', 'd'))
  want, _ = plan.encode(probe, 'new.parquet', '--input')
  np.testing.assert_array_equal(served, want)
  assert want[:, 0].tolist() == [2, 2, 2, 2] + [1] * 6 + [3, 0, 1]
  assert (want[:, 1] == 18263).all()  # the date, its space stripped


def test_predict_and_the_saved_model_agree_on_awkward_dates(runs, tmp_path):
  """The trained mixed run: rows whose date is in every accepted form, with
  offsets, invalid, blank or garbage, through --mode=predict and through
  the SavedModel: the same predictions."""
  workdir, eval_csv, out, _, _ = runs['mixed']
  rows = pd.read_csv(eval_csv).iloc[:1]
  awkward = rows.loc[rows.index.repeat(len(AWKWARD_DATES))].reset_index(
      drop=True)
  awkward['sold'] = [c for c, _ in AWKWARD_DATES]
  awkward.to_csv(tmp_path / 'awkward.csv', index=False)
  proc = run_train('--mode=predict', f'--workdir={workdir}',
                   f'--input={tmp_path}/awkward.csv',
                   f'--output={tmp_path}/pred.csv', devices=1, check=0)
  # Served, not refused: one warning counts the cells that are no date.
  assert "5 cells are not dates (first: data row 10, '2021-13-45')" in (
      proc.stderr)
  card = _card(out)
  frame = pd.read_csv(tmp_path / 'awkward.csv', dtype={'sold': str},
                      keep_default_na=False)
  columns = {
      'area': frame['area'].astype(np.float32).to_numpy(),
      'city': frame['city'].astype(str).to_numpy(object),
      'new': frame['new'].map({'true': 1.0, 'false': 0.0, True: 1.0,
                               False: 0.0}).to_numpy(np.float32),
      'sold': frame['sold'].to_numpy(object)}
  served = export_tf.serve_saved_model(
      str(out / 'saved_model'), columns,
      [t['signature_output'] for t in card['targets']])
  predicted = _predicted(tmp_path / 'pred.csv', card)
  np.testing.assert_allclose(served, predicted, rtol=RTOL, atol=1e-5)
  # The offset moves the date: 2020-07-24T00:00+12:00 is the 23rd in UTC.
  assert predicted[1, 0] != predicted[0, 0]
  assert 'UTC offset' in card['dates']['text']
