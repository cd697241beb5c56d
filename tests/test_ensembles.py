"""Many models in one program: ensembles, uncertainty and sweeps, end to end."""

import json
import os
import shutil

import jax
import numpy as np
import pandas as pd
import pytest

from cli_helpers import run_train
from model_helpers import shrunk_config
from meshfit.errors import UsageError
from meshfit.report import writers
from meshfit.serve import evaluate, predict
from meshfit.train import loop

# Every test here trains (or runs train.py): left out of `make test-fast`.
pytestmark = pytest.mark.slow


def _ensemble_config(data_dir):
  """Four gaussian members, two learning rates, chosen greedily on
  validation rows, over a 2 x 2 x 2 mesh."""
  return shrunk_config(data_dir, {
      'dataset.validation': 0.2,
      'model.ensemble_size': 4,
      'model.likelihood': 'gaussian',
      'sweep.learning_rates': (3e-3, 1e-2),
      'sweep.select': 'greedy',
      'mesh.members': 2,
      'mesh.model': 2,
      'eval_batch_size': 512,
      'eval_every_steps': 20,
      'optimizer.schedule': 'constant',
      'plots': False})


def _records(workdir, key):
  return {r['step']: r[key]
          for r in writers.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
          if key in r}


@pytest.fixture(scope='module')
def ensemble(tmp_path_factory, data_dir):
  config = _ensemble_config(data_dir)
  workdir = str(tmp_path_factory.mktemp('ensemble'))
  final = loop.train_and_evaluate(config, workdir)
  return config, workdir, final


def test_the_run_says_which_members_it_chose(ensemble):
  config, workdir, final = ensemble
  assert final['step'] in (20, 40, 60)
  members = final['members']
  assert members and set(members) <= {'0', '1', '2', '3'}
  assert sum(m['weight'] for m in members.values()) == pytest.approx(1.0)
  for m in members.values():
    assert m['learning_rate'] in (pytest.approx(3e-3), pytest.approx(1e-2))
  # The chosen ensemble scores its own loss, never worse than its best
  # member's, both logged at every evaluation.
  chosen, best = (_records(workdir, 'val/loss'),
                  _records(workdir, 'val/loss_best_member'))
  assert sorted(chosen) == [20, 40, 60]
  assert all(chosen[s] <= best[s] + 1e-9 for s in chosen)
  assert final['val_loss'] == pytest.approx(min(chosen.values()))
  # Per example, in the target's units: a probability model's metrics.
  assert np.isfinite(final['nll'])
  assert 0.5 < final['coverage_90'] <= 1.0


def test_resume_with_members_is_bit_exact(ensemble, data_dir, tmp_path):
  config, whole, _ = ensemble
  parts = str(tmp_path / 'parts')
  first = config.copy_and_resolve_references()
  first.num_train_steps = 40
  loop.train_and_evaluate(first, parts)
  # As if killed after step 40 having saved only step 20 (and the best).
  shutil.rmtree(os.path.join(parts, 'checkpoints', '40'))
  final = loop.train_and_evaluate(config, parts)
  for key in ('train/loss', 'val/loss', 'val/loss_best_member',
              'eval/rmse'):
    assert _records(parts, key) == _records(whole, key), key
  assert final['members'] == ensemble[2]['members']


