"""A user's table as it comes: kinds, missing values, validation, the best
step, a changed file, per-target metrics, predictions for every row.

tests/data/penguins_*.csv is palmerpenguins' table (CC0) split 80/20 as it
ships: text categories, missing numbers, a missing target.
"""

import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest
from cli_helpers import ROOT, override, run_train

from meshfit.configs import csv as csv_config
from meshfit.input_pipeline.errors import DataError
from meshfit.errors import UsageError
from meshfit.report import writers
from meshfit.serve import evaluate, predict
from meshfit.train import loop

# Every test here trains (or runs train.py): left out of `make test-fast`.
pytestmark = pytest.mark.slow

PENGUINS = os.path.join(ROOT, 'tests', 'data')


def _config(tmp_path, train: str, test: str, targets=('body_mass_g',),
            **changes):
  config = csv_config.get_config()
  config.dataset.data_dir = str(tmp_path / 'data')
  config.dataset.train_path = train
  config.dataset.eval_path = test
  config.dataset.target_columns = targets
  config.num_train_steps = 300
  config.eval_every_steps = 50
  config.log_every_steps = 50
  config.plots = False
  override(config, changes)
  return config


def _penguins(tmp_path, **changes):
  return _config(tmp_path, os.path.join(PENGUINS, 'penguins_train.csv'),
                 os.path.join(PENGUINS, 'penguins_test.csv'), **changes)


@pytest.fixture(scope='module')
def penguins_run(tmp_path_factory):
  """The real table, trained as it comes (configs/csv.py cross-fits five
  members over five folds of it)."""
  tmp = tmp_path_factory.mktemp('penguins')
  config = _penguins(tmp, **{'max_checkpoints_to_keep': 1})
  workdir = str(tmp / 'run')
  final = loop.train_and_evaluate(config, workdir)
  return config, workdir, final


def test_a_real_table_trains_as_it_comes(penguins_run):
  _, workdir, final = penguins_run
  test = pd.read_csv(os.path.join(PENGUINS, 'penguins_test.csv'))
  # One test row has no body mass: left out of the evaluation.
  assert final['num_examples'] == test['body_mass_g'].notna().sum() == 68
  # Predicting the mean scores the target's spread (~800 g): far above.
  assert final['rmse'] < 0.6 * test['body_mass_g'].std()


def test_the_best_step_is_kept_beside_the_newest_and_used(penguins_run):
  config, workdir, final = penguins_run
  records = writers.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  val = {r['step']: r['val/loss'] for r in records if 'val/loss' in r}
  best = min(val, key=val.get)
  assert final['step'] == best and final['val_loss'] == val[best]
  steps = sorted(int(s) for s in os.listdir(os.path.join(workdir,
                                                         'checkpoints')))
  # max_checkpoints_to_keep=1: the newest, and the best beside it.
  assert steps == sorted({best, 300})
  result = evaluate.evaluate(config, workdir)
  assert result['step'] == best
  assert result['rmse'] == pytest.approx(final['rmse'], rel=1e-6)


def test_a_ridge_blend_is_weighed_and_carried_by_the_best_checkpoint(
    tmp_path):
  # Networks that learn slowly, so that the ridge parts beat their
  # average at every evaluation and take a share.
  config = _penguins(tmp_path, **{'model.ridge_blend': True,
                                  'optimizer.learning_rate': 1e-5,
                                  'num_train_steps': 100,
                                  'eval_every_steps': 10})
  workdir = str(tmp_path / 'run')
  final = loop.train_and_evaluate(config, workdir)
  records = writers.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  chosen = {r['step']: r['val/ridge_weight'] for r in records
            if 'val/ridge_weight' in r}
  assert len(set(chosen.values())) > 1  # weighed anew at every evaluation
  # The weight the best step chose, which its checkpoint carries to eval
  # and predict (their RMSE agrees with the run's).
  weight = final['ridge_weight']['body_mass_g']
  assert 0 < weight <= 1 and weight == pytest.approx(chosen[final['step']],
                                                     rel=1e-6)
  result = evaluate.evaluate(config, workdir)
  assert result['ridge_weight'] == final['ridge_weight']
  assert result['rmse'] == pytest.approx(final['rmse'], rel=1e-6)
  test = os.path.join(PENGUINS, 'penguins_test.csv')
  predict.predict(config, workdir, test, str(tmp_path / 'out.csv'))
  rows = pd.read_csv(test)
  scored = rows['body_mass_g'].notna()
  predicted = pd.read_csv(tmp_path / 'out.csv')['body_mass_g_pred']
  assert np.sqrt(np.mean((predicted[scored] - rows['body_mass_g'][scored])
                         **2)) == pytest.approx(final['rmse'], rel=1e-5)


