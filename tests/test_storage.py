"""The file layer on a local directory and on a GCS emulator, side by side.

Every operation runs on both (`root` is a local tmp dir or a gs:// prefix);
the gs:// tests also show that Orbax, TensorBoard's reader and a SavedModel
work with the same emulator.
"""

import concurrent.futures
import json
import stat
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from meshfit import storage


@pytest.fixture(params=['local', 'gcs'])
def root(request, tmp_path) -> str:
  """A fresh directory: local, or a prefix in the emulator's bucket."""
  if request.param == 'local':
    return str(tmp_path)
  return request.getfixturevalue('gcs_dir')


def _write(path: str, data: bytes) -> None:
  storage.makedirs(storage.dirname(path))  # as a local writer must
  with storage.open(path, 'wb') as f:
    f.write(data)


def test_paths_without_touching_storage(tmp_path, monkeypatch):
  assert storage.join('gs://b/run', 'checkpoints', '7') == (
      'gs://b/run/checkpoints/7')
  assert storage.basename('gs://b/run/metrics.jsonl') == 'metrics.jsonl'
  assert storage.dirname('gs://b/run/metrics.jsonl') == 'gs://b/run'
  assert storage.dirname('gs://b/run/') == 'gs://b'
  assert storage.dirname('gs://b') == 'gs://b'
  assert storage.absolute('gs://b/x') == 'gs://b/x'
  monkeypatch.chdir(tmp_path)
  assert storage.absolute('x') == os.path.join(str(tmp_path), 'x')
  assert storage.is_remote('gs://b/x') and not storage.is_remote('/x')
  assert not storage.is_remote('gs:')  # a local name, as before


@pytest.mark.parametrize('url', ['s4://bucket/x', 'S3://bucket/x'])
def test_unknown_scheme_is_one_line_naming_url_and_known_schemes(url):
  with pytest.raises(storage.StorageError) as e:
    storage.exists(url)
  message = str(e.value)
  assert url in message and 'gs://' in message and '\n' not in message


def test_url_without_bucket():
  with pytest.raises(storage.StorageError, match='no bucket'):
    storage.exists('gs:///x')


def test_round_trip_and_queries(root):
  text = storage.join(root, 'run', 'config.json')
  blob = storage.join(root, 'run', 'sub', 'data.bin')
  storage.makedirs(storage.join(root, 'run', 'sub'))
  with storage.open(text, 'w') as f:
    f.write('{"ünïcode": 1}')
  _write(blob, bytes(range(256)))
  assert storage.read_text(text) == '{"ünïcode": 1}'
  assert storage.read_bytes(blob) == bytes(range(256))
  assert storage.size(blob) == 256
  assert storage.size(text) == len('{"ünïcode": 1}'.encode())
  assert storage.exists(text) and storage.isfile(text)
  assert not storage.isdir(text)
  run = storage.join(root, 'run')
  assert storage.isdir(run) and not storage.isfile(run)
  assert storage.listdir(run) == ['config.json', 'sub']
  assert not storage.exists(storage.join(root, 'nothing'))
  with pytest.raises(FileNotFoundError):
    storage.read_bytes(storage.join(root, 'nothing'))
  with pytest.raises(FileNotFoundError):
    storage.size(storage.join(root, 'nothing'))
  storage.remove(blob)
  assert not storage.exists(blob)
  with pytest.raises(FileNotFoundError):
    storage.remove(blob)
  storage.rmtree(run)
  assert not storage.exists(text)


def test_glob_is_sorted_and_empty_when_nothing_matches(root):
  for name in ['part-2.csv', 'part-10.csv', 'part-1.csv', 'other.txt']:
    _write(storage.join(root, 'tables', name), b'x')
  _write(storage.join(root, 'tables', 'deep', 'part-3.csv'), b'x')
  found = storage.glob(storage.join(root, 'tables', 'part-*.csv'))
  assert found == [storage.join(root, 'tables', n) for n in
                   ['part-1.csv', 'part-10.csv', 'part-2.csv']]
  deep = storage.glob(storage.join(root, 'tables', '**', '*.csv'))
  assert storage.join(root, 'tables', 'deep', 'part-3.csv') in deep
  assert storage.glob(storage.join(root, 'tables', '*.parquet')) == []


