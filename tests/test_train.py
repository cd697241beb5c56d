"""End-to-end training in-process: learning, resuming, metrics, evaluation."""

import json
import os
import re
import shutil
import socket
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from meshfit import config as config_lib
from meshfit.checkpoints import checkpointer, workdir_lock
from meshfit.config import json_files
from meshfit.errors import UsageError
from meshfit.report import writers
from meshfit.serve import evaluate
from meshfit.train import loop
from meshfit.train.loss_watch import NonFiniteLossError

# Every test here trains (or runs train.py): left out of `make test-fast`.
pytestmark = pytest.mark.slow


def _losses(workdir):
  return {r['step']: r['train/loss']
          for r in writers.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
          if 'train/loss' in r}


@pytest.fixture(scope='module')
def trained(tmp_path_factory, data_dir):
  """A 4 x 2 mesh run of 200 steps, shared by the tests that only read it."""
  from configs import default  # noqa: PLC0415
  config = default.get_config()
  config.dataset.data_dir = data_dir
  config.model.hidden_sizes = (64, 64)
  config.num_train_steps = 200
  config.log_every_steps = 20
  config.eval_every_steps = 100
  config.checkpoint_every_steps = 100
  config.optimizer.warmup_steps = 20
  config.optimizer.learning_rate = 1e-2
  config.mesh.model = 2
  workdir = str(tmp_path_factory.mktemp('run'))
  final = loop.train_and_evaluate(config, workdir)
  return config, workdir, final


def test_loss_falls_on_friedman1(trained):
  _, workdir, final = trained
  losses = _losses(workdir)
  # Standardised units: predicting the mean scores 1.0.
  assert losses[20] > 2 * losses[200]
  assert losses[200] < 0.2
  # Target std is ~4.9 and the noise floor 1.0; a mean predictor scores ~4.9.
  assert final['rmse'] < 2.5 and final['r2'] > 0.75


def test_workdir_layout(trained):
  config, workdir, _ = trained
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == [
      '100', '200']
  saved = json_files.load_json(os.path.join(workdir, 'config.json'))
  assert saved == config


def test_metrics_jsonl_has_every_scalar(trained):
  _, workdir, final = trained
  records = writers.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  train_steps = [r['step'] for r in records if 'train/loss' in r]
  assert train_steps == list(range(20, 201, 20))
  evals = [r for r in records if 'eval/rmse' in r]
  assert [r['step'] for r in evals] == [100, 200]
  assert evals[-1]['eval/rmse'] == final['rmse']  # full precision
  # Overall values, then each target's (one here: 'y').
  assert set(evals[-1]) == {'step', 'eval/mse', 'eval/rmse', 'eval/mae',
                            'eval/r2', 'eval/rmse/y', 'eval/mae/y',
                            'eval/r2/y'}


