"""Runs whose workdir is a gs:// URL, against a local GCS emulator.

Everything a run writes (config.json, metrics.jsonl, TensorBoard events,
checkpoints, plots, eval JSON, predictions, exports, the lock) goes to the
bucket and comes back from it: nothing is written to a local `gs:` folder.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from meshfit import storage
from cli_helpers import ROOT, free_port, run_train
from meshfit.checkpoints import reading, workdir_lock
from meshfit.errors import UsageError
from meshfit.parallel import programs
from meshfit.report import writers
from meshfit.serve import evaluate, export, predict
from meshfit.train import loop


def _untimed(records: list[dict]) -> list[dict]:
  """metrics.jsonl's records without the speeds, which vary run to run."""
  return [{k: v for k, v in r.items() if 'per_sec' not in k}
          for r in records]


def _local_and_gcs_runs(small_config, tmp_path, gcs_dir):
  local = str(tmp_path / 'local')
  loop.train_and_evaluate(small_config, local)
  remote = storage.join(gcs_dir, 'run')
  small_config.compilation_cache_dir = storage.join(gcs_dir, 'cache')
  # Runs of a process share their programs: the remote one must compile its
  # own for the bucket's cache to get them.
  programs.clear()
  final = loop.train_and_evaluate(small_config, remote)
  return local, remote, final


def _assert_tensorboard_reads_the_losses(remote: str) -> None:
  """TensorBoard reads the gs:// run's events: every logged loss."""
  expected = {r['step']: r['train/loss'] for r in writers.read_jsonl(
      storage.join(remote, 'metrics.jsonl')) if 'train/loss' in r}
  # TensorBoard's TF-free reader (fsspec, which reaches the emulator); with
  # TensorFlow, TensorBoard reads real gs:// through tf.io.gfile.
  script = textwrap.dedent(f"""
      import sys, types
      sys.modules['tensorboard.compat.notf'] = types.ModuleType('notf')
      from tensorboard.backend.event_processing import event_accumulator
      from tensorboard.util import tensor_util
      acc = event_accumulator.EventAccumulator({remote!r})
      acc.Reload()
      print({{e.step: float(tensor_util.make_ndarray(e.tensor_proto))
             for e in acc.Tensors('train/loss')}})
      """)
  out = subprocess.run([sys.executable, '-c', script], capture_output=True,
                       text=True, timeout=120, check=True).stdout
  got = eval(out.strip().splitlines()[-1])  # noqa: S307 (our own dict)
  assert got.keys() == expected.keys()
  for step, loss in expected.items():
    assert got[step] == pytest.approx(loss, rel=1e-6)  # stored as float32


@pytest.mark.slow
def test_a_gcs_workdir_trains_as_a_local_one_and_serves(small_config,
                                                         tmp_path, gcs_dir,
                                                         monkeypatch):
  monkeypatch.chdir(tmp_path)  # a stray local `gs:` folder would land here
  small_config.plots = True
  local, remote, final = _local_and_gcs_runs(small_config, tmp_path, gcs_dir)
  assert not os.path.exists(tmp_path / 'gs:')
  names = storage.listdir(remote)
  for name in ('config.json', 'metrics.jsonl', 'checkpoints',
               'loss_curve.png'):
    assert name in names, names
  assert any(n.startswith('events.out.tfevents.') for n in names), names
  assert 'lock' not in names  # released at the end
  # The same records, bit for bit, as the same run on local disk.
  assert (_untimed(writers.read_jsonl(storage.join(remote, 'metrics.jsonl')))
          == _untimed(writers.read_jsonl(os.path.join(local,
                                                      'metrics.jsonl'))))
  assert storage.listdir(storage.join(remote, 'checkpoints')) == sorted(
      os.listdir(os.path.join(local, 'checkpoints')))
  # JAX's compilation cache went to the bucket too.
  assert storage.listdir(storage.join(gcs_dir, 'cache'))
  _assert_tensorboard_reads_the_losses(remote)

  result = evaluate.evaluate(small_config, remote)
  assert result['rmse'] == final['rmse']
  assert storage.isfile(storage.join(remote, 'eval',
                                     f'step_{result["step"]}.json'))

  rng = np.random.default_rng(0)
  with reading.SavedModel(remote) as saved:
    features = saved.plan.feature_names
  rows = str(tmp_path / 'rows.csv')
  with open(rows, 'w', encoding='utf-8') as f:
    f.write(','.join(features) + '\n')
    for row in rng.normal(size=(5, len(features))):
      f.write(','.join(f'{v:.6f}' for v in row) + '\n')
  out = storage.join(gcs_dir, 'out', 'predictions.csv')
  predict.predict(small_config, remote, rows, out)
  local_out = str(tmp_path / 'predictions.csv')
  predict.predict(small_config, local, rows, local_out)
  assert storage.read_text(out) == open(local_out, encoding='utf-8').read()

  exported = storage.join(gcs_dir, 'export')
  export.export(small_config, remote, exported)
  files = storage.listdir(exported)
  assert {'model.json', 'model.jax_export', 'saved_model'} <= set(files)
  assert 'saved_model.pb' in storage.listdir(storage.join(exported,
                                                          'saved_model'))
  card = json.loads(storage.read_text(storage.join(exported, 'model.json')))
  assert card['workdir'] == remote