def test_ranged_reads_from_threads(root):
  rows_RxC = np.arange(10_000 * 20, dtype=np.float32).reshape(10_000, 20)
  path = storage.join(root, 'prepared', 'part-0.f32')
  _write(path, rows_RxC.tobytes())
  row_bytes = 20 * 4
  with storage.RangeReader(path) as reader:
    assert reader.size == rows_RxC.nbytes

    def block(start: int) -> np.ndarray:
      data = reader.read_at(start * row_bytes, 500 * row_bytes)
      return np.frombuffer(data, np.float32).reshape(-1, 20)

    starts = list(range(0, 10_000, 500))[::-1]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
      blocks = list(pool.map(block, starts))
    for start, got in zip(starts, blocks):
      np.testing.assert_array_equal(got, rows_RxC[start:start + 500])
    # Past the end: what there is, then nothing.
    assert len(reader.read_at(rows_RxC.nbytes - 8, 100)) == 8
    assert reader.read_at(rows_RxC.nbytes, 100) == b''
  assert storage.read_range(path, 4, 4) == rows_RxC[0, 1].tobytes()


def test_atomic_write_keeps_old_content_on_exception(root):
  path = storage.join(root, 'eval', 'step_10.json')
  storage.makedirs(storage.dirname(path))
  with storage.atomic_write(path) as f:
    json.dump({'rmse': 1.5}, f)
  with pytest.raises(RuntimeError, match='mid-write'):
    with storage.atomic_write(path) as f:
      f.write('{"rmse": 2')
      raise RuntimeError('mid-write')
  assert json.loads(storage.read_text(path)) == {'rmse': 1.5}
  # No temporary file left beside it, nor a partial object.
  assert storage.listdir(storage.dirname(path)) == ['step_10.json']
  with storage.atomic_write(path, 'wb') as f:
    f.write(b'{"rmse": 0.5}')
  assert json.loads(storage.read_text(path)) == {'rmse': 0.5}


def test_atomic_write_keeps_the_extension_for_writers_that_read_it(root):
  path = storage.join(root, 'plot.png')
  with storage.atomic_write(path, 'wb') as f:
    assert f.name.endswith('.png')
    f.write(b'png')
  assert storage.read_bytes(path) == b'png'


def test_append_writer_records_visible_after_flush_and_resumed(root):
  path = storage.join(root, 'metrics.jsonl')
  writer = storage.AppendWriter(path)
  assert storage.exists(path)  # created at once, as `open(.., 'ab')` does
  writer.write(b'{"step": 1}\n')
  writer.flush()
  assert storage.read_bytes(path) == b'{"step": 1}\n'
  writer.write(b'{"step": 2}\n')
  writer.close()
  writer.close()  # twice is harmless
  with pytest.raises(ValueError):
    writer.write(b'late')
  # A resumed run appends to what is there.
  with storage.AppendWriter(path) as again:
    again.write(b'{"step": 3}\n')
  lines = storage.read_text(path).splitlines()
  assert [json.loads(x)['step'] for x in lines] == [1, 2, 3]


def test_create_exclusive_refuses_a_second_creator(root):
  path = storage.join(root, 'lock')
  assert storage.create_exclusive(path, '{"pid": 1}')
  assert not storage.create_exclusive(path, '{"pid": 2}')
  assert json.loads(storage.read_text(path)) == {'pid': 1}
  storage.remove(path)  # a stale lock taken over
  assert storage.create_exclusive(path, b'{"pid": 3}')
  assert json.loads(storage.read_text(path)) == {'pid': 3}


