"""A trained run used as a hostile but fair user would: its config.json
edited, its checkpoint meta from another meshfit, outputs through symlinks
and onto devices, writes that fail, and a trainer rotating checkpoints
under a reader. Each must end in a clear `error:` line (exit 2) or work,
never in a traceback or a changed run."""

import functools
import json
import os
import shutil
import stat
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from cli_helpers import ROOT, run_train
from meshfit.checkpoints import checkpointer, reading
from meshfit.config import json_files
from meshfit.errors import UsageError
from meshfit.serve import predict

# Every test here trains or runs train.py: left out of `make test-fast`.
pytestmark = pytest.mark.slow

run = functools.partial(run_train, devices=4)


def _table(n: int, seed: int) -> pd.DataFrame:
  """Numbers a and b, text cat, target y."""
  rng = np.random.default_rng(seed)
  a, b = rng.normal(size=(2, n))
  cat = rng.choice(['red', 'green', 'blue'], n)
  return pd.DataFrame({'a': a, 'b': b, 'cat': cat,
                       'y': 3 * a - 2 * b + 1.5 * (cat == 'red')})


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """(directory, workdir): configs/csv.py on a 300-row table, 40 steps,
  checkpoints of steps 20 and 40; rows.csv holds 7 rows to predict and
  reference.csv their predictions by the untouched run."""
  tmp = tmp_path_factory.mktemp('guards')
  _table(300, 0).to_csv(tmp / 't.csv', index=False)
  _table(7, 1).to_csv(tmp / 'rows.csv', index=False)
  workdir = str(tmp / 'run')
  run('--config=configs/csv.py', f'--workdir={workdir}',
      f'--config.dataset.train_path={tmp}/t.csv',
      "--config.dataset.target_columns=('y',)",
      '--config.num_train_steps=40', '--config.checkpoint_every_steps=20',
      check=0)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == [
      '20', '40']
  run('--mode=predict', f'--workdir={workdir}', f'--input={tmp}/rows.csv',
      f'--output={tmp}/reference.csv', check=0)
  return tmp, workdir


def _copy(workdir: str, tmp_path) -> str:
  """A copy of the run that a test may spoil."""
  copy = str(tmp_path / 'run')
  shutil.copytree(workdir, copy, symlinks=True)
  return copy


def _tree(path: str) -> dict[str, bytes]:
  """Every file under `path` with its bytes: to show nothing changed."""
  out = {}
  for root, _, files in os.walk(path):
    for f in files:
      with open(os.path.join(root, f), 'rb') as handle:
        out[os.path.relpath(os.path.join(root, f), path)] = handle.read()
  return out


def _assert_usage_error(proc, *fragments: str) -> str:
  """Exit 2, one `error:` line holding every fragment, no traceback."""
  assert proc.returncode == 2, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('error: '), proc.stderr[-3000:]
  assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  assert proc.stderr.count('error: ') == 1, proc.stderr[-3000:]
  for fragment in fragments:
    assert fragment in last, last
  return last


def _predict_in_process(workdir: str, tmp, output: str, step=None) -> dict:
  """What --mode=predict does, in this process (no interpreter start)."""
  config = json_files.load_json(os.path.join(workdir, 'config.json'))
  return predict.predict(config, workdir, str(tmp / 'rows.csv'), output,
                         step)


def _edit_json(path: str, edit) -> None:
  with open(path, encoding='utf-8') as f:
    data = json.load(f)
  data = edit(data)
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(data, f)


# -- config.json against the checkpoint's own record ----------------------

@pytest.mark.parametrize('key, value', [
    ('activation', 'gelu'), ('dtype', 'bfloat16'), ('hidden_sizes', [16]),
    ('likelihood', 'gaussian')])