def test_eval_reports_nll_coverage_and_draws_calibration(ensemble, tmp_path):
  config, workdir, final = ensemble
  config = config.copy_and_resolve_references()
  config.plots = True
  result = evaluate.evaluate(config, workdir)
  assert result['step'] == final['step']
  for key in ('nll', 'coverage_50', 'coverage_90', 'coverage_95'):
    assert result[key] == pytest.approx(final[key], rel=1e-5), key
  assert result['coverage_50'] <= result['coverage_90'] <= (
      result['coverage_95'])
  assert result['coverage']['0.9'] == result['coverage_90']
  assert result['members'] == final['members']
  png = os.path.join(workdir, 'eval', f'step_{result["step"]}_calibration.png')
  with open(png, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  with open(os.path.join(workdir, 'eval',
                         f'step_{result["step"]}.json')) as f:
    assert json.load(f)['nll'] == result['nll']


def _predict(workdir, input_path, output, devices, *extra):
  run_train('--mode=predict', f'--workdir={workdir}', f'--input={input_path}',
            f'--output={output}', *extra, devices=devices, check=0)
  return pd.read_csv(output)


def test_predict_writes_std_and_interval_alike_on_8_devices_and_1(
    ensemble, tmp_path):
  _, workdir, _ = ensemble
  rng = np.random.default_rng(0)
  x = pd.DataFrame(rng.uniform(size=(37, 10)),
                   columns=[f'x{i}' for i in range(10)])
  input_path = str(tmp_path / 'x.csv')
  x.to_csv(input_path, index=False)
  eight = _predict(workdir, input_path, str(tmp_path / 'p8.csv'), 8,
                   '--interval=0.9')
  one = _predict(workdir, input_path, str(tmp_path / 'p1.csv'), 1,
                 '--interval=0.9')
  assert list(eight.columns) == ['y_pred', 'y_std', 'y_lower', 'y_upper']
  assert len(eight) == 37
  np.testing.assert_allclose(eight.to_numpy(), one.to_numpy(), rtol=1e-5,
                             atol=1e-6)
  assert (eight['y_std'] > 0).all()
  assert (eight['y_lower'] < eight['y_pred']).all()
  assert (eight['y_pred'] < eight['y_upper']).all()
  plain = _predict(workdir, input_path, str(tmp_path / 'p.csv'), 8)
  assert list(plain.columns) == ['y_pred', 'y_std']
  np.testing.assert_allclose(plain['y_pred'], eight['y_pred'], rtol=1e-6)


def test_an_interval_of_a_model_without_a_distribution_is_refused(
    small_config, tmp_path):
  workdir = str(tmp_path / 'run')
  loop.train_and_evaluate(small_config, workdir)
  x = pd.DataFrame(np.zeros((2, 10)), columns=[f'x{i}' for i in range(10)])
  x.to_csv(tmp_path / 'x.csv', index=False)
  with pytest.raises(UsageError, match='predicts no distribution'):
    predict.predict(small_config, workdir, str(tmp_path / 'x.csv'),
                    str(tmp_path / 'p.csv'), interval=0.9)
  assert not os.path.exists(tmp_path / 'p.csv')
  proc = run_train('--mode=predict', f'--workdir={workdir}',
                   f'--input={tmp_path / "x.csv"}',
                   f'--output={tmp_path / "p.csv"}', '--interval=1.5')
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].startswith(
      'error: --interval=1.5 is not a probability')


def test_a_diverging_member_is_left_out_and_the_others_train_on(
    small_config, tmp_path, absl_caplog):
  config = small_config
  config.dataset.validation = 0.2
  config.model.ensemble_size = 2
  config.sweep.learning_rates = (1e-2, 1e9)
  config.sweep.select = 'all'
  config.optimizer.grad_clip_norm = 0.0
  config.optimizer.schedule = 'constant'
  final = loop.train_and_evaluate(config, str(tmp_path))
  warnings = [r.getMessage() for r in absl_caplog.records
              if 'diverged' in r.getMessage()]
  assert len(warnings) == 1 and warnings[0].startswith('Member 1 (')
  assert 'learning_rate=1e+09' in warnings[0]
  assert np.isfinite(final['rmse']) and final['r2'] > 0.5
  assert list(final['members']) == ['0']


def _cross_fit_config(data_dir):
  """Four members in two bags of two folds, two learning rates, the best
  bag chosen out of fold and blended with its ridge parts."""
  config = _ensemble_config(data_dir)
  config.dataset.validation = 2
  config.model.likelihood = 'squared_error'
  config.model.ridge_blend = True
  # Slow networks, so that their ridge parts beat them and take a share.
  config.sweep.learning_rates = (1e-4, 3e-4)
  config.sweep.select = 'best'
  config.num_train_steps = 40
  return config


@pytest.fixture(scope='module')
def cross_fitted(tmp_path_factory, data_dir):
  config = _cross_fit_config(data_dir)
  workdir = str(tmp_path_factory.mktemp('cross_fitted'))
  final = loop.train_and_evaluate(config, workdir)
  return config, workdir, final


@pytest.fixture(scope='module')
def cross_fitted_step_40(cross_fitted):
  """(set-up, train state of step 40, splits) of the cross-fitted run."""
  from meshfit import config as config_lib  # noqa: PLC0415
  from meshfit.checkpoints import checkpointer, reading  # noqa: PLC0415
  from meshfit.data import splits as splits_lib  # noqa: PLC0415
  from meshfit.data.features import InputLayout  # noqa: PLC0415
  from meshfit.model.setup import make_setup  # noqa: PLC0415
  config, workdir, _ = cross_fitted
  parsed = config_lib.parse(config)
  splits = splits_lib.load_splits(parsed.dataset, parsed.seed)
  train = splits.train
  setup = make_setup(parsed, InputLayout.of(
      train.plan.input_categories, train.missing_I,
      parsed.dataset.numeric_scaling), train.num_targets)
  ckpt = checkpointer.Checkpointer(workdir)
  try:
    return setup, reading.restore(ckpt, setup, 40), splits
  finally:
    ckpt.close()