def test_create_exclusive_under_contention_has_one_winner(root):
  path = storage.join(root, 'lock')
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    won = list(pool.map(lambda i: storage.create_exclusive(path, str(i)),
                        range(8)))
  assert sum(won) == 1
  assert storage.read_text(path) == str(won.index(True))


def test_move_directory_tree(root):
  src = storage.join(root, 'checkpoints', '20')
  files = {'commit_success.txt': b'ok', 'state/a': b'1' * 1000,
           'state/d/b': b'2', 'meta/c': b'3'}
  for rel, data in files.items():
    _write(storage.join(src, *rel.split('/')), data)
  dst = storage.join(root, 'damaged_checkpoints', '20')
  storage.move(src, dst)
  assert not storage.exists(src)
  for rel, data in files.items():
    assert storage.read_bytes(storage.join(dst, *rel.split('/'))) == data
  # Never over an existing destination.
  _write(storage.join(src, 'x'), b'new')
  with pytest.raises(FileExistsError):
    storage.move(src, dst)
  assert storage.read_bytes(storage.join(src, 'x')) == b'new'
  # One file moves too.
  storage.move(storage.join(src, 'x'), storage.join(root, 'y'))
  assert storage.read_bytes(storage.join(root, 'y')) == b'new'


def test_list_files_walks_the_tree(root):
  for rel in ('b', 'a/c', 'a/d/e'):
    _write(storage.join(root, 'tree', *rel.split('/')), b'x')
  assert storage.list_files(storage.join(root, 'tree')) == ['a/c', 'a/d/e',
                                                            'b']
  assert storage.list_files(storage.join(root, 'none')) == []


def test_rename_publishes_a_directory_but_never_over_files(root):
  src, dst = storage.join(root, '.out.tmp'), storage.join(root, 'out')
  _write(storage.join(src, 'sub', 'a'), b'1')
  storage.makedirs(dst)  # an empty directory is replaced (locally)
  storage.rename(src, dst)
  assert not storage.exists(src)
  assert storage.read_bytes(storage.join(dst, 'sub', 'a')) == b'1'
  _write(storage.join(src, 'b'), b'2')
  with pytest.raises(OSError):  # `out` has a file in it now
    storage.rename(src, dst)
  assert storage.list_files(dst) == ['sub/a']
  assert storage.read_bytes(storage.join(src, 'b')) == b'2'


def test_copytree_copies_the_file_named_last_after_the_others(
    tmp_path, monkeypatch):
  for rel in ('a.json', 'model.json', 'z/b'):
    (tmp_path / 'src' / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / 'src' / rel).write_bytes(b'x')
  copied = []
  copy = storage.files._copy_file
  monkeypatch.setattr(storage.files, '_copy_file',
                      lambda a, b: (copied.append(b), copy(a, b)))
  storage.copytree(str(tmp_path / 'src'), str(tmp_path / 'dst'),
                   last='model.json')
  assert [os.path.relpath(c, tmp_path / 'dst') for c in copied] == [
      'a.json', os.path.join('z', 'b'), 'model.json']


def test_copytree_between_local_and_gcs(tmp_path, gcs_dir):
  local = tmp_path / 'export'
  (local / 'variables').mkdir(parents=True)
  (local / 'saved_model.pb').write_bytes(b'pb')
  (local / 'variables' / 'variables.index').write_bytes(b'ix')
  storage.copytree(str(local), storage.join(gcs_dir, 'export'))
  assert storage.listdir(storage.join(gcs_dir, 'export')) == [
      'saved_model.pb', 'variables']
  back = tmp_path / 'back'
  storage.copytree(storage.join(gcs_dir, 'export'), str(back))
  assert (back / 'variables' / 'variables.index').read_bytes() == b'ix'
  with pytest.raises(FileNotFoundError):
    storage.copytree(storage.join(gcs_dir, 'none'), str(tmp_path / 'n'))


