"""--mode=predict end to end, its output file, and the pictures that eval and
training draw."""

import functools
import json
import os
import struct

import numpy as np
import pandas as pd
import pytest

from cli_helpers import regression_frame, run_train, saved_config
from meshfit.input_pipeline import table_files
from meshfit.input_pipeline.errors import DataError
from meshfit.checkpoints import reading
from meshfit.errors import UsageError
from meshfit.serve import evaluate, export, predict

# Every test here trains (or runs train.py): left out of `make test-fast`.
pytestmark = pytest.mark.slow

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


run = functools.partial(run_train, devices=4)


def _json(proc):
  return json.loads(proc.stdout[proc.stdout.index('{'):])


_frame = regression_frame


@pytest.fixture(scope='module')
def csv_run(tmp_path_factory):
  """Two targets, trained by the CLI on a 2 x 2 mesh; checkpoints 150, 300."""
  tmp = tmp_path_factory.mktemp('predict')
  eval_ = _frame(77, 1)  # not a multiple of any batch: the last is padded
  _frame(300, 0).to_csv(tmp / 'train.csv', index=False)
  eval_.to_csv(tmp / 'eval.csv', index=False)
  workdir = str(tmp / 'run')
  run('--config=configs/csv.py', f'--workdir={workdir}',
      f'--config.dataset.data_dir={tmp}/tfds',
      f'--config.dataset.train_path={tmp}/train.csv',
      f'--config.dataset.eval_path={tmp}/eval.csv',
      "--config.dataset.target_columns=('y', 'z')",
      "--config.dataset.feature_columns=('a', 'b', 'c')",
      '--config.num_train_steps=300', '--config.checkpoint_every_steps=150',
      '--config.eval_every_steps=150', '--config.log_every_steps=50',
      '--config.eval_batch_size=32', '--config.mesh.model=2',
      # The networks alone, which differ between the checkpoints (ridge
      # parts would fit these linear targets alike at both).
      '--config.model.ridge_blend=False', check=0)
  return tmp, workdir, eval_


def test_predicting_the_eval_file_reproduces_the_eval_rmse(csv_run):
  tmp, workdir, eval_ = csv_run
  scores = evaluate.evaluate(saved_config(workdir), workdir)
  out = tmp / 'pred.csv'
  summary = _json(run('--mode=predict', f'--workdir={workdir}',
                      f'--input={tmp}/eval.csv', f'--output={out}',
                      '--keep_columns=id', check=0))
  assert summary['step'] == 300 and summary['num_examples'] == 77
  pred = pd.read_csv(out)
  assert list(pred.columns) == ['id', 'y_pred', 'z_pred']
  assert list(pred['id']) == list(eval_['id'])  # the input's rows, in order
  # eval/rmse is the mean over targets of each target's RMSE, in the
  # targets' original units; it must come out of the written file alone.
  per_target = [np.sqrt(np.mean((pred[f'{t}_pred'].to_numpy(np.float64)
                                 - eval_[t].to_numpy(np.float32)) ** 2))
                for t in ('y', 'z')]
  assert np.mean(per_target) == pytest.approx(scores['rmse'], rel=1e-6)
  # A trained model, not a constant: far below the targets' spread.
  assert per_target[0] < 0.2 * eval_['y'].std()


def test_columns_are_found_by_name_on_any_mesh_and_any_step(csv_run):
  tmp, workdir, eval_ = csv_run
  reference = tmp / 'reference.csv'
  predict.predict(saved_config(workdir), workdir, f'{tmp}/eval.csv',
                  str(reference))
  # Other column order, an extra text column, no targets, rows reversed,
  # Parquet both ways, on one device instead of the 2 x 2 training mesh.
  shuffled = eval_[['c', 'id', 'b', 'a']].iloc[::-1].assign(note='x')
  shuffled.to_parquet(tmp / 'shuffled.parquet', index=False)
  out = tmp / 'shuffled_pred.parquet'
  run('--mode=predict', f'--workdir={workdir}',
      f'--input={tmp}/shuffled.parquet', f'--output={out}',
      '--keep_columns=note,id', devices=1, check=0)
  pred = pd.read_parquet(out)
  assert list(pred.columns) == ['note', 'id', 'y_pred', 'z_pred']
  assert list(pred['id']) == list(eval_['id'][::-1])
  expected = pd.read_csv(reference).iloc[::-1]
  np.testing.assert_allclose(pred[['y_pred', 'z_pred']].to_numpy(),
                             expected[['y_pred', 'z_pred']].to_numpy(),
                             rtol=1e-5, atol=1e-5)
  # --step picks another checkpoint: another model, other predictions.
  earlier = tmp / 'step150.csv'
  summary = predict.predict(saved_config(workdir), workdir, f'{tmp}/eval.csv',
                            str(earlier), step=150)
  assert summary['step'] == 150
  assert not np.allclose(pd.read_csv(earlier)['y_pred'],
                         pd.read_csv(reference)['y_pred'])