def test_every_input_row_is_predicted(penguins_run, tmp_path):
  config, workdir, _ = penguins_run
  rows = pd.read_csv(os.path.join(PENGUINS, 'penguins_test.csv')).head(6)
  rows.loc[1, 'bill_length_mm'] = np.nan  # a missing number
  rows.loc[2, 'island'] = 'Atlantis'  # a category never seen
  rows.loc[3, 'sex'] = None  # a missing category
  rows.to_csv(tmp_path / 'in.csv', index=False)
  summary = predict.predict(config, workdir, str(tmp_path / 'in.csv'),
                            str(tmp_path / 'out.csv'), keep_columns=('year',))
  out = pd.read_csv(tmp_path / 'out.csv')
  assert summary['num_examples'] == len(out) == 6
  assert out['body_mass_g_pred'].notna().all()
  # The first row has no number at all (as it ships): still answered.
  assert rows.iloc[0][['bill_length_mm', 'flipper_length_mm']].isna().all()


def test_a_changed_training_file_is_named_and_nothing_is_set_aside(
    tmp_path):
  train = str(tmp_path / 'train.csv')
  shutil.copy(os.path.join(PENGUINS, 'penguins_train.csv'), train)
  config = _penguins(tmp_path, **{'dataset.train_path': train,
                                  'num_train_steps': 100})
  workdir = str(tmp_path / 'run')
  loop.train_and_evaluate(config, workdir)
  # The same path, other content (here: fewer rows, the same columns).
  pd.read_csv(train).iloc[:200].to_csv(train, index=False)
  config.num_train_steps = 200
  before = sorted(os.listdir(os.path.join(workdir, 'checkpoints')))
  with pytest.raises(UsageError, match=r"training data '.*train\.csv' is "
                     r'not what the checkpoint of step 100 .* was trained on'):
    loop.train_and_evaluate(config, workdir)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == before
  assert not os.path.exists(os.path.join(workdir, 'damaged_checkpoints'))


def test_moved_training_data_resumes(penguins_run, tmp_path):
  config, workdir, _ = penguins_run
  copy = str(tmp_path / 'run')
  shutil.copytree(workdir, copy)
  moved = str(tmp_path / 'moved.csv')
  shutil.copy(config.dataset.train_path, moved)
  config = config.copy_and_resolve_references()
  config.dataset.train_path = moved
  config.num_train_steps = 350
  loop.train_and_evaluate(config, copy)  # the same content: resumes
  records = writers.read_jsonl(os.path.join(copy, 'metrics.jsonl'))
  assert max(r['step'] for r in records) == 350


def _edit_checkpoints(workdir: str, edit) -> list[str]:
  """Applies `edit` to the JSON meta of every checkpoint in `workdir` (as an
  older meshfit would have written it); returns their steps, sorted."""
  steps = sorted(os.listdir(os.path.join(workdir, 'checkpoints')))
  assert steps
  for step in steps:
    path = os.path.join(workdir, 'checkpoints', step, 'meta', 'metadata')
    with open(path) as f:
      meta = json.load(f)
    edit(meta)
    with open(path, 'w') as f:
      json.dump(meta, f)
  return steps


def _without_fold_rows(meta):
  assert meta.pop('fold_rows') == 1


def test_a_small_run_cross_fitted_by_an_older_meshfit_resumes(
    penguins_run, tmp_path):
  # An older meshfit dealt the order's blocks into folds and recorded no
  # 'fold_rows'; a table under 2,048 rows has blocks of one row: the same
  # folds, so its run goes on.
  config, workdir, _ = penguins_run
  copy = str(tmp_path / 'run')
  shutil.copytree(workdir, copy)
  _edit_checkpoints(copy, _without_fold_rows)
  config = config.copy_and_resolve_references()
  config.num_train_steps = 350
  loop.train_and_evaluate(config, copy)
  records = writers.read_jsonl(os.path.join(copy, 'metrics.jsonl'))
  assert max(r['step'] for r in records) == 350