def test_tensorboard_reader_finds_the_same_values(trained):
  _, workdir, _ = trained
  acc = event_accumulator.EventAccumulator(
      workdir, size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()

  def series(tag):
    return {e.step: float(np.asarray(
        tensor_util.make_ndarray(e.tensor_proto)))
            for e in acc.Tensors(tag)}

  records = writers.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  for tag in ('train/loss', 'eval/rmse'):
    expected = {r['step']: r[tag] for r in records if tag in r}
    got = series(tag)
    assert got.keys() == expected.keys()
    for step, value in expected.items():
      assert got[step] == pytest.approx(value, rel=1e-6)


def test_evaluate_writes_json_and_matches_on_other_meshes(trained):
  config, workdir, final = trained
  result = evaluate.evaluate(config, workdir)
  assert result['step'] == 200 and result['num_examples'] == 10_000
  with open(os.path.join(workdir, 'eval', 'step_200.json')) as f:
    assert json.load(f) == result
  assert result['rmse'] == pytest.approx(final['rmse'], rel=1e-6)
  for data, model in ((2, 4), (8, 1)):
    other = json_files.merge_eval_overrides(
        config, _with_mesh(config, data, model), ['mesh.data', 'mesh.model'])
    assert evaluate.evaluate(other, workdir)['rmse'] == pytest.approx(
        final['rmse'], rel=1e-6)


def _with_mesh(config, data, model):
  other = config.copy_and_resolve_references()
  other.mesh.data, other.mesh.model = data, model
  return other


def test_evaluate_an_older_step_and_a_missing_one(trained):
  config, workdir, _ = trained
  assert evaluate.evaluate(config, workdir, step=100)['step'] == 100
  with pytest.raises(UsageError, match='available steps: 100, 200'):
    evaluate.evaluate(config, workdir, step=150)


def test_stopped_run_resumes_where_it_stopped(small_config, tmp_path):
  # A constant schedule does not depend on num_train_steps, so a shorter
  # first run is the longer run stopped early.
  small_config.optimizer.schedule = 'constant'
  small_config.checkpoint_every_steps = 15
  whole = str(tmp_path / 'whole')
  loop.train_and_evaluate(small_config, whole)

  parts = str(tmp_path / 'parts')
  first = small_config.copy_and_resolve_references()
  first.num_train_steps = 40
  loop.train_and_evaluate(first, parts)
  assert sorted(os.listdir(os.path.join(parts, 'checkpoints'))) == [
      '15', '30', '40']
  # As if killed after step 40 before saving anything after step 15: the
  # resume starts mid logging window and redoes steps 16..40.
  for step in ('30', '40'):
    shutil.rmtree(os.path.join(parts, 'checkpoints', step))
  final = loop.train_and_evaluate(small_config, parts)

  assert _losses(parts) == _losses(whole)  # exactly, every logged step
  assert sorted(_losses(parts)) == list(range(10, 61, 10))
  records = writers.read_jsonl(os.path.join(parts, 'metrics.jsonl'))
  assert [r['step'] for r in records if 'eval/rmse' in r] == [30, 60]
  assert records[-1]['eval/rmse'] == final['rmse']


def test_finished_run_does_no_more_steps(small_config, tmp_path):
  workdir = str(tmp_path)
  loop.train_and_evaluate(small_config, workdir)
  before = _losses(workdir)
  again = loop.train_and_evaluate(small_config, workdir)
  assert _losses(workdir) == before
  assert again['num_examples'] == 10_000


@pytest.mark.parametrize('key, value, message', [
    ('batch_size', 12, "batch_size 12 is not divisible by the 8 devices of "
     "mesh axis 'data'"),
    ('eval_batch_size', 100, 'eval_batch_size 100 is not divisible'),
    ('batch_size', -1, 'batch_size=-1 must be a positive integer, or 0'),
    ('num_train_steps', -5, 'num_train_steps=-5 must be a positive'),
    ('log_every_steps', -1, 'log_every_steps=-1'),
    ('train_epochs', 0.0, 'train_epochs=0.0 must be a positive number'),
    ('dataset.validation', 1, 'dataset.validation=1.0 must be 0'),
    ('dataset.validation', 2.5, 'dataset.validation=2.5 must be 0'),
    ('dataset.validation', 3, 'ensemble_size=1 is not a multiple of the 3 '
     'folds'),
    ('max_checkpoints_to_keep', 0, 'max_checkpoints_to_keep=0'),
    ('model.hidden_sizes', (32, 0), r'model.hidden_sizes=\(32, 0\)'),
    ('model.activation', 'swish7', "model.activation 'swish7' is unknown"),
    ('model.dropout_rate', 1.0, 'model.dropout_rate=1.0'),
    ('optimizer.name', 'lion', "optimizer.name 'lion' is unknown"),
    ('optimizer.learning_rate', -0.1, 'learning_rate=-0.1 must be positive'),
    ('optimizer.learning_rate', 0.0, 'learning_rate=0.0 must be positive'),
    ('optimizer.schedule', 'step', "optimizer.schedule 'step' is unknown"),
    ('optimizer.warmup_steps', -1, 'warmup_steps=-1'),
    ('dataset.name', 'mnist', "dataset.name 'mnist' is unknown"),
    ('mesh.data', 3, 'mesh 3 x 1 does not divide the 8 devices'),
    ('mesh.model', 16, 'does not divide the 8 devices'),
])
def test_each_bad_setting_is_a_usage_error(small_config, key, value, message,
                                           tmp_path):
  *parents, leaf = key.split('.')
  node = small_config
  for p in parents:
    node = node[p]
  node[leaf] = value
  with pytest.raises(UsageError, match=message):
    loop.train_and_evaluate(small_config, str(tmp_path / 'w'))
  assert not os.path.exists(tmp_path / 'w')  # nothing written


def test_hidden_width_must_split_over_model_axis(small_config, tmp_path):
  small_config.mesh.model = 4
  small_config.model.hidden_sizes = (30, 30)
  with pytest.raises(UsageError, match=r"model.hidden_sizes\[0\]=30 is not "
                     "divisible by the 4 devices of mesh axis 'model'"):
    loop.train_and_evaluate(small_config, str(tmp_path))
  # Odd layers are row-split: their own width is never split.
  config_lib.check_devices(config_lib.parse(_hidden(small_config, (32, 30))),
                           8)


def _hidden(config, sizes):
  config.model.hidden_sizes = sizes
  return config


def test_resume_refuses_a_config_that_changes_the_run(small_config, tmp_path):
  workdir = str(tmp_path)
  loop.train_and_evaluate(small_config, workdir)
  before = sorted(os.listdir(workdir)), _losses(workdir)
  for key, value in (('model.hidden_sizes', (16,)),
                     ('optimizer.name', 'sgd'),
                     ('dataset.name', 'synthetic_regression/linear'),
                     ('seed', 7), ('batch_size', 128)):
    changed = small_config.copy_and_resolve_references()
    *parents, leaf = key.split('.')
    node = changed
    for p in parents:
      node = node[p]
    node[leaf] = value
    with pytest.raises(UsageError, match=rf'checkpoint of step 60 was trained '
                       rf'with a different config: {re.escape(key)} '):
      loop.train_and_evaluate(changed, workdir)
    assert (sorted(os.listdir(workdir)), _losses(workdir)) == before


def test_resume_accepts_safe_changes(small_config, tmp_path):
  workdir = str(tmp_path)
  loop.train_and_evaluate(small_config, workdir)
  longer = small_config.copy_and_resolve_references()
  longer.num_train_steps = 80
  longer.mesh.model = 2
  longer.log_every_steps = 20
  longer.eval_batch_size = 512
  loop.train_and_evaluate(longer, workdir)
  assert max(_losses(workdir)) == 80


def test_incomplete_checkpoint_is_skipped(small_config, tmp_path):
  workdir = str(tmp_path)
  loop.train_and_evaluate(small_config, workdir)
  os.remove(os.path.join(workdir, 'checkpoints', '60',
                         checkpointer.COMMIT_MARKER))
  final = loop.train_and_evaluate(small_config, workdir)
  assert os.path.isdir(os.path.join(workdir, 'damaged_checkpoints', '60'))
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == [
      '20', '40', '60']
  assert final['num_examples'] == 10_000


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(
    small_config, tmp_path):
  small_config.optimizer.name = 'sgd'
  small_config.optimizer.schedule = 'constant'
  small_config.optimizer.learning_rate = 1e4
  small_config.checkpoint_every_steps = 1
  small_config.steps_per_call = 1  # every step's state is offered a save
  with pytest.raises(NonFiniteLossError) as info:
    loop.train_and_evaluate(small_config, str(tmp_path))
  error = info.value
  saved = sorted(int(s) for s in os.listdir(tmp_path / 'checkpoints'))
  # The state that produced the bad loss (step - 1) was saved, then set
  # aside; every one before it was written.
  assert os.listdir(tmp_path / 'damaged_checkpoints') == [str(error.step - 1)]
  assert error.last_good == saved[-1] == error.step - 2
  message = error.explain(str(tmp_path))
  assert f'at step {error.step}' in message
  assert f'last good checkpoint is step {saved[-1]}' in message
  # The last good checkpoint holds a usable (finite) model.
  result = evaluate.evaluate(small_config, str(tmp_path))
  assert result['step'] == saved[-1] and np.isfinite(result['rmse'])


def test_a_stale_lock_is_taken_over_and_a_live_one_refused(small_config,
                                                           tmp_path):
  lock = tmp_path / 'lock'
  lock.write_text(json.dumps({'host': socket.gethostname(), 'pid': 999999999,
                              'start_time': '1'}))
  loop.train_and_evaluate(small_config, str(tmp_path))
  assert not lock.exists()  # released at the end
  lock.write_text(json.dumps({
      'host': socket.gethostname(), 'pid': os.getpid(),
      'start_time': workdir_lock._start_time(os.getpid())}))
  with pytest.raises(UsageError, match=f'pid {os.getpid()}'):
    loop.train_and_evaluate(small_config, str(tmp_path))
  assert lock.exists()  # not ours to remove


def test_profile_window_writes_a_trace(small_config, tmp_path):
  small_config.num_train_steps = 30
  small_config.profile_start_step = 12
  small_config.profile_num_steps = 4
  loop.train_and_evaluate(small_config, str(tmp_path))
  traces = [os.path.join(d, f) for d, _, files in
            os.walk(tmp_path / 'profile') for f in files
            if f.endswith('.xplane.pb')]
  assert len(traces) == 1 and os.path.getsize(traces[0]) > 0


def test_every_checkpoint_asked_for_is_written(small_config, tmp_path):
  # A write takes far longer than 5 steps of this model: the loop waits for
  # the writer rather than drop one.
  small_config.checkpoint_every_steps = 5
  small_config.checkpoint_every_seconds = 0
  small_config.max_checkpoints_to_keep = 100
  loop.train_and_evaluate(small_config, str(tmp_path))
  written = sorted(int(s) for s in os.listdir(tmp_path / 'checkpoints'))
  assert written == list(range(5, 61, 5))


class _Stop(Exception):
  pass


def test_checkpoints_by_the_clock_are_that_far_apart(small_config, tmp_path):
  small_config.num_train_steps = 1_000_000  # far more than the time allowed
  small_config.checkpoint_every_steps = 0
  small_config.checkpoint_every_seconds = 0.5
  small_config.max_checkpoints_to_keep = 1000
  small_config.eval_every_steps = small_config.log_every_steps = 100_000
  calls = []

  def stop_after_four_seconds(step, losses):
    del step, losses
    calls.append(time.monotonic())
    if calls[-1] - calls[0] > 4:
      raise _Stop
  with pytest.raises(_Stop):
    loop.train_and_evaluate(small_config, str(tmp_path),
                            on_call=stop_after_four_seconds)
  ckpts = tmp_path / 'checkpoints'
  written = sorted(os.path.getmtime(ckpts / s / 'commit_success.txt')
                   for s in os.listdir(ckpts))
  # About one every half second of training (the first comes with the
  # first call, which compiled for longer), each written in the background
  # as it came; on a loaded machine a write can take longer than the period
  # and the next one waits for it. checkpoint_policy's tests check the rule
  # itself exactly.
  assert 4 <= len(written) <= 10, written
  assert 0.3 < np.median(np.diff(written)) < 1.2, np.diff(written)


def test_piecewise_linear_inputs_train_and_evaluate(small_config, tmp_path):
  # The PLE bins' edges are computed while the model is traced: they must
  # be numpy constants there, not jax values.
  small_config.model.numeric_embedding = 'ple'
  small_config.dataset.numeric_scaling = 'quantile'
  small_config.model.ensemble_size = 2
  final = loop.train_and_evaluate(small_config, str(tmp_path))
  assert final['step'] == 60 and np.isfinite(final['rmse'])


def test_a_sweep_trains_each_combination_on_every_fold(small_config,
                                                       tmp_path):
  small_config.dataset.validation = 2
  small_config.model.ensemble_size = 2
  small_config.sweep.learning_rates = (1e-3, 1e-2)
  with pytest.raises(UsageError, match='multiple of the sweep.s 2 '
                     'combinations times the 2 folds; use a multiple of 4'):
    loop.train_and_evaluate(small_config, str(tmp_path / 'w'))
  assert not os.path.exists(tmp_path / 'w')