def _assert_usage_error(proc, message):
  assert proc.returncode == 2, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and message in last, last
  assert 'Traceback' not in proc.stderr


def _assert_refused(call, message):
  """`call()` raises the error train.py turns into `error: message`."""
  with pytest.raises((UsageError, DataError)) as e:
    call()
  assert message in str(e.value), str(e.value)


# End to end through train.py: the flag checks, and a library error of each
# kind (a DataError, a UsageError) reaching the one error line and status 2.
# The library's other refusals are the same path: asserted in-process below.
@pytest.mark.parametrize('case, message', [
    ('missing_feature', "has no column 'b' (a feature the model was trained "
                        'on)'),
    ('no_output', '--mode=predict needs --output'),
    ('input_without_predict', '--input: only for --mode=predict, not '
                              '--mode=eval'),
    ('missing_step', 'no checkpoint of step 7'),
])
def test_bad_predict_requests_exit_2_and_write_nothing(csv_run, case,
                                                       message):
  tmp, workdir, eval_ = csv_run
  path, out = tmp / f'{case}.csv', tmp / f'{case}_pred.csv'
  frame = eval_.copy()
  if case == 'missing_feature':
    frame = frame.drop(columns='b')
  frame.to_csv(path, index=False)
  args = {
      'no_output': ['--mode=predict', f'--input={path}'],
      'input_without_predict': ['--mode=eval', f'--input={path}'],
      'missing_step': ['--mode=predict', f'--input={path}', f'--output={out}',
                       '--step=7'],
  }.get(case, ['--mode=predict', f'--input={path}', f'--output={out}'])
  _assert_usage_error(run(f'--workdir={workdir}', *args, devices=1), message)
  assert not out.exists()


@pytest.mark.parametrize('case, message', [
    ('missing_input', "'nope.csv' (--input) does not exist"),
    ('bad_value', "(--input), column 'a', data row 3 (1-based, header not "
                  "counted): '4,5' is not a number"),
    ('missing_keep_column', "has no column 'key' (asked to keep it)"),
    ('output_is_input', 'is the --input file'),
    ('output_is_a_directory', 'is a directory; name a file in it'),
])
def test_bad_predict_requests_are_refused_and_write_nothing(csv_run, case,
                                                            message):
  tmp, workdir, eval_ = csv_run
  path, out = tmp / f'{case}.csv', tmp / f'{case}_pred.csv'
  frame = eval_.copy()
  if case == 'bad_value':
    frame = frame.astype({'a': object})
    frame.loc[2, 'a'] = '4,5'
  frame.to_csv(path, index=False)
  inputs, output, keep = str(path), str(out), ()
  if case == 'missing_input':
    inputs = 'nope.csv'
  elif case == 'missing_keep_column':
    keep = ('id', 'key')
  elif case == 'output_is_input':
    output = str(path)
  elif case == 'output_is_a_directory':
    output = str(tmp)
  _assert_refused(lambda: predict.predict(saved_config(workdir), workdir,
                                          inputs, output,
                                          keep_columns=keep), message)
  assert not out.exists()


def _contents(directory: str) -> dict[str, bytes]:
  return {os.path.relpath(os.path.join(root, name), directory):
          open(os.path.join(root, name), 'rb').read()
          for root, _, names in os.walk(directory) for name in names}


# The first through train.py, the others in-process (the same refusal, in
# the library, on each kind of entry and in each mode).
@pytest.mark.parametrize('mode, output, message', [
    ('predict', 'config.json', "is the run's own 'config.json'"),
    ('predict', 'metrics.jsonl', "is the run's own 'metrics.jsonl'"),
    ('predict', 'checkpoints/150/x.csv', "is the run's own 'checkpoints'"),
    ('export', 'eval', "is the run's own 'eval'"),
    ('export', '.', 'is the workdir'),
])
def test_outputs_never_land_on_the_run(csv_run, mode, output, message):
  tmp, workdir, eval_ = csv_run
  path = tmp / 'rows.csv'
  eval_.to_csv(path, index=False)
  before = _contents(workdir)
  output = os.path.join(workdir, output)
  if output.endswith('config.json'):
    _assert_usage_error(run(f'--workdir={workdir}', f'--mode={mode}',
                            f'--input={path}', f'--output={output}',
                            devices=1), message)
  elif mode == 'predict':
    _assert_refused(lambda: predict.predict(saved_config(workdir), workdir,
                                            str(path), output), message)
  else:
    _assert_refused(lambda: export.export(saved_config(workdir), workdir,
                                          output), message)
  assert _contents(workdir) == before