def test_missing_bucket(gcs_emulator_url):
  del gcs_emulator_url
  for call in [lambda: storage.read_bytes('gs://no-such-bucket/a.csv'),
               lambda: _write('gs://no-such-bucket/a.csv', b'x'),
               lambda: storage.create_exclusive('gs://no-such-bucket/l', '')]:
    with pytest.raises(storage.StorageError,
                       match='^gs://no-such-bucket/.*: bucket '
                             'gs://no-such-bucket does not exist$'):
      call()


def test_no_credentials(gcs_emulator_url, monkeypatch):
  """Without the emulator the layer asks for ADC, which are missing here."""
  del gcs_emulator_url
  monkeypatch.delenv('STORAGE_EMULATOR_HOST')
  monkeypatch.setenv('GOOGLE_APPLICATION_CREDENTIALS', '/nonexistent.json')
  with pytest.raises(storage.StorageError,
                     match='no Google credentials.*application-default'):
    storage.exists('gs://meshfit-test/x')


@pytest.mark.parametrize('status,expected', [
    (403, 'permission denied'), (401, 'not authorised')])
def test_refusals_of_real_gcs_are_one_line(status, expected):
  # The emulator lets everyone in; these are the exceptions gcsfs raises
  # for GCS's answers.
  from gcsfs.retry import validate_response  # noqa: PLC0415
  from meshfit.storage import gcs  # noqa: PLC0415
  url = 'gs://bucket/run/config.json'
  body = json.dumps({'error': {'code': status, 'message': 'caller lacks '
                               'storage.objects.get'}}).encode()
  with pytest.raises(Exception) as raised:
    validate_response(status, body, 'bucket/run/config.json')
  error = gcs.translate(url, raised.value)
  assert isinstance(error, storage.StorageError)
  assert expected in str(error) and url in str(error)
  assert '\n' not in str(error)


def test_after_a_network_error_the_endpoint_fails_fast(gcs_emulator_url,
                                                       monkeypatch):
  # gcsfs's own retries (6 tries, ~32 s) are waited out, once, by
  # test_gcs_runs.py's run whose network is cut; here the state they leave.
  del gcs_emulator_url  # the emulator running is what the test needs
  from meshfit.storage import environment, gcs  # noqa: PLC0415
  monkeypatch.setattr(gcs, '_unreachable', {
      environment.emulator_url(): (time.monotonic(), 'ClientConnectorError: '
                                   'Cannot connect')})
  start = time.monotonic()
  with pytest.raises(storage.StorageError, match='^gs://meshfit-test/y: '
                     'network error, not retried'):
    storage.exists('gs://meshfit-test/y')
  assert time.monotonic() - start < 1
  monkeypatch.setattr(gcs, '_unreachable', {
      environment.emulator_url(): (time.monotonic() - gcs.FAIL_FAST_SECONDS,
                                   'long ago')})
  assert storage.exists('gs://meshfit-test') is True


def test_orbax_checkpoint_manager_on_gcs(gcs_dir):
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  import orbax.checkpoint as ocp  # noqa: PLC0415
  directory = storage.join(gcs_dir, 'checkpoints')
  state = {'w': jnp.arange(24, dtype=jnp.float32).reshape(4, 6),
           'b': jnp.ones(6, jnp.bfloat16), 'step': jnp.int32(7)}

  def manager(read_only: bool) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(directory, options=(
        ocp.CheckpointManagerOptions(create=not read_only,
                                     read_only=read_only,
                                     max_to_keep=2,
                                     enable_async_checkpointing=True)),
        item_names=('state', 'meta'))

  with manager(read_only=False) as writer:
    for step in (1, 2, 3):
      writer.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          meta=ocp.args.JsonSave({'step': step})), force=True)
    writer.wait_until_finished()
  assert storage.listdir(directory) == ['2', '3']
  assert storage.exists(storage.join(directory, '3', 'commit_success.txt'))
  with manager(read_only=True) as reader:
    assert reader.all_steps() == [2, 3]
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    restored = reader.restore(3, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target),
        meta=ocp.args.JsonRestore()))
  assert restored.meta == {'step': 3}
  for name, value in state.items():
    assert restored.state[name].dtype == value.dtype
    np.testing.assert_array_equal(restored.state[name], value)
  # A damaged checkpoint is set aside by the layer, then no longer a step.
  storage.move(storage.join(directory, '3'),
               storage.join(gcs_dir, 'damaged_checkpoints', '3'))
  with manager(read_only=True) as reader:
    assert reader.all_steps() == [2]


