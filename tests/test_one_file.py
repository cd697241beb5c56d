"""One file is enough: train.py on a user's one table, without an
eval file, then eval, predict and export on the run; a table too large to
cross-fit held out instead; and no eval file without validation refused."""

import functools
import json

import numpy as np
import pandas as pd
import pytest

from cli_helpers import regression_frame, run_train, saved_config, write_table
from meshfit.errors import UsageError
from meshfit.serve import evaluate, predict

# Every test here runs train.py: left out of `make test-fast`.
pytestmark = pytest.mark.slow

run = functools.partial(run_train, devices=4)
STEPS = 40


def _json(proc) -> dict:
  return json.loads(proc.stdout[proc.stdout.index('{'):])


def _records(workdir) -> list[dict]:
  with open(f'{workdir}/metrics.jsonl', encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def _done(proc) -> str:
  [line] = [l for l in proc.stderr.splitlines() if '] Done: ' in l]
  return line


def _train(tmp, workdir, *args, check=0):
  return run('--config=configs/csv.py', f'--workdir={workdir}',
             f'--config.dataset.data_dir={tmp}/tfds',
             f'--config.dataset.train_path={tmp}/train.csv',
             '--config.dataset.target_columns=y',
             f'--config.num_train_steps={STEPS}',
             '--config.eval_every_steps=10', '--config.log_every_steps=10',
             *args, check=check)


@pytest.fixture(scope='module')
def table(tmp_path_factory):
  """A training table of 300 rows, and 80 other rows to score and predict."""
  tmp = tmp_path_factory.mktemp('one_file')
  write_table(tmp / 'train.csv', regression_frame(300, 0))
  write_table(tmp / 'eval.csv', regression_frame(80, 1))
  return tmp


@pytest.fixture(scope='module')
def cross_fitted(table):
  """configs/csv.py on the training file alone; checkpoints at 15 (not
  validated), 30 and 40."""
  workdir = table / 'run'
  proc = _train(table, workdir, '--config.checkpoint_every_steps=15')
  return workdir, proc


def test_a_one_file_run_says_its_estimate_is_out_of_fold(cross_fitted):
  workdir, proc = cross_fitted
  done = _done(proc)
  assert 'out-of-fold estimate (no eval file) rmse=' in done, done
  assert 'on 300 rows' in done, done
  records = _records(workdir)
  assert any('val/rmse' in r for r in records)
  assert not any(k.startswith('eval/') for r in records for k in r)
  assert (workdir / 'loss_curve.png').stat().st_size > 0
  # A trained model: far below predicting the mean (std(y) ~ 3.6).
  rmse = float(done.split(' rmse=')[1].split()[0])
  assert rmse < 0.5 * regression_frame(300, 0)['y'].std()


def test_a_finished_run_run_again_reports_the_recorded_estimate(
    cross_fitted, table):
  workdir, first = cross_fitted
  again = _train(table, workdir, '--config.checkpoint_every_steps=15')
  assert f'Training steps {STEPS + 1}..{STEPS}' in again.stderr  # none
  # Read back from the best checkpoint's meta, not evaluated anew (which
  # would choose the members again, and say so).
  assert 'evaluations.py' not in again.stderr
  assert _done(again).split('] Done: ')[1] == _done(first).split(
      '] Done: ')[1]


def test_eval_reports_the_best_steps_out_of_fold_metrics(cross_fitted):
  workdir, _ = cross_fitted
  result = _json(run('--mode=eval', f'--workdir={workdir}', check=0))
  records = _records(workdir)
  best = min((r for r in records if 'val/loss' in r),
             key=lambda r: r['val/loss'])
  assert result['step'] == best['step']
  assert result['split'] == 'out_of_fold' and 'out of fold' in result['note']
  assert result['num_examples'] == 300
  for key in ('mse', 'rmse', 'mae', 'r2'):
    assert result[key] == best[f'val/{key}'], key
  assert result['targets']['y']['rmse'] == best['val/rmse/y']
  assert len(result['members']) == 5
  written = json.loads((workdir / 'eval' / f'step_{best["step"]}.json'
                        ).read_text())
  assert written == result


def test_eval_of_a_step_that_was_not_validated_says_what_to_do(
    cross_fitted):
  # In-process: what --mode=eval --step=N runs, without a train.py start
  # each (train.py's error line for a UsageError: test_predict, test_cli).
  workdir, _ = cross_fitted
  config = saved_config(str(workdir))
  with pytest.raises(UsageError, match='step 15 recorded no estimate'):
    evaluate.evaluate(config, str(workdir), 15)
  later = evaluate.evaluate(config, str(workdir), 30)
  assert later['step'] == 30 and later['split'] == 'out_of_fold'
  at_30 = [r for r in _records(workdir) if r['step'] == 30
           and 'val/rmse' in r][0]
  assert later['rmse'] == at_30['val/rmse']


def test_eval_scores_an_eval_file_given_and_predict_works(cross_fitted,
                                                           table):
  workdir, _ = cross_fitted
  scored = _json(run('--mode=eval', f'--workdir={workdir}',
                     f'--config.dataset.eval_path={table}/eval.csv',
                     check=0))
  assert scored['split'] == 'test' and scored['num_examples'] == 80
  assert scored['eval_path'] == f'{table}/eval.csv' and 'note' not in scored
  out = table / 'pred.csv'
  # --mode=predict end to end: test_predict; here what it runs, in-process.
  summary = predict.predict(saved_config(str(workdir)), str(workdir),
                            f'{table}/eval.csv', str(out))
  assert summary['num_examples'] == 80 and summary['step'] == scored['step']
  pred = pd.read_csv(out)['y_pred'].to_numpy(np.float64)
  truth = regression_frame(80, 1)['y'].to_numpy(np.float32)
  # The ridge parts fit this exactly linear target to a few millionths,
  # where the written predictions' float32 rounding is a relative 1e-3.
  assert np.sqrt(np.mean((pred - truth)**2)) == pytest.approx(
      scored['rmse'], rel=1e-5, abs=1e-7)


def test_export_gives_the_estimate_marked_as_such(cross_fitted, table):
  workdir, _ = cross_fitted
  # The estimate --mode=eval reports (the best step's validation metrics,
  # test_eval_reports_the_best_steps_out_of_fold_metrics), read from the
  # run's records; with no eval file written, export finds it itself.
  best = min((r for r in _records(workdir) if 'val/loss' in r),
             key=lambda r: r['val/loss'])
  (workdir / 'eval' / f'step_{best["step"]}.json').unlink(missing_ok=True)
  out = table / 'served'
  run('--mode=export', f'--workdir={workdir}', f'--output={out}', check=0)
  card = json.loads((out / 'model.json').read_text())
  scores = card['eval']
  assert card['step'] == best['step']
  assert scores['split'] == 'out_of_fold' and 'no eval file' in (
      scores['source'])
  assert scores['rmse'] == best['val/rmse'] and 'out of fold' in (
      scores['note'])


def test_a_held_out_fraction_estimates_on_its_held_out_rows(table):
  workdir = table / 'held_out'
  proc = _train(table, workdir, '--config.dataset.validation=0.2')
  done = _done(proc)
  assert 'held-out estimate (no eval file)' in done and 'on 60 rows' in done
  result = evaluate.evaluate(saved_config(str(workdir)), str(workdir))
  assert result['split'] == 'held_out' and result['num_examples'] == 60
  best = min((r for r in _records(workdir) if 'val/loss' in r),
             key=lambda r: r['val/loss'])
  assert (result['step'], result['rmse']) == (best['step'],
                                              best['val/rmse'])


def test_a_table_too_large_to_cross_fit_holds_out_a_fraction(table):
  workdir = table / 'streamed'
  proc = _train(table, workdir, '--config.dataset.resident_table_mb=0')
  lines = [l for l in proc.stderr.splitlines() if 'cross-fits' in l]
  assert len(lines) == 1, lines
  assert 'validating on dataset.validation=0.2' in lines[0]
  assert 'held-out estimate (no eval file)' in _done(proc)
  saved = json.loads((workdir / 'config.json').read_text())['dataset']
  assert saved['validation'] == 0.2
  # Resumed with the same command, it decides the same and goes on.
  again = _train(table, workdir, '--config.dataset.resident_table_mb=0',
                 f'--config.num_train_steps={STEPS + 10}')
  assert f'Resuming from the checkpoint of step {STEPS}' in again.stderr
  assert 'cross-fits' in again.stderr  # the same warning, the same choice
  assert max(r['step'] for r in _records(workdir)) == STEPS + 10
  saved = json.loads((workdir / 'config.json').read_text())['dataset']
  assert saved['validation'] == 0.2


def test_no_eval_file_and_no_validation_is_one_error_line(table):
  workdir = table / 'nothing'
  proc = _train(table, workdir, '--config.dataset.validation=0', check=2)
  assert 'Traceback' not in proc.stderr
  assert proc.stderr.count('error: ') == 1
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('error: dataset.eval_path is empty'), last
  assert 'set dataset.validation to a number of folds (e.g. 5)' in last
  assert not workdir.exists()