@pytest.mark.parametrize('mode', ['eval', 'predict', 'export'])
def test_a_workdir_that_is_a_file_is_named(csv_run, mode):
  tmp, _, eval_ = csv_run
  args = {'eval': [], 'export': [f'--output={tmp}/never'],
          'predict': [f'--input={tmp}/eval.csv', f'--output={tmp}/never.csv']}
  _assert_usage_error(run(f'--workdir={tmp}/train.csv', f'--mode={mode}',
                          *args[mode], devices=1),
                      f'workdir {tmp}/train.csv is a file')


def test_another_eval_file_is_scored_into_files_of_its_own(csv_run):
  tmp, workdir, eval_ = csv_run
  own = os.path.join(workdir, 'eval', 'step_300.json')
  run(f'--workdir={workdir}', '--mode=eval', devices=1, check=0)
  before = open(own, 'rb').read()
  assert json.loads(before)['eval_path'] == f'{tmp}/eval.csv'
  eval_.head(20).to_csv(tmp / 'other.csv', index=False)
  result = _json(run(f'--workdir={workdir}', '--mode=eval',
                     f'--config.dataset.eval_path={tmp}/other.csv',
                     devices=1, check=0))
  assert result['num_examples'] == 20
  assert result['eval_path'] == f'{tmp}/other.csv'
  written = [n for n in os.listdir(os.path.join(workdir, 'eval'))
             if n.startswith('step_300_other-')]
  assert sorted(n.split('.', 1)[1] for n in written) == [
      'json', 'png'], written
  assert open(own, 'rb').read() == before


def test_a_checkpoint_of_an_older_meshfit_is_refused():
  with pytest.raises(UsageError, match='older meshfit .*use that version'):
    reading.read_model({'config': {}, 'data_position': 0,
                        'feature_names': ['x0']}, 5, 'ckpts')


def _png_size(path) -> tuple[int, int]:
  """(width, height) from the PNG header; fails on anything but a PNG."""
  with open(path, 'rb') as f:
    head = f.read(24)
  assert head[:8] == PNG_MAGIC and head[12:16] == b'IHDR', path
  return struct.unpack('>II', head[16:24])


def test_training_and_eval_draw_readable_pictures(csv_run):
  _, workdir, _ = csv_run
  evaluate.evaluate(saved_config(workdir), workdir, 150)
  import matplotlib.image  # noqa: PLC0415
  sizes = {}
  for name in ('loss_curve.png', 'eval/step_150_predictions.png'):
    path = os.path.join(workdir, name)
    width, height = sizes[name] = _png_size(path)
    assert 600 <= width <= 2000 and 300 <= height <= 2000, (name, width,
                                                            height)
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width)
    assert pixels.std() > 0.05  # something is drawn on the white canvas
  # One row of panels per target: two targets, a taller figure.
  assert (sizes['eval/step_150_predictions.png'][1]
          > 1.5 * sizes['loss_curve.png'][1])


def test_synthetic_runs_predict_from_x0_x9_style_columns(tmp_path):
  """Generated datasets have no file: their names are x0.. and y."""
  from meshfit.configs import linear  # noqa: PLC0415
  from meshfit.input_pipeline import tables  # noqa: PLC0415
  from meshfit.serve import evaluate
  from meshfit.train import loop  # noqa: PLC0415
  config = linear.get_config()
  config.dataset.data_dir = str(tmp_path / 'tfds')
  config.num_train_steps = 50
  workdir = str(tmp_path / 'run')
  loop.train_and_evaluate(config, workdir)
  scores = evaluate.evaluate(config, workdir)
  builder = tables.prepare(config.dataset.name, config.dataset.data_dir)
  test = tables.load_table(builder, 'test')
  assert test.feature_names == ('x0',) and test.target_names == ('y',)
  pd.DataFrame({'y': test.y_NxT[:, 0], 'x0': test.x_NxF[:, 0]}).to_csv(
      tmp_path / 'test.csv', index=False)
  summary = predict.predict(config, workdir, str(tmp_path / 'test.csv'),
                            str(tmp_path / 'pred.csv'))
  assert summary['columns'] == ['y_pred']
  pred = pd.read_csv(tmp_path / 'pred.csv')['y_pred'].to_numpy(np.float64)
  rmse = np.sqrt(np.mean((pred - test.y_NxT[:, 0]) ** 2))
  assert rmse == pytest.approx(scores['rmse'], rel=1e-6)
  assert os.path.exists(os.path.join(workdir, 'loss_curve.png'))


