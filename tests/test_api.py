"""The library (meshfit.fit, load, Model) against the command line: the same
numbers, the same workdirs, the same messages, and no second compilation.

One run of penguins_train.csv is shared by the module (a DataFrame, an eval
file); a second, from the same frame written to Parquet, must predict the
same bits and compile nothing; a train.py run of the same file and settings
must predict them too.
"""

import json
import os
import threading

import numpy as np
import pandas as pd
import pytest
from jax import monitoring

import meshfit
from cli_helpers import ROOT, run_train

pytestmark = pytest.mark.slow

TRAIN = os.path.join(ROOT, 'tests', 'data', 'penguins_train.csv')
TEST = os.path.join(ROOT, 'tests', 'data', 'penguins_test.csv')
TARGET = 'body_mass_g'
# Short, but the defaults' path: five cross-fitted members, sized batches.
SETTINGS = {'num_train_steps': 12, 'model.hidden_sizes': (16,)}

# Tracing and backend-compilation events, counted while `_counting` is set.
_COMPILE_EVENTS = ('/jax/core/compile/jaxpr_trace_duration',
                   '/jax/core/compile/backend_compile_duration')
_counting = threading.Event()
_compiles: list[str] = []


def _on_event(event: str, duration: float, **kwargs) -> None:  # noqa: ARG001
  if _counting.is_set() and event in _COMPILE_EVENTS:
    _compiles.append(event)


monitoring.register_event_duration_secs_listener(_on_event)


def _settings(data_dir: str) -> dict:
  return {**SETTINGS, 'dataset.data_dir': data_dir}


def _cli_flags(data_dir: str, train_path: str) -> list[str]:
  """train.py's flags for what `fit(train_path, TARGET, eval_data=TEST,
  config=_settings(data_dir))` trains."""
  return ['--config=configs/csv.py', '--config.num_train_steps=12',
          '--config.model.hidden_sizes=(16,)',
          f'--config.dataset.data_dir={data_dir}',
          f'--config.dataset.train_path={train_path}',
          f'--config.dataset.eval_path={TEST}',
          f'--config.dataset.target_columns=("{TARGET}",)']


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory) -> str:
  return str(tmp_path_factory.mktemp('tfds'))


@pytest.fixture(scope='module')
def frame() -> pd.DataFrame:
  return pd.read_csv(TRAIN)


@pytest.fixture(scope='module')
def api_run(tmp_path_factory, data_dir, frame) -> meshfit.Model:
  """A DataFrame fitted into a named workdir."""
  workdir = str(tmp_path_factory.mktemp('api') / 'run')
  return meshfit.fit(frame, TARGET, eval_data=TEST, workdir=workdir,
                     config=_settings(data_dir), verbose=0)


@pytest.fixture(scope='module')
def parquet_run(tmp_path_factory, data_dir, frame, api_run):
  """The same frame as a Parquet file, fitted without a workdir after
  `api_run`: (model, the compilations its fit made)."""
  del api_run  # fitted first: this is the second fit of the same shapes
  path = str(tmp_path_factory.mktemp('parquet') / 'train.parquet')
  frame.to_parquet(path, index=False)
  _compiles.clear()
  _counting.set()
  try:
    model = meshfit.fit(path, TARGET, eval_data=TEST,
                        config=_settings(data_dir), verbose=0)
  finally:
    _counting.clear()
  return model, list(_compiles)


def _values(predictions: pd.DataFrame) -> np.ndarray:
  return predictions.to_numpy(np.float32)


def test_a_dataframe_fits_as_the_same_frame_written_to_parquet(
    api_run, parquet_run):
  model, _ = parquet_run
  a, b = api_run.predict(TEST), model.predict(TEST)
  assert list(a.columns) == [f'{TARGET}_pred']
  assert len(a) == len(pd.read_csv(TEST))
  np.testing.assert_array_equal(_values(a), _values(b))


def test_a_second_fit_of_the_same_shapes_compiles_nothing(parquet_run):
  model, compiles = parquet_run
  assert model.step > 0
  assert compiles == [], (
      f'the second fit traced or compiled {len(compiles)} times: some '
      'program is jitted per run (parallel/programs.py memoizes them)')


def test_a_cli_run_predicts_as_the_api_run_and_loads_into_it(
    tmp_path, data_dir, api_run):
  # The very file the API wrote the frame to: the same bytes, the same key.
  train_path = api_run.config.dataset.train_path
  workdir = str(tmp_path / 'cli')
  run_train(*_cli_flags(data_dir, train_path), f'--workdir={workdir}',
            check=0)
  out = str(tmp_path / 'cli_pred.csv')
  run_train('--mode=predict', f'--workdir={workdir}', f'--input={TEST}',
            f'--output={out}', check=0)
  cli = pd.read_csv(out)
  expected = api_run.predict(TEST)
  assert list(cli.columns) == list(expected.columns)
  np.testing.assert_array_equal(_values(cli), _values(expected))
  loaded = meshfit.load(workdir)
  assert loaded.step == api_run.step
  np.testing.assert_array_equal(_values(loaded.predict(TEST)),
                                _values(expected))