def test_a_run_whose_columns_this_meshfit_reads_otherwise_does_not_resume(
    penguins_run, tmp_path):
  # An older meshfit left out a column this one reads as numbers (money
  # with a currency sign): resumed here, its state would not restore, and
  # its checkpoints must not be taken for damaged and set aside.
  config, workdir, _ = penguins_run
  copy = str(tmp_path / 'run')
  shutil.copytree(workdir, copy)
  names = []

  def left_out_by_an_older_meshfit(meta):
    column = next(c for c in meta['column_plan']['features']
                  if c['kind'] == 'number')
    column.update(kind='left_out', has_missing=False,
                  reason='nearly one value per row: an id or free text')
    names.append(column['name'])
  before = _edit_checkpoints(copy, left_out_by_an_older_meshfit)
  config = config.copy_and_resolve_references()
  config.num_train_steps = 350
  with pytest.raises(UsageError, match=(
      r"reads the training table's columns differently from this meshfit "
      rf"\('{names[0]}': left_out in the checkpoint, number now\); finish "
      r'that run with the meshfit that started it')):
    loop.train_and_evaluate(config, copy)
  assert sorted(os.listdir(os.path.join(copy, 'checkpoints'))) == before
  assert not os.path.exists(os.path.join(copy, 'damaged_checkpoints'))


def test_a_run_cross_fitted_on_blocks_of_rows_does_not_resume(tmp_path):
  # 4,096 rows: an older meshfit dealt blocks of 4 consecutive rows into
  # folds. Resumed here, its members would train on rows of their own new
  # validation folds.
  rng = np.random.default_rng(0)
  x = rng.normal(size=(4096, 3))
  pd.DataFrame({'a': x[:, 0], 'b': x[:, 1], 'c': x[:, 2],
                'y': x @ [1.0, -2.0, 0.5]}).to_csv(tmp_path / 'train.csv',
                                                   index=False)
  config = _config(tmp_path, str(tmp_path / 'train.csv'),
                   str(tmp_path / 'train.csv'), targets=('y',),
                   num_train_steps=20, eval_every_steps=10,
                   log_every_steps=10)
  workdir = str(tmp_path / 'run')
  loop.train_and_evaluate(config, workdir)
  before = _edit_checkpoints(workdir, _without_fold_rows)
  config.num_train_steps = 30
  with pytest.raises(UsageError, match=r'cross-fitted on folds of '
                     r'consecutive rows .*Finish that run with the meshfit '
                     r'that started it, or train into a new --workdir'):
    loop.train_and_evaluate(config, workdir)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == before
  assert not os.path.exists(os.path.join(workdir, 'damaged_checkpoints'))
  # Its checkpoints still evaluate.
  assert evaluate.evaluate(config, workdir)['num_examples'] == 4096


def test_a_model_of_a_removed_feature_is_named_not_called_damaged(
    penguins_run, tmp_path):
  # model.linear_head=True gave an older meshfit's members a wide path this
  # meshfit has no parameters for: the state cannot restore, and must not
  # be taken for damaged (set aside, training started again).
  config, workdir, _ = penguins_run
  copy = str(tmp_path / 'run')
  shutil.copytree(workdir, copy)
  before = _edit_checkpoints(
      copy, lambda meta: meta['config']['model'].update(linear_head=True))
  message = (r'trained with model.linear_head=True, which this meshfit does '
             r'not have; use the meshfit that trained it')
  with pytest.raises(UsageError, match=message):
    evaluate.evaluate(config, copy)
  with pytest.raises(UsageError, match=message):
    predict.predict(config, copy, config.dataset.eval_path,
                    str(tmp_path / 'out.csv'))
  config = config.copy_and_resolve_references()
  config.num_train_steps = 350
  with pytest.raises(UsageError, match=message):
    loop.train_and_evaluate(config, copy)
  assert sorted(os.listdir(os.path.join(copy, 'checkpoints'))) == before
  assert not os.path.exists(os.path.join(copy, 'damaged_checkpoints'))
  # At its old default it meant no wide path: the run resumes.
  _edit_checkpoints(
      copy, lambda meta: meta['config']['model'].update(linear_head=False))
  loop.train_and_evaluate(config, copy)