@pytest.mark.parametrize('suffix', ['.csv', '.parquet'])
def test_predictions_round_trip_with_kept_columns(tmp_path, suffix):
  frame = _frame(7, 0)
  path = str(tmp_path / f'in{suffix}')
  if suffix == '.parquet':
    frame.to_parquet(path, index=False)
  else:
    frame.to_csv(path, index=False)
  keep = table_files.pass_through(table_files.read_frame(path), ['id', 'b'],
                                  path)
  rng = np.random.default_rng(1)
  pred_Nx2 = (rng.normal(size=(7, 2)) * 1e3).astype(np.float32)
  out = str(tmp_path / f'pred{suffix}')
  predict.write_predictions(out, pred_Nx2, ('y', 'z'), keep)
  written = table_files.read_frame(out)
  assert list(written.columns) == ['id', 'b', 'y_pred', 'z_pred']
  assert written['id'].tolist() == frame['id'].tolist()
  np.testing.assert_array_equal(written['b'], frame['b'])
  np.testing.assert_array_equal(
      written[['y_pred', 'z_pred']].to_numpy(np.float32), pred_Nx2)
  # Written under a temporary name and renamed: nothing else is left.
  assert sorted(os.listdir(tmp_path)) == sorted([f'in{suffix}',
                                                 f'pred{suffix}'])


def test_predictions_without_kept_columns(tmp_path):
  out = tmp_path / 'pred.csv'
  predict.write_predictions(str(out), np.array([[1.5], [-2.0]], np.float32),
                            ('price',))
  assert out.read_text() == 'price_pred\n1.5\n-2.0\n'


def test_writer_refuses_a_clashing_column_and_a_missing_directory(
    tmp_path):
  clash = pd.DataFrame({'y_pred': np.zeros(5)})
  with pytest.raises(UsageError, match='cannot keep column'):
    predict.write_predictions(str(tmp_path / 'p.csv'),
                              np.zeros((5, 1), np.float32), ('y',), clash)
  with pytest.raises(UsageError, match='does not exist; create it first'):
    predict.write_predictions(str(tmp_path / 'no' / 'p.csv'),
                              np.zeros((5, 1), np.float32), ('y',))


_IDS = ['00123', 'NA', 'null', 'nan', 'None', '', '1e5', ' 7', '1.50', 'a,b']


@pytest.mark.parametrize('suffix', ['.csv', '.parquet'])
def test_kept_csv_cells_are_copied_byte_for_byte(tmp_path, suffix):
  path = tmp_path / 'in.csv'
  path.write_text('id,n,y\n' + ''.join(
      f'{c if "," not in c else chr(34) + c + chr(34)},{i},1\n'
      for i, c in enumerate(_IDS)))
  path.write_text(path.read_text().replace(',4,1\n', ',,1\n'))  # a gap
  keep = table_files.pass_through(table_files.read_frame(str(path)),
                                  ['n', 'id'], str(path))
  out = str(tmp_path / f'pred{suffix}')
  predict.write_predictions(out, np.zeros((len(_IDS), 1), np.float32),
                            ('y',), keep)
  if suffix == '.csv':
    written = pd.read_csv(out, dtype=str, keep_default_na=False)
  else:
    written = pd.read_parquet(out)
  assert written['id'].tolist() == _IDS
  assert written['n'].tolist() == [str(i) if i != 4 else ''
                                   for i in range(len(_IDS))]


@pytest.mark.parametrize('suffix', ['.csv', '.parquet'])
def test_kept_parquet_columns_keep_their_values_and_types(tmp_path, suffix):
  frame = pd.DataFrame({'id': pd.array([7, None, 123456789012345678],
                                       'Int64'),
                        'code': ['00123', 'NA', None], 'y': [1.0, 2, 3]})
  path = str(tmp_path / 'in.parquet')
  frame.to_parquet(path, index=False)
  keep = table_files.pass_through(table_files.read_frame(path),
                                  ['id', 'code'], path)
  out = str(tmp_path / f'pred{suffix}')
  predict.write_predictions(out, np.zeros((3, 1), np.float32), ('y',), keep)
  if suffix == '.parquet':
    import pyarrow.parquet as pq  # noqa: PLC0415
    written = pq.read_table(out)
    assert str(written.schema.field('id').type) == 'int64'
    assert written.column('id').to_pylist() == [7, None, 123456789012345678]
    assert written.column('code').to_pylist() == ['00123', 'NA', None]
  else:
    written = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert written['id'].tolist() == ['7', '', '123456789012345678']
    assert written['code'].tolist() == ['00123', 'NA', '']