def test_tensorboard_reader_reads_events_written_to_gcs(gcs_dir):
  from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa
  from tensorboard.summary.writer.record_writer import RecordWriter  # noqa
  from tensorboard.util import tensor_util  # noqa: PLC0415
  logdir = storage.join(gcs_dir, 'train')
  path = storage.join(logdir, 'events.out.tfevents.1.host.1.0')
  records = RecordWriter(storage.AppendWriter(path))
  records.write(event_pb2.Event(wall_time=1.0,
                                file_version='brain.Event:2')
                .SerializeToString())
  for step, loss in [(10, 0.5), (20, 0.25)]:
    value = summary_pb2.Summary.Value(
        tag='loss', tensor=tensor_util.make_tensor_proto(np.float32(loss)))
    value.metadata.plugin_data.plugin_name = 'scalars'
    records.write(event_pb2.Event(
        wall_time=2.0, step=step,
        summary=summary_pb2.Summary(value=[value])).SerializeToString())
  records.flush()
  # TensorBoard on a host without TensorFlow reads gs:// through fsspec
  # (gcsfs), which honours the emulator; with TensorFlow installed it uses
  # tf.io.gfile, whose GCS endpoint is compiled in. `notf` is TensorBoard's
  # own switch to the former.
  script = textwrap.dedent(f"""
      import sys, types
      sys.modules['tensorboard.compat.notf'] = types.ModuleType('notf')
      from tensorboard.backend.event_processing import event_accumulator
      acc = event_accumulator.EventAccumulator({logdir!r})
      acc.Reload()
      print([(e.step, float(__import__('tensorboard.util.tensor_util',
             fromlist=['x']).make_ndarray(e.tensor_proto)))
             for e in acc.Tensors('loss')])
      """)
  out = subprocess.run([sys.executable, '-c', script], capture_output=True,
                       text=True, timeout=120, check=True).stdout
  assert out.strip().splitlines()[-1] == '[(10, 0.5), (20, 0.25)]'
  records.close()


def test_saved_model_through_gcs(tmp_path, gcs_dir):
  """Exported locally, uploaded, downloaded, loaded: what TF allows here."""
  tf = pytest.importorskip('tensorflow')
  module = tf.Module()
  module.scale = tf.Variable(3.0)
  module.f = tf.function(lambda x: x * module.scale,
                         input_signature=[tf.TensorSpec([None], tf.float32)])
  tf.saved_model.save(module, str(tmp_path / 'export'))
  url = storage.join(gcs_dir, 'export', 'saved_model')
  storage.copytree(str(tmp_path / 'export'), url)
  assert 'saved_model.pb' in storage.listdir(url)
  storage.copytree(url, str(tmp_path / 'downloaded'))
  loaded = tf.saved_model.load(str(tmp_path / 'downloaded'))
  np.testing.assert_allclose(loaded.f(tf.constant([1.0, 2.0])).numpy(),
                             [3.0, 6.0])


# -- local writes onto what is not a plain new file ------------------------

