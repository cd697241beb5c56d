"""Each member's vocabulary: the category codes it reads, counted on its own
training rows (meshfit/model/vocabulary_fit.py, models/embeddings.py)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshfit.configs import default
from meshfit.input_pipeline.tables import Table, generated_plan
from meshfit import config as config_lib
from meshfit.data import splits as splits_lib
from meshfit.data.features import FeatureStats, InputLayout
from meshfit.errors import UsageError
from meshfit.model import optim, state as state_lib, vocabulary_fit
from meshfit.model.setup import make_setup
from model_helpers import mlp_config
from meshfit.models import mlp
from meshfit.models.mlp import Mlp

N = 300
# Category sizes: unknown, missing, then values.
SIZES = (7, 4)


def _table(seed: int = 0):
  """A number and two categories. Column one's value codes 2..6 are held
  300, 1, 2, 3 and 0 times... by construction below; column two's 2..3
  by every other row."""
  rng = np.random.default_rng(seed)
  first = np.full(N, 2.0)
  first[rng.choice(N, 6, replace=False)] = [3, 4, 4, 5, 5, 5]
  second = 2.0 + np.arange(N) % 2
  x_NxF = np.stack([rng.normal(size=N), first, second], axis=1)
  y_NxT = (x_NxF[:, :1] + (first == 4)[:, None]).astype(np.float32)
  layout = InputLayout.of((0,) + SIZES, (False, False, False), 'standardize')
  return layout, Table(x_NxF.astype(np.float32), y_NxT, generated_plan(3, 1))


def _direct_counts(x_NxF: np.ndarray) -> np.ndarray:
  counts = [np.bincount(x_NxF[:, 1 + c].astype(int), minlength=n)
            for c, n in enumerate(SIZES)]
  return np.concatenate(counts)


def test_members_count_the_codes_of_the_rows_they_train_on():
  layout, table = _table()
  folds, members = 3, 6
  splits = splits_lib.cross_fit(splits_lib.Splits(table, table), folds,
                                seed=0, resident_table_mb=1024)
  counts_MxV = vocabulary_fit.member_counts(layout, splits, members)
  assert counts_MxV.shape == (members, sum(SIZES))
  for m in range(members):  # member m trains on every fold but m % 3
    rows = splits.validation_fold_N != m % folds
    np.testing.assert_array_equal(counts_MxV[m],
                                  _direct_counts(table.x_NxF[rows]))
  known_MxV = vocabulary_fit.known(layout, counts_MxV, 2)
  expected = (counts_MxV >= 2).astype(np.float32)
  expected[:, [0, SIZES[0]]] = 1.0  # each column's unknown code
  np.testing.assert_array_equal(known_MxV, expected)


def test_held_out_rows_count_for_no_member():
  layout, table = _table(1)
  rest, held = splits_lib.hold_out(table, 0.3, seed=0)
  splits = splits_lib.Splits(table, None, validation=held, train_blocks=rest)
  counts_MxV = vocabulary_fit.member_counts(layout, splits, 2)
  expected = _direct_counts(table.x_NxF[rest.rows()])
  for m in range(2):
    np.testing.assert_array_equal(counts_MxV[m], expected)
  assert (counts_MxV[0] < _direct_counts(table.x_NxF)).any()


def _fresh(layout: InputLayout, table: Table, members: int, folds: int = 0):
  """(set-up, fresh state) of a small model with member vocabularies."""
  raw = default.get_config()
  raw.model.hidden_sizes = (8,)
  raw.model.ensemble_size = members
  raw.model.category_member_min_count = 2
  raw.dataset.validation = folds
  config = config_lib.parse(raw)
  setup = make_setup(config, layout, 1)
  stats = FeatureStats.fit(layout, table.x_NxF, table.y_NxT)
  return setup, state_lib.create_train_state(
      setup.arch, setup.tx, setup.mesh, 0, stats,
      optim.Hyperparameters.of(config))


def test_a_streamed_table_is_not_read_again_to_count(tmp_path):
  from meshfit.input_pipeline import store  # noqa: PLC0415
  layout, table = _table(2)
  rows = np.concatenate([table.x_NxF, table.y_NxT], axis=1)
  store.write_part(str(tmp_path / 'part-0'), [rows], rows.shape[1])
  streamed = store.Store(str(tmp_path), [store.Part('part-0', N)],
                         table.plan)
  rest, held = splits_lib.hold_out(streamed, 0.3, seed=0)
  splits = splits_lib.Splits(streamed, None, validation=held,
                             train_blocks=rest)
  assert vocabulary_fit.member_counts(layout, splits, 2) is None
  setup, state = _fresh(layout, table, members=2)
  fitted = vocabulary_fit.fit_into(state, setup, splits, 2)
  assert jax.device_get(fitted.params[mlp.VOCABULARY]['known']).all()


def test_fit_into_sets_each_members_vocabulary_and_nothing_else():
  layout, table = _table()
  splits = splits_lib.cross_fit(splits_lib.Splits(table, table), 3, seed=0,
                                resident_table_mb=1024)
  setup, state = _fresh(layout, table, members=6, folds=3)
  assert jax.device_get(state.params[mlp.VOCABULARY]['known']).all()
  fitted = vocabulary_fit.fit_into(state, setup, splits, 2)
  known = jax.device_get(fitted.params[mlp.VOCABULARY]['known'])
  expected = vocabulary_fit.known(
      layout, vocabulary_fit.member_counts(layout, splits, 6), 2)
  np.testing.assert_array_equal(known[:, :sum(SIZES)], expected)
  assert known[:, sum(SIZES):].all()  # the padding rows
  assert not known.all()  # the rare values are unknown somewhere
  assert (fitted.params[mlp.VOCABULARY]['known'].sharding
          == setup.shardings.params[mlp.VOCABULARY]['known'])
  for name in ('head', 'hidden', 'categories'):
    jax.tree.map(np.testing.assert_array_equal,
                 jax.device_get(state.params[name]),
                 jax.device_get(fitted.params[name]))


LAYOUT = InputLayout.of((0,) + SIZES, (False, False, False), 'standardize')


def _model(min_count: int, onehot_max: int = 0) -> Mlp:
  config = mlp_config(hidden_sizes=(8,), category_onehot_max=onehot_max,
                      category_member_min_count=min_count)
  return state_lib.Architecture(config, LAYOUT, 1).build(0)


def test_a_member_reads_the_codes_it_does_not_know_as_unknown():
  plain, member = _model(0), _model(2)
  assert plain.vocabulary is None
  numbers = jnp.zeros((4, 1))
  codes = jnp.array([[2, 2], [3, 3], [0, 3], [4, 1]], jnp.int32)
  # Every code known: the same network, the same predictions.
  np.testing.assert_array_equal(plain(numbers, None, codes),
                                member(numbers, None, codes))
  known = np.ones(member.vocabulary.known.shape, np.float32)
  known[[3, SIZES[0] + 1]] = 0.0  # column one's code 3, column two's 1
  member.vocabulary.known[...] = jnp.asarray(known)
  read = jnp.array([[2, 2], [0, 3], [0, 3], [4, 0]], jnp.int32)
  np.testing.assert_array_equal(member(numbers, None, codes),
                                plain(numbers, None, read))
  # One-hot categories read the same codes.
  model = _model(2, onehot_max=8)
  model.vocabulary.known[...] = jnp.asarray(known)
  np.testing.assert_array_equal(model(numbers, None, codes),
                                model(numbers, None, read))


def test_training_never_changes_a_vocabulary():
  params = {'head': {'kernel': np.ones(3)},
            mlp.VOCABULARY: {'known': np.array([1.0, 0.0, 1.0])}}
  assert optim.trained(params) == {'head': {'kernel': True},
                                   mlp.VOCABULARY: {'known': False}}
  raw = default.get_config()
  raw.optimizer.name = 'adamw'
  raw.optimizer.weight_decay = 0.5
  raw.optimizer.schedule = 'constant'
  raw.model.category_member_min_count = 2
  config = config_lib.parse(raw)
  setup = make_setup(config, InputLayout.of((0, 5), (False, False),
                                            'standardize'), 1)
  grads = jax.tree.map(np.zeros_like, params)
  updates, _ = setup.tx.update(grads, setup.tx.init(params), params)
  assert np.all(updates['head']['kernel'] < 0)  # decayed
  assert not np.any(updates[mlp.VOCABULARY]['known'])


@pytest.mark.parametrize('min_count', [-1, -5])
def test_the_key_takes_non_negative_integers(min_count):
  raw = default.get_config()
  raw.model.category_member_min_count = min_count
  with pytest.raises(UsageError,
                     match='model.category_member_min_count'):
    config_lib.parse(raw)


def _csv_config(tmp_path, steps: int):
  """configs/csv.py on a table whose category has values too rare for some
  members (and a value only the eval file has), on a 4 x 2 mesh."""
  import pandas as pd  # noqa: PLC0415
  from meshfit.configs import csv as csv_config  # noqa: PLC0415
  rng = np.random.default_rng(5)
  n = 400
  shop = rng.choice([f's{i}' for i in range(8)], n).astype(object)
  shop[:12] = ['r0', 'r0', 'r1', 'r1', 'r2', 'r2', 'r2', 'r3', 'r3', 'r4',
               'r4', 'r4']
  frame = pd.DataFrame({'a': rng.normal(size=n), 'shop': shop})
  frame['y'] = frame['a'] + (frame['shop'] == 's1') + rng.normal(size=n) * .1
  frame.iloc[:320].to_csv(tmp_path / 'train.csv', index=False)
  frame.iloc[320:].assign(shop=['r1', 'new'] + list(shop[322:])).to_csv(
      tmp_path / 'eval.csv', index=False)
  config = csv_config.get_config()
  config.dataset.data_dir = str(tmp_path / 'data')
  config.dataset.train_path = str(tmp_path / 'train.csv')
  config.dataset.eval_path = str(tmp_path / 'eval.csv')
  config.dataset.target_columns = ('y',)
  config.num_train_steps = steps
  config.optimizer.schedule = 'constant'
  config.eval_every_steps = config.log_every_steps = 10
  config.checkpoint_every_steps = 20
  config.early_stopping_evals = 0
  config.mesh.model = 2
  config.plots = False
  return config


@pytest.mark.slow
def test_a_run_keeps_its_vocabularies_resumes_exactly_and_restores_anywhere(
    tmp_path):
  from meshfit.checkpoints import reading  # noqa: PLC0415
  from meshfit.config import json_files  # noqa: PLC0415
  from meshfit.report import writers  # noqa: PLC0415
  from meshfit.serve import evaluate  # noqa: PLC0415
  from meshfit.train import loop  # noqa: PLC0415
  config = _csv_config(tmp_path, 60)
  whole, parts = str(tmp_path / 'whole'), str(tmp_path / 'parts')
  final = loop.train_and_evaluate(config, whole)
  first = config.copy_and_resolve_references()
  first.num_train_steps = 40
  loop.train_and_evaluate(first, parts)
  loop.train_and_evaluate(config, parts)  # resumed at step 40

  def losses(workdir):
    return [(r['step'], r['train/loss'], r.get('val/loss')) for r in
            writers.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
            if 'train/loss' in r]
  assert losses(parts) == losses(whole)
  # The vocabularies counted before step 0 are the last checkpoint's.
  parsed = config_lib.parse(config)
  splits = splits_lib.load_splits(parsed.dataset, parsed.seed)
  with reading.SavedModel(whole, 60) as saved:
    _, state = saved.restore(parsed)
  known = jax.device_get(state.params[mlp.VOCABULARY]['known'])
  expected = vocabulary_fit.known(
      saved.layout, vocabulary_fit.member_counts(saved.layout, splits, 5), 2)
  np.testing.assert_array_equal(known[:, :expected.shape[1]], expected)
  assert not expected.all()  # some member reads some value as unknown
  # Evaluated on other meshes, the same model.
  for data, model in ((8, 1), (2, 4)):
    other = config.copy_and_resolve_references()
    other.mesh.data, other.mesh.model = data, model
    other = json_files.merge_eval_overrides(config, other,
                                            ['mesh.data', 'mesh.model'])
    assert evaluate.evaluate(other, whole)['rmse'] == pytest.approx(
        final['rmse'], rel=1e-6)