def test_early_stopping_stops_and_a_rerun_trains_no_more(tmp_path):
  # The learning rate is far too high: the validation loss is best early
  # and never again, so two evaluations without improvement stop the run.
  config = _penguins(tmp_path, **{'early_stopping_evals': 2,
                                  'num_train_steps': 2000,
                                  'optimizer.learning_rate': 0.05,
                                  'optimizer.schedule': 'constant'})
  workdir = str(tmp_path / 'run')
  final = loop.train_and_evaluate(config, workdir)
  records = writers.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  val_steps = [r['step'] for r in records if 'val/loss' in r]
  assert val_steps[-1] < 2000  # stopped early
  assert val_steps[-1] - final['step'] == 2 * 50  # two evaluations after
  again = loop.train_and_evaluate(config, workdir)
  assert again['step'] == final['step'] and again['rmse'] == final['rmse']
  later = writers.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  assert max(r['step'] for r in later) == val_steps[-1]  # no more steps


def test_two_targets_get_their_own_metrics(tmp_path):
  rng = np.random.default_rng(0)
  n = 120
  frame = pd.DataFrame({'a': rng.normal(size=n),
                        'kind': rng.choice(['u', 'v'], n)})
  # Each measured with noise of its own scale (a ridge part fits the
  # noiseless line exactly).
  frame['small'] = 0.01 * frame['a'] + 1e-4 * rng.normal(size=n)
  frame['large'] = (1000.0 * frame['a'] + 500.0 * (frame['kind'] == 'u')
                    + 10.0 * rng.normal(size=n))
  frame.iloc[:90].to_csv(tmp_path / 'train.csv', index=False)
  frame.iloc[90:].to_csv(tmp_path / 'test.csv', index=False)
  config = _config(tmp_path, str(tmp_path / 'train.csv'),
                   str(tmp_path / 'test.csv'), targets=('small', 'large'))
  workdir = str(tmp_path / 'run')
  final = loop.train_and_evaluate(config, workdir)
  small, large = final['targets']['small'], final['targets']['large']
  # Each in its own units; the overall value averages them.
  assert small['rmse'] < 0.01 < large['rmse']
  assert final['rmse'] == pytest.approx((small['rmse'] + large['rmse']) / 2)
  # The run's evaluation is the best step's (configs/csv.py validates).
  logged = [r for r in writers.read_jsonl(os.path.join(workdir,
                                                       'metrics.jsonl'))
            if 'eval/rmse' in r and r['step'] == final['step']][-1]
  assert logged['eval/rmse/small'] == small['rmse']
  assert logged['eval/r2/large'] == large['r2']


def test_train_py_on_a_semicolon_file_with_text_and_dates(tmp_path):
  rng = np.random.default_rng(1)
  n = 80
  days = pd.to_datetime('2021-01-01') + pd.to_timedelta(
      rng.integers(0, 365, n), 'D')
  frame = pd.DataFrame({
      'ref': [f'r{i}' for i in range(n)],  # an id: left out, named once
      'when': days.strftime('%Y-%m-%d'),
      'colour': rng.choice(['red', 'blue', 'green'], n),
      'w': rng.normal(size=n)})
  frame['y'] = (frame['w'] + (frame['colour'] == 'red')
                + days.month.to_numpy() / 12)
  frame.to_csv(tmp_path / 'train.csv', sep=';', index=False)
  frame.iloc[:20].to_csv(tmp_path / 'test.csv', sep=';', index=False)
  proc = run_train(
      '--config=configs/csv.py', f'--workdir={tmp_path}/run',
      f'--config.dataset.data_dir={tmp_path}/data',
      f'--config.dataset.train_path={tmp_path}/train.csv',
      f'--config.dataset.eval_path={tmp_path}/test.csv',
      "--config.dataset.target_columns=('y',)",
      # What is read and reported, not how well: a few steps do.
      '--config.num_train_steps=20', '--config.eval_every_steps=10',
      devices=2, check=0)
  assert proc.stderr.count('left out of the features: ref (nearly one '
                           'value per row') == 1
  assert 'Downloading' not in proc.stdout + proc.stderr
  done = [line for line in proc.stderr.splitlines() if 'Done: ' in line]
  assert len(done) == 1 and 'eval rmse=' in done[0]
  assert 'loss_curve.png' in done[0]
  with open(tmp_path / 'run' / 'checkpoints' / '20' / 'meta' / 'metadata',
            encoding='utf-8') as f:
    plan = json.load(f)['column_plan']
  kinds = {c['name']: c['kind'] for c in plan['features']}
  assert kinds == {'ref': 'left_out', 'when': 'datetime',
                   'colour': 'category', 'w': 'number'}