def test_an_edited_config_json_does_not_change_the_model(
    trained, tmp_path, absl_caplog, key, value):
  tmp, workdir = trained
  copy = _copy(workdir, tmp_path)

  def edit(config):
    config['model'][key] = value
    return config
  _edit_json(os.path.join(copy, 'config.json'), edit)
  out = str(tmp_path / 'pred.csv')
  _predict_in_process(copy, tmp, out)
  reference = pd.read_csv(tmp / 'reference.csv')
  np.testing.assert_array_equal(pd.read_csv(out).to_numpy(),
                                reference.to_numpy())
  warned = [r.getMessage() for r in absl_caplog.records
            if f'model.{key}' in r.getMessage()]
  assert warned and 'checkpoint' in warned[0], absl_caplog.text[-2000:]


def test_export_writes_the_checkpoints_model_not_config_jsons(
    trained, tmp_path):
  import jax  # noqa: PLC0415
  tmp, workdir = trained
  copy = _copy(workdir, tmp_path)

  def edit(config):
    config['model']['activation'] = 'gelu'
    return config
  _edit_json(os.path.join(copy, 'config.json'), edit)
  out = tmp_path / 'export'
  run('--mode=export', f'--workdir={copy}', f'--output={out}', check=0)
  with open(out / 'model.json', encoding='utf-8') as f:
    card = json.load(f)
  assert card['model']['activation'] == 'relu'
  with open(out / card['jax_export']['file'], 'rb') as f:
    exported = jax.export.deserialize(bytearray(f.read()))
  rows = pd.read_csv(tmp / 'rows.csv')
  codes = {v: 2 + i for i, v in enumerate(
      next(c for c in card['features'] if c['name'] == 'cat')['vocabulary'])}
  columns = {'a': rows['a'], 'b': rows['b'],
             'cat': rows['cat'].map(codes)}
  x_NxF = np.stack([columns[name].to_numpy(np.float32)
                    for name in card['jax_export']['inputs']], axis=1)
  got = np.asarray(exported.call(x_NxF))[:, 0]
  want = pd.read_csv(tmp / 'reference.csv')['y_pred'].to_numpy(np.float32)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('content', ['[]', 'null', '{"model": 5}', '"run"',
                                     '{"dataset": []}'])
def test_a_config_json_that_is_no_config_is_named(tmp_path, content):
  path = tmp_path / 'config.json'
  path.write_text(content)
  with pytest.raises(UsageError, match='config.json') as e:
    json_files.load_json(str(path))
  assert 'checkpoint' not in str(e.value)


def test_a_config_json_of_null_exits_2_naming_it(trained, tmp_path):
  tmp, workdir = trained
  copy = _copy(workdir, tmp_path)
  with open(os.path.join(copy, 'config.json'), 'w') as f:
    f.write('null')
  before = _tree(copy)
  _assert_usage_error(
      run('--mode=predict', f'--workdir={copy}', f'--input={tmp}/rows.csv',
          f'--output={tmp_path}/pred.csv'), 'config.json')
  assert _tree(copy) == before


def _meta_path(workdir: str, step: int) -> str:
  return os.path.join(workdir, 'checkpoints', str(step), 'meta', 'metadata')


@pytest.mark.parametrize('case', [
    'layout_extra', 'layout_missing', 'no_layout', 'column_extra',
    'column_missing', 'no_config', 'config_not_a_dict', 'meta_extra'])
def test_a_meta_of_another_meshfit_is_named_not_called_damaged(
    trained, tmp_path, case):
  _, workdir = trained
  copy = _copy(workdir, tmp_path)

  def edit(meta):
    if case == 'layout_extra':
      meta['layout']['hashed_columns'] = [3]
    elif case == 'layout_missing':
      del meta['layout']['scaling']
    elif case == 'no_layout':
      del meta['layout']
    elif case == 'column_extra':
      meta['column_plan']['features'][0]['unit'] = 'kg'
    elif case == 'column_missing':
      del meta['column_plan']['features'][0]['kind']
    elif case == 'no_config':
      del meta['config']
    elif case == 'config_not_a_dict':
      meta['config'] = 7
    elif case == 'meta_extra':  # a field this meshfit need not read
      meta['provenance'] = {'host': 'x'}
    return meta
  for step in (20, 40):
    _edit_json(_meta_path(copy, step), edit)
  if case == 'meta_extra':
    with reading.SavedModel(copy) as saved:
      assert saved.step == 40
    return
  with pytest.raises(UsageError) as e:
    reading.SavedModel(copy).close()
  message = str(e.value)
  assert 'another meshfit' in message and 'step 40' in message, message
  assert 'cannot be read' not in message and '--step' not in message