def _steps(workdir: str) -> list[str]:
  return sorted(name for name in os.listdir(os.path.join(workdir,
                                                         'checkpoints'))
                if name.isdigit())


def test_a_temporary_run_holds_its_checkpoints_until_it_is_read(
    api_run, parquet_run):
  model, _ = parquet_run
  assert not os.path.exists(os.path.join(model.workdir, 'checkpoints'))
  # mode=eval reads the workdir: the run writes the checkpoints it would
  # have kept in a workdir of its own, then scores as that run does.
  assert model.evaluate() == api_run.evaluate()
  assert _steps(model.workdir) and (_steps(model.workdir)
                                    == _steps(api_run.workdir))


def test_the_cli_uses_a_saved_api_run(tmp_path, api_run, parquet_run):
  model, _ = parquet_run
  temporary = model.workdir
  kept = str(tmp_path / 'kept')
  assert model.save(kept) is model
  assert model.workdir == kept and not os.path.exists(temporary)
  assert _steps(kept) == _steps(api_run.workdir)
  out = str(tmp_path / 'pred.parquet')
  run_train('--mode=predict', f'--workdir={kept}', f'--input={TEST}',
            f'--output={out}', '--keep_columns=species', check=0)
  cli = pd.read_parquet(out)
  assert list(cli['species']) == list(pd.read_csv(TEST)['species'])
  np.testing.assert_array_equal(cli[[f'{TARGET}_pred']].to_numpy(),
                                _values(model.predict(TEST)))
  with pytest.raises(meshfit.UsageError, match='not a new or empty'):
    model.save(kept)


def test_evaluate_returns_and_keeps_what_mode_eval_does(api_run):
  result = api_run.evaluate()
  assert result['step'] == api_run.step
  assert result['num_examples'] == int(
      pd.read_csv(TEST)[TARGET].notna().sum())
  assert 0 < result['r2'] < 1 and result['rmse'] > 0
  saved = os.path.join(api_run.workdir, 'eval', f'step_{api_run.step}.json')
  with open(saved, encoding='utf-8') as f:
    assert json.load(f) == json.loads(json.dumps(result))
  # A frame of the same rows scores the same.
  other = api_run.evaluate(pd.read_csv(TEST))
  assert other['rmse'] == result['rmse'] and other['r2'] == result['r2']


def test_history_columns_and_summary_describe_the_run(api_run, frame):
  history = api_run.history
  assert history.index.name == 'step'
  assert history.index.max() == 12
  assert history['train/loss'].notna().sum() >= 2
  assert history.loc[12, 'eval/rmse'] > 0
  columns = api_run.columns
  assert columns.loc['species', 'kind'] == 'category'
  assert set(columns.loc['species', 'levels']) == set(
      frame['species'].dropna())
  trained = frame[frame[TARGET].notna()]
  assert columns.loc['bill_length_mm', 'kind'] == 'number'
  assert columns.loc['bill_length_mm', 'fill'] == pytest.approx(
      float(np.nanmedian(trained['bill_length_mm'])), rel=1e-6)
  assert TARGET not in columns.index
  assert f'step={api_run.step}' in repr(api_run)
  assert '<table>' in api_run._repr_html_()


def test_plot_draws_the_losses_and_predicted_against_actual(api_run):
  fig = api_run.plot()
  losses, scatter = fig.axes
  assert {line.get_label() for line in losses.get_lines()} >= {
      'train/loss', 'val/loss'}
  points = scatter.collections[0].get_offsets()
  assert len(points) == int(pd.read_csv(TEST)[TARGET].notna().sum())


def test_bad_input_raises_the_cli_message_and_the_process_lives_on(
    tmp_path, data_dir, api_run, frame):
  train_path = api_run.config.dataset.train_path
  with pytest.raises(meshfit.DataError) as raised:
    meshfit.fit(train_path, 'no_such_column', config=_settings(data_dir),
                verbose=0)
  flags = _cli_flags(data_dir, train_path)[:-1] + [
      '--config.dataset.target_columns=("no_such_column",)']
  cli = run_train(*flags, f'--workdir={tmp_path / "cli"}', check=2)
  assert cli.stderr.strip().splitlines()[-1] == f'error: {raised.value}'
  with pytest.raises(meshfit.UsageError, match="did you mean 'model.hidden"):
    meshfit.fit(frame, TARGET, config={'model.hiden_sizes': (8,)})
  with pytest.raises(meshfit.DataError, match='bill_depth_mm'):
    api_run.predict(frame.drop(columns=['bill_depth_mm']))
  with pytest.raises(meshfit.UsageError, match='likelihood'):
    api_run.predict(TEST, interval=0.9)
  with pytest.raises(meshfit.UsageError, match='holds no run'):
    meshfit.load(str(tmp_path / 'nothing'))
  # Still working after all that.
  assert len(api_run.predict(frame)) == len(frame)


def test_export_writes_the_serving_artifacts(tmp_path, api_run):
  result = api_run.export(str(tmp_path / 'export'))
  assert result['step'] == api_run.step
  assert 'model.json' in result['files']
  assert max(result['check'].values()) < 1e-4