@pytest.mark.slow
def test_a_damaged_gcs_checkpoint_is_set_aside_and_the_run_resumes(
    small_config, gcs_dir, absl_caplog):
  remote = storage.join(gcs_dir, 'run')
  small_config.num_train_steps = 40
  loop.train_and_evaluate(small_config, remote)
  checkpoints = storage.join(remote, 'checkpoints')
  assert storage.listdir(checkpoints) == ['20', '40']
  newest = storage.join(checkpoints, '40')
  # Truncate every array file of the newest checkpoint's state.
  damaged = [p for p in storage.glob(storage.join(newest, 'state', '**'))
             if storage.isfile(p) and storage.size(p) > 0
             and not p.endswith(('.json', 'metadata', 'descriptor.pbtxt'))]
  assert damaged
  for path in damaged:
    data = storage.read_bytes(path)
    with storage.open(path, 'wb') as f:
      f.write(data[:len(data) // 2])
  before = sorted(p[len(newest):] for p in storage.glob(
      storage.join(newest, '**')) if storage.isfile(p))
  small_config.num_train_steps = 60
  final = loop.train_and_evaluate(small_config, remote)
  assert final['step'] >= 40
  assert 'Resuming from the checkpoint of step 20' in absl_caplog.text
  aside = storage.join(remote, 'damaged_checkpoints', '40')
  after = sorted(p[len(aside):] for p in storage.glob(
      storage.join(aside, '**')) if storage.isfile(p))
  assert after == before  # every file kept, none lost on the way
  assert '60' in storage.listdir(checkpoints)


def test_the_lock_on_gcs_refuses_a_second_trainer(gcs_dir):
  workdir = storage.join(gcs_dir, 'run')
  with workdir_lock.WorkdirLock(workdir):
    owner = json.loads(storage.read_text(storage.join(workdir, 'lock')))
    assert owner['pid'] == os.getpid() and owner['alive'] <= time.time()
    with pytest.raises(UsageError, match=f'pid {os.getpid()}'):
      with workdir_lock.WorkdirLock(workdir):
        pass
  assert not storage.exists(storage.join(workdir, 'lock'))


def _foreign_lock(workdir: str, alive: float) -> None:
  with storage.atomic_write(storage.join(workdir, 'lock')) as f:
    json.dump({'host': 'another-vm', 'pid': 7, 'since': 'then',
               'id': 'dead0', 'alive': alive}, f)


def test_a_lock_of_another_host_is_taken_over_once_its_heartbeat_is_stale(
    gcs_dir):
  workdir = storage.join(gcs_dir, 'run')
  _foreign_lock(workdir, alive=time.time() - 10)
  with pytest.raises(UsageError, match='another-vm pid 7.*taken over'):
    with workdir_lock.WorkdirLock(workdir):
      pass
  _foreign_lock(workdir, alive=time.time() - workdir_lock.STALE_SECONDS - 1)
  with workdir_lock.WorkdirLock(workdir):
    owner = json.loads(storage.read_text(storage.join(workdir, 'lock')))
    assert owner['host'] == socket.gethostname()
  # The lock and its takeover file are gone.
  assert not storage.exists(storage.join(workdir, 'lock'))
  assert not storage.exists(storage.join(workdir, 'lock.takeover-dead0'))


def test_of_two_takers_of_a_stale_lock_one_wins(gcs_dir):
  workdir = storage.join(gcs_dir, 'run')
  _foreign_lock(workdir, alive=0.0)
  # Another trainer made the takeover file first.
  assert storage.create_exclusive(
      storage.join(workdir, 'lock.takeover-dead0'), '{}')
  with pytest.raises(UsageError, match='another trainer is taking over'):
    with workdir_lock.WorkdirLock(workdir):
      pass


def test_the_heartbeat_refreshes_the_lock(gcs_dir, monkeypatch):
  monkeypatch.setattr(workdir_lock, 'HEARTBEAT_SECONDS', 0.05)
  workdir = storage.join(gcs_dir, 'run')
  with workdir_lock.WorkdirLock(workdir):
    path = storage.join(workdir, 'lock')
    first = json.loads(storage.read_text(path))['alive']
    deadline = time.monotonic() + 10
    while json.loads(storage.read_text(path))['alive'] == first:
      assert time.monotonic() < deadline, 'the lock was never refreshed'
      time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize('flag,expected', [
    ('--workdir=s4://bucket/run', '--workdir: s4://bucket/run: unknown URL '
     'scheme s4://'),
    ('--config.compilation_cache_dir=s4://bucket/cache',
     'compilation_cache_dir: s4://bucket/cache: unknown URL scheme'),
    ('--config.dataset.data_dir=s4://bucket/data',
     'dataset.data_dir: s4://bucket/data: unknown URL scheme'),
])
def test_an_unknown_scheme_is_one_line_and_nothing_is_written(
    flag, expected, tmp_path, data_dir):
  args = [f'--workdir={tmp_path / "run"}', f'--config.dataset.data_dir='
          f'{data_dir}', '--config.num_train_steps=5', flag]
  proc = run_train(*args, check=2)
  assert proc.stderr.strip().splitlines()[-1].startswith('error: ')
  assert expected in proc.stderr, proc.stderr[-2000:]
  assert 'Traceback' not in proc.stderr
  assert not os.path.exists(os.path.join(ROOT, 's4:'))


@pytest.mark.slow
def test_a_missing_bucket_is_one_line(gcs_emulator_url, data_dir):
  del gcs_emulator_url
  proc = run_train('--workdir=gs://no-such-bucket/run',
                   f'--config.dataset.data_dir={data_dir}',
                   '--config.num_train_steps=5', check=2)
  assert 'gs://no-such-bucket does not exist' in proc.stderr.splitlines()[-1]
  assert 'Traceback' not in proc.stderr
  assert not os.path.exists(os.path.join(ROOT, 'gs:'))


@pytest.mark.slow
def test_predict_output_of_unknown_scheme_is_one_line(tmp_path):
  proc = run_train(f'--workdir={tmp_path}', '--mode=predict',
                   '--input=rows.csv', '--output=s4://b/predictions.csv',
                   check=2)
  assert proc.stderr.strip() == ('error: --output: s4://b/predictions.csv: '
                                 'unknown URL scheme s4://; meshfit reads and '
                                 'writes local paths and gs:// URLs')


@pytest.mark.slow
def test_no_credentials_is_one_line(tmp_path, data_dir):
  env = {k: v for k, v in os.environ.items()
         if k not in ('STORAGE_EMULATOR_HOST', 'TENSORSTORE_GCS_HTTP_URL',
                      'GOOGLE_AUTH_TOKEN_FOR_TESTING', 'FSSPEC_GS_TOKEN')}
  env.update(GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / 'missing.json'),
             JAX_PLATFORMS='cpu')
  proc = subprocess.run(
      [sys.executable, 'train.py', '--workdir=gs://some-bucket/run',
       f'--config.dataset.data_dir={data_dir}', '--config.num_train_steps=5'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('error: gs://some-bucket/run')
  assert 'no Google credentials' in last and 'Traceback' not in proc.stderr


class _Link:
  """A TCP forwarder to the emulator that a test can cut and restore: the
  network going down under a running trainer."""

  def __init__(self, target_url: str):
    host, port = target_url.rsplit('//', 1)[1].split(':')
    self._target = (host, int(port))
    self.port = free_port()
    self.url = f'http://127.0.0.1:{self.port}'
    self._conns: list[socket.socket] = []
    self._server: socket.socket | None = None
    self.restore()

  def restore(self) -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(('127.0.0.1', self.port))
    server.listen(64)
    self._server = server
    threading.Thread(target=self._accept, args=(server,), daemon=True).start()

  def _accept(self, server: socket.socket) -> None:
    while True:
      try:
        client, _ = server.accept()
      except OSError:
        return  # cut
      upstream = socket.create_connection(self._target)
      self._conns += [client, upstream]
      for a, b in ((client, upstream), (upstream, client)):
        threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

  @staticmethod
  def _pipe(a: socket.socket, b: socket.socket) -> None:
    try:
      while data := a.recv(65536):
        b.sendall(data)
    except OSError:
      pass
    for s in (a, b):
      try:
        s.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass

  def cut(self) -> None:
    self._server.close()
    for s in self._conns:
      try:
        s.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass
      s.close()
    self._conns = []


@pytest.mark.slow
def test_the_network_going_down_mid_run_is_one_line_and_keeps_checkpoints(
    gcs_emulator_url, data_dir, tmp_path):
  link = _Link(gcs_emulator_url)
  workdir = f'gs://meshfit-test/network-{os.getpid()}-{time.time_ns()}'
  env = dict(os.environ, STORAGE_EMULATOR_HOST=link.url,
             TENSORSTORE_GCS_HTTP_URL=link.url, JAX_PLATFORMS='cpu')
  args = [sys.executable, 'train.py', f'--workdir={workdir}',
          f'--config.dataset.data_dir={data_dir}',
          '--config.num_train_steps=100000',
          '--config.model.hidden_sizes=(32,32)', '--config.batch_size=64',
          '--config.log_every_steps=10', '--config.eval_every_steps=200',
          # Far apart, so that the cut comes between saves: a cut during
          # an Orbax save waits out TensorStore's own retries (minutes).
          '--config.checkpoint_every_steps=400']
  log = tmp_path / 'train.log'  # a file: a full pipe would stall train.py
  with open(log, 'w', encoding='utf-8') as f:
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=f, stderr=f)
  checkpoints = storage.join(workdir, 'checkpoints')
  deadline = time.monotonic() + 120
  try:
    while not (storage.exists(checkpoints) and len(
        [s for s in storage.listdir(checkpoints) if storage.exists(
            storage.join(checkpoints, s, 'commit_success.txt'))]) >= 2):
      assert proc.poll() is None and time.monotonic() < deadline
      time.sleep(0.1)
    link.cut()
    cut = time.monotonic()
    proc.wait(timeout=240)
    took = time.monotonic() - cut
  finally:
    proc.kill()  # nothing left behind if the test fails
    proc.wait()
  link.restore()
  stderr = log.read_text()
  assert proc.returncode == 2, stderr[-3000:]
  last = stderr.strip().splitlines()[-1]
  assert last.startswith(f'error: {workdir}') and 'network error' in last, (
      stderr[-3000:])
  assert 'Traceback' not in stderr
  # One retry period of the layer's (~32 s) and of Orbax's, not one per file.
  assert took < 120, took
  # What was written before stays, and the run resumes from it.
  steps = [int(s) for s in storage.listdir(checkpoints)]
  newest = max(s for s in steps if storage.exists(
      storage.join(checkpoints, str(s), 'commit_success.txt')))
  resumed = subprocess.run(
      [*args[:4], f'--config.num_train_steps={newest + 20}', *args[5:]],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert 'Resuming from the checkpoint of step' in resumed.stderr