def test_cross_fitted_members_are_validated_out_of_fold(cross_fitted,
                                                         cross_fitted_step_40):
  from meshfit.model import (forward, inference, selection,  # noqa: PLC0415
                             steps)
  from meshfit.parallel import sharding  # noqa: PLC0415
  _, workdir, final = cross_fitted
  setup, state, splits = cross_fitted_step_40
  train = splits.train
  # A bag is both folds of one learning rate: members 0-1 and 2-3.
  members = final['members']
  assert set(members) in ({'0', '1'}, {'2', '3'})
  assert {m['weight'] for m in members.values()} == {0.5}
  assert len({m['learning_rate'] for m in members.values()}) == 1
  # The logged validation loss of step 40 is the chosen bag's, every row
  # predicted by the member that did not train on it.
  network, _, ridge_part = inference.table_member_parts(setup, state, train.x_NxF,
                                                512)
  # The loop scores each row with the members that held it out only: what
  # the out-of-fold choice reads of every member's parts, nothing else.
  fold = splits.validation_fold_N
  held = inference.held_out_member_parts(
      setup, state, train.x_NxF, fold, 2, 512,
      forward.jit_held_out_member_parts(setup.graphdef, setup.arch.layout,
                                        setup.shardings, setup.mesh))
  # The loop reads those rows from the table the train call gathers its
  # batches from, encoded once: the same numbers as encoding them again.
  table_z = steps.jit_encode(setup.mesh, setup.arch.layout)(
      state.stats, jax.device_put({'x': train.x_NxF, 'y': train.y_NxT},
                                  sharding.replicated(setup.mesh)))
  held_z = inference.held_out_member_parts(
      setup, state, train.x_NxF, fold, 2, 512,
      forward.jit_held_out_member_parts_of_rows(
          setup.graphdef, setup.shardings, setup.mesh), table_z)
  for part, part_z in zip(held, held_z):
    np.testing.assert_allclose(part_z, part, rtol=1e-6, atol=1e-6)
  for whole, part in ((network, held[0]), (ridge_part, held[2])):
    np.testing.assert_allclose(selection.out_of_fold(part, fold, 2),
                               selection.out_of_fold(whole, fold, 2),
                               rtol=1e-6, atol=1e-6)
    in_fold = np.arange(4)[:, None] % 2 != fold[None]
    assert np.isnan(part[in_fold]).all() and not np.isnan(part[~in_fold]).any()
  # Each member predicts its network blended with its ridge part, by the
  # weight step 40 chose (the same in every member).
  weight = np.asarray(state.params['ridge']['weight'])
  assert 0 < weight[0, 0] <= 1 and (weight == weight[0]).all()
  mean = network + weight[:, None] * (ridge_part - network)
  stats = state.stats
  z = (train.y_NxT - np.asarray(stats.y_mean_T)) / np.asarray(stats.y_std_T)
  fold = splits.validation_fold_N
  bag = int(min(members)) // 2
  own = np.stack([mean[2 * bag + f] for f in range(2)])
  out_of_fold = np.where((fold == 0)[:, None], own[0], own[1])
  in_fold = np.where((fold == 1)[:, None], own[0], own[1])
  logged = _records(workdir, 'val/loss_blended')[40]
  assert logged == pytest.approx(np.mean((out_of_fold - z)**2), rel=1e-4)
  # What a leak would report is told apart from it (after 40 steps on 100k
  # rows the members have not overfitted: it need not be lower).
  assert np.mean((in_fold - z)**2) != pytest.approx(logged, rel=1e-4)
  rmse = _records(workdir, 'val/rmse')[40]
  assert rmse == pytest.approx(np.sqrt(logged) * float(stats.y_std_T[0]),
                               rel=1e-4)


def test_held_out_folds_a_few_rows_apart_share_one_program(
    cross_fitted_step_40):
  # Cross-validation's training sets differ by a row or a few: their
  # members' held-out folds must not each compile a program of their own.
  from meshfit.model import forward, inference  # noqa: PLC0415
  setup, state, splits = cross_fitted_step_40
  step = forward.jit_held_out_member_parts(
      setup.graphdef, setup.arch.layout, setup.shardings, setup.mesh)
  shapes = set()

  def recorded_step(state, x_BxF, members_K):
    shapes.add(x_BxF.shape)
    return step(state, x_BxF, members_K)

  x, fold = splits.train.x_NxF, splits.validation_fold_N
  for rows in (300, 302, 311):
    parts = inference.held_out_member_parts(
        setup, state, x[:rows], fold[:rows], 2, 512, recorded_step)
    assert parts[0].shape[1] == rows
  assert len(shapes) == 1, (
      f'held-out batches of {sorted(shapes)}: each size compiles anew')


def test_resume_with_folds_is_bit_exact(cross_fitted, tmp_path):
  config, whole, final = cross_fitted
  parts = str(tmp_path / 'parts')
  first = config.copy_and_resolve_references()
  first.num_train_steps = 20
  loop.train_and_evaluate(first, parts)
  resumed = loop.train_and_evaluate(config, parts)
  for key in ('train/loss', 'val/loss', 'eval/rmse'):
    assert _records(parts, key) == _records(whole, key), key
  assert resumed['members'] == final['members']