def test_atomic_write_writes_into_a_fifo_and_leaves_it_one(tmp_path):
  fifo = str(tmp_path / 'out.csv')
  os.mkfifo(fifo)
  # A reader already there: the writer's open does not wait, and what is
  # written stays in the pipe after the writer closes it.
  reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
  try:
    with storage.atomic_write(fifo) as f:
      f.write('a,b\n1,2\n')
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert os.read(reader, 1000) == b'a,b\n1,2\n'
  finally:
    os.close(reader)
  assert os.listdir(tmp_path) == ['out.csv']


@pytest.mark.skipif(os.geteuid() != 0, reason='mknod needs root')
def test_atomic_write_writes_into_a_device_and_leaves_it_one(tmp_path):
  null = str(tmp_path / 'null')
  os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # as /dev/null
  with storage.atomic_write(null, 'wb') as f:
    f.write(b'x' * 100)
  assert stat.S_ISCHR(os.lstat(null).st_mode)
  assert os.listdir(tmp_path) == ['null']


def test_atomic_write_through_a_symlink_replaces_the_file_it_names(tmp_path):
  target = tmp_path / 'kept' / 'pred.csv'
  target.parent.mkdir()
  target.write_text('old')
  link = tmp_path / 'pred.csv'
  link.symlink_to(target)
  with storage.atomic_write(str(link)) as f:
    f.write('new')
  assert link.is_symlink() and target.read_text() == 'new'
  assert sorted(os.listdir(tmp_path)) == ['kept', 'pred.csv']
  assert os.listdir(target.parent) == ['pred.csv']


def test_atomic_write_of_a_name_as_long_as_the_file_system_allows(tmp_path):
  path = str(tmp_path / ('p' * 251 + '.csv'))  # 255 bytes, the limit
  with storage.atomic_write(path) as f:
    f.write('a\n')
  assert os.listdir(tmp_path) == [os.path.basename(path)]


@pytest.fixture
def small_disk(tmp_path):
  """A 256 KiB tmpfs (root only), unmounted after the test."""
  mount = tmp_path / 'disk'
  mount.mkdir()
  proc = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=256k', 'tmpfs',
                         str(mount)], capture_output=True)
  if proc.returncode != 0:
    pytest.skip(f'cannot mount a tmpfs: {proc.stderr.decode()[:200]}')
  yield mount
  subprocess.run(['umount', str(mount)], check=True)


def test_atomic_write_on_a_full_disk_says_so_and_keeps_the_old_file(
    small_disk):
  path = small_disk / 'pred.csv'
  path.write_text('old')
  with pytest.raises(storage.StorageError) as e:
    with storage.atomic_write(str(path), 'wb') as f:
      f.write(b'x' * 1024 * 1024)
  assert str(path) in str(e.value) and 'No space left' in str(e.value)
  assert path.read_text() == 'old'
  assert os.listdir(small_disk) == ['pred.csv']


def test_sigterm_during_atomic_write_leaves_no_temporary_file(tmp_path):
  path = str(tmp_path / 'out.csv')
  code = textwrap.dedent(f'''
      import os, signal, storage
      with storage.atomic_write({path!r}) as f:
        f.write('a\\n')
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10 ** 6):
          f.write('b\\n')
      ''')
  proc = subprocess.run([sys.executable, '-c', code], capture_output=True,
                        text=True, timeout=60,
                        cwd=os.path.dirname(os.path.dirname(__file__)))
  assert proc.returncode in (143, -15), proc.stderr[-2000:]
  assert os.listdir(tmp_path) == []


def test_the_emulator_on_a_busy_port_is_one_error_line(gcs_emulator_url):
  port = gcs_emulator_url.rsplit(':', 1)[1]  # another emulator's
  proc = subprocess.run(
      [sys.executable, '-m', 'meshfit.storage.emulator', f'--port={port}'],
      capture_output=True, text=True, timeout=60,
      cwd=os.path.dirname(os.path.dirname(__file__)))
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert 'Traceback' not in proc.stderr
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and f'port {port}' in last, last