# -- a trainer rotating checkpoints under a reader -------------------------

def _deleting_on_first_read(monkeypatch, method: str, copy: str) -> list:
  """Makes the first `method` call of a read-only Checkpointer delete the
  step it was asked for first, as a trainer's rotation does between a
  reader's choice of a step and its read."""
  deleted = []
  original = getattr(checkpointer.Checkpointer, method)

  def reading_a_rotated_step(self, step, *args):
    if not deleted:
      shutil.rmtree(os.path.join(copy, 'checkpoints', str(step)))
      deleted.append(step)
    return original(self, step, *args)
  monkeypatch.setattr(checkpointer.Checkpointer, method,
                      reading_a_rotated_step)
  return deleted


@pytest.mark.parametrize('method', ['restore_meta', 'restore_state'])
def test_predict_reads_the_next_checkpoint_when_rotation_deletes_its_step(
    trained, tmp_path, monkeypatch, method):
  tmp, workdir = trained
  copy = _copy(workdir, tmp_path)
  deleted = _deleting_on_first_read(monkeypatch, method, copy)
  out = str(tmp_path / 'pred.csv')
  result = _predict_in_process(copy, tmp, out)
  assert deleted == [40]
  assert result['step'] == 20
  assert len(pd.read_csv(out)) == 7


def test_a_named_step_deleted_while_read_says_a_trainer_rotates(
    trained, tmp_path, monkeypatch):
  tmp, workdir = trained
  copy = _copy(workdir, tmp_path)
  _deleting_on_first_read(monkeypatch, 'restore_state', copy)
  with pytest.raises(UsageError) as e:
    _predict_in_process(copy, tmp, str(tmp_path / 'pred.csv'), step=20)
  message = str(e.value)
  assert 'step 20' in message and 'deleted' in message, message
  assert 'cannot be read' not in message
  assert not os.path.exists(tmp_path / 'pred.csv')


# -- outputs through symlinks, onto devices and FIFOs ----------------------

@pytest.mark.parametrize('case', [
    'alias_config', 'alias_checkpoint', 'link_to_config', 'input_by_parent',
    'workdir_by_alias'])
def test_a_symlink_does_not_lead_predict_around_the_output_guards(
    trained, tmp_path, case):
  tmp, workdir = trained
  copy = _copy(workdir, tmp_path)
  alias = tmp_path / 'alias'
  alias.symlink_to(copy)
  shutil.copy(tmp / 'rows.csv', tmp_path / 'rows.csv')
  here = tmp_path / 'here'
  here.symlink_to(tmp_path)
  link = tmp_path / 'link.csv'
  link.symlink_to(os.path.join(copy, 'config.json'))
  run_dir, input_path, output = {
      'alias_config': (copy, tmp_path / 'rows.csv', alias / 'config.json'),
      'alias_checkpoint': (copy, tmp_path / 'rows.csv', alias / 'checkpoints'
                           / '40' / 'state' / 'manifest.ocdbt'),
      'link_to_config': (copy, tmp_path / 'rows.csv', link),
      'input_by_parent': (copy, tmp_path / 'rows.csv', here / 'rows.csv'),
      'workdir_by_alias': (str(alias), tmp_path / 'rows.csv',
                           os.path.join(copy, 'metrics.jsonl')),
  }[case]
  before = _tree(copy), (tmp_path / 'rows.csv').read_bytes()
  config = json_files.load_json(os.path.join(copy, 'config.json'))
  with pytest.raises(UsageError, match='--output'):
    predict.predict(config, run_dir, str(input_path), str(output))
  assert (_tree(copy), (tmp_path / 'rows.csv').read_bytes()) == before