def test_a_target_of_text_is_refused_with_exit_2(tmp_path):
  frame = pd.DataFrame({'a': np.arange(30.0), 'y': ['x'] * 30})
  frame.to_csv(tmp_path / 'train.csv', index=False)
  config = _config(tmp_path, str(tmp_path / 'train.csv'),
                   str(tmp_path / 'train.csv'), targets=('y',))
  with pytest.raises(DataError, match="column 'y' .a target. holds the "
                     "classes 'x': meshfit predicts numbers"):
    loop.train_and_evaluate(config, str(tmp_path / 'run'))


def _train_and_predict(tmp_path, frame: pd.DataFrame, name: str):
  """Trains a short run on `frame` (written as `name`), then predicts the
  same file: (the run's result, the predictions)."""
  path = str(tmp_path / name)
  if name.endswith('.parquet'):
    frame.to_parquet(path, index=False)
  else:
    frame.to_csv(path, index=False)
  config = _config(tmp_path, path, '', targets=('y',),
                   **{'num_train_steps': 40, 'eval_every_steps': 20,
                      'model.ensemble_size': 2,
                      'dataset.validation': 2.0})
  workdir = str(tmp_path / 'run')
  final = loop.train_and_evaluate(config, workdir)
  predict.predict(config, workdir, path, str(tmp_path / 'pred.csv'))
  return final, pd.read_csv(tmp_path / 'pred.csv')


def test_a_table_whose_features_are_all_categories_trains(tmp_path):
  rng = np.random.default_rng(4)
  n = 300
  frame = pd.DataFrame({'c1': rng.choice(list('abcde'), n),
                        'c2': rng.choice(list('xyz'), n)})
  frame['y'] = 2.0 * (frame['c1'] == 'a') + (frame['c2'] == 'x')
  final, pred = _train_and_predict(tmp_path, frame, 'cats.csv')
  assert final['num_examples'] == n and final['r2'] > 0.5
  assert len(pred) == n and pred['y_pred'].notna().all()


def test_a_table_with_parquet_timestamps_trains(tmp_path):
  rng = np.random.default_rng(5)
  n = 300
  frame = pd.DataFrame({
      'when': pd.date_range('2020-01-01', periods=n),
      'at': pd.date_range('2020-01-01 06:00', periods=n, freq='7h',
                          tz='Europe/Paris')})
  frame['y'] = frame['when'].dt.month + rng.normal(0, 0.1, n)
  final, pred = _train_and_predict(tmp_path, frame, 't.parquet')
  assert final['num_examples'] == n and final['r2'] > 0.5
  assert len(pred) == n and pred['y_pred'].notna().all()
  with open(os.path.join(tmp_path, 'run', 'checkpoints', str(final['step']),
                         'meta', 'metadata'), encoding='utf-8') as f:
    plan = json.load(f)['column_plan']
  assert [c['kind'] for c in plan['features']] == ['datetime'] * 2


def _strict_json(text: str):
  """JSON as the standard has it: NaN and Infinity are no JSON."""
  def refuse(constant):
    raise ValueError(f'{constant} is not JSON')
  return json.loads(text, parse_constant=refuse)


def test_a_constant_target_writes_valid_json_and_is_warned_of(
    tmp_path, absl_caplog):
  rng = np.random.default_rng(6)
  frame = pd.DataFrame({'a': rng.normal(size=100), 'y': 5.0})
  frame.to_csv(tmp_path / 't.csv', index=False)
  config = _config(tmp_path, str(tmp_path / 't.csv'), str(tmp_path / 't.csv'),
                   targets=('y',), **{'num_train_steps': 20,
                                      'eval_every_steps': 10,
                                      'model.ensemble_size': 2,
                                      'dataset.validation': 2.0})
  workdir = tmp_path / 'run'
  loop.train_and_evaluate(config, str(workdir))
  assert "target 'y' holds 5 in every training row" in absl_caplog.text
  result = evaluate.evaluate(config, str(workdir))
  written = _strict_json((workdir / 'eval' / f'step_{result["step"]}.json'
                          ).read_text())
  assert written['r2'] is None and written['rmse'] < 1.0
  for line in (workdir / 'metrics.jsonl').read_text().splitlines():
    _strict_json(line)