def test_a_symlink_does_not_lead_export_into_the_run(trained, tmp_path):
  from meshfit.serve import export  # noqa: PLC0415
  _, workdir = trained
  copy = _copy(workdir, tmp_path)
  (tmp_path / 'alias').symlink_to(copy)
  before = _tree(copy)
  config = json_files.load_json(os.path.join(copy, 'config.json'))
  with pytest.raises(UsageError, match="own 'eval'"):
    export.export(config, copy, str(tmp_path / 'alias' / 'eval'))
  assert _tree(copy) == before


def test_predict_writes_into_a_fifo_a_device_and_through_a_symlink(
    trained, tmp_path):
  tmp, workdir = trained
  fifo = tmp_path / 'fifo.csv'
  os.mkfifo(fifo)
  null = tmp_path / 'null'
  os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # as /dev/null
  target = tmp_path / 'kept.csv'
  target.write_text('old')
  link = tmp_path / 'link.csv'
  link.symlink_to(target)
  # A reader already there: the writer's open does not wait, and what is
  # written stays in the pipe after the writer closes it.
  reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
  try:
    run('--mode=predict', f'--workdir={workdir}', f'--input={tmp}/rows.csv',
        f'--output={fifo}', check=0)
    written = os.read(reader, 100_000)
  finally:
    os.close(reader)
  for output in (null, link):
    _predict_in_process(workdir, tmp, str(output))
  reference = (tmp / 'reference.csv').read_bytes()
  assert written == reference
  assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
  assert stat.S_ISCHR(os.lstat(null).st_mode)
  assert link.is_symlink() and target.read_bytes() == reference
  assert sorted(os.listdir(tmp_path)) == sorted(
      ['fifo.csv', 'null', 'kept.csv', 'link.csv'])


def test_export_onto_a_device_exits_2_and_leaves_it(trained, tmp_path):
  _, workdir = trained
  null = tmp_path / 'null'
  os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
  _assert_usage_error(run('--mode=export', f'--workdir={workdir}',
                          f'--output={null}'), 'not a directory')
  assert stat.S_ISCHR(os.lstat(null).st_mode)
  assert os.listdir(tmp_path) == ['null']


# -- writes that fail ------------------------------------------------------

def _without_root_powers(*args: str) -> subprocess.CompletedProcess:
  """train.py as root without the power to write where root may not."""
  caps = '-dac_override,-dac_read_search'
  return subprocess.run(
      ['setpriv', f'--inh-caps={caps}', f'--bounding-set={caps}',
       'env', 'JAX_PLATFORMS=cpu',
       'XLA_FLAGS=--xla_force_host_platform_device_count=4',
       sys.executable, 'train.py', *args], cwd=ROOT, capture_output=True,
      text=True, timeout=300)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which('setpriv'),
                    reason='drops root powers with setpriv')
def test_an_unwritable_output_directory_is_said_before_the_work(
    trained, tmp_path):
  tmp, workdir = trained
  locked = tmp_path / 'locked'
  locked.mkdir()
  locked.chmod(0o555)
  proc = _without_root_powers('--mode=predict', f'--workdir={workdir}',
                              f'--input={tmp}/rows.csv',
                              f'--output={locked}/pred.csv')
  _assert_usage_error(proc, str(locked), 'Permission denied')
  assert 'Restor' not in proc.stderr  # refused before the checkpoint's read
  assert os.listdir(locked) == []


def test_names_as_long_as_the_file_system_allows(trained, tmp_path):
  from meshfit.serve import evaluate  # noqa: PLC0415
  tmp, workdir = trained
  copy = _copy(workdir, tmp_path)
  output = tmp_path / ('p' * 246 + '.csv')  # 250 characters
  _predict_in_process(copy, tmp, str(output))
  assert output.read_bytes() == (tmp / 'reference.csv').read_bytes()
  eval_file = tmp_path / ('e' * 231 + '.csv')  # 235 characters
  _table(50, 2).to_csv(eval_file, index=False)
  config = json_files.load_json(os.path.join(copy, 'config.json'))
  config.dataset.eval_path = str(eval_file)
  config.plots = True
  assert evaluate.evaluate(config, copy)['num_examples'] == 50
  names = os.listdir(os.path.join(copy, 'eval'))
  assert len(names) == 2 and all(len(n) <= 255 for n in names), names
  assert any(n.endswith('.json') for n in names)


def test_an_eval_that_cannot_write_leaves_no_empty_eval_dir(
    trained, tmp_path, monkeypatch):
  from meshfit import storage  # noqa: PLC0415
  from meshfit.serve import evaluate  # noqa: PLC0415
  tmp, workdir = trained
  copy = _copy(workdir, tmp_path)
  _table(50, 2).to_csv(tmp_path / 'e.csv', index=False)

  def full_disk(path, mode='w'):
    raise storage.StorageError(f'cannot write {path}: No space left on '
                               'device')
  monkeypatch.setattr(storage, 'atomic_write', full_disk)
  config = json_files.load_json(os.path.join(copy, 'config.json'))
  config.dataset.eval_path = str(tmp_path / 'e.csv')
  with pytest.raises(storage.StorageError):
    evaluate.evaluate(config, copy)
  assert not os.path.exists(os.path.join(copy, 'eval'))


@pytest.fixture
def small_disk(tmp_path):
  """mount(size) makes a tmpfs of `size` (root only); unmounted after."""
  mounts = []

  def mount(size: str):
    path = tmp_path / f'disk{len(mounts)}'
    path.mkdir()
    proc = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}',
                           'tmpfs', str(path)], capture_output=True)
    if proc.returncode != 0:
      pytest.skip(f'cannot mount a tmpfs: {proc.stderr.decode()[:200]}')
    mounts.append(path)
    return path
  yield mount
  for path in mounts:
    subprocess.run(['umount', str(path)], check=True)


def test_a_full_disk_in_predict_says_so_and_leaves_nothing(
    trained, tmp_path, small_disk):
  from meshfit import storage  # noqa: PLC0415
  tmp, workdir = trained
  disk = small_disk('16k')
  # Its predictions need more than the disk has.
  _table(5_000, 3).to_csv(tmp_path / 'many.csv', index=False)
  output = disk / 'pred.csv'
  config = json_files.load_json(os.path.join(workdir, 'config.json'))
  with pytest.raises(storage.StorageError) as e:
    predict.predict(config, workdir, str(tmp_path / 'many.csv'), str(output))
  assert str(output) in str(e.value)
  assert 'No space left on device' in str(e.value)
  assert os.listdir(disk) == []


def test_a_full_disk_in_training_is_one_error_line_and_keeps_checkpoints(
    trained, small_disk):
  tmp, _ = trained
  # Room for the first checkpoint of the run, not for the second.
  workdir = small_disk('3m') / 'run'
  proc = run('--config=configs/csv.py', f'--workdir={workdir}',
             f'--config.dataset.train_path={tmp}/t.csv',
             "--config.dataset.target_columns=('y',)",
             '--config.num_train_steps=40',
             '--config.checkpoint_every_steps=20')
  last = _assert_usage_error(proc, 'No space left on device', 'step 40',
                             'intact')
  assert 'checkpoint' in last
  assert os.path.exists(workdir / 'checkpoints' / '20' /
                        checkpointer.COMMIT_MARKER)
