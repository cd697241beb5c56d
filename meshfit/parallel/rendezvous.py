"""Checks that every process of a job is there before `jax.distributed` joins.

`jax.distributed.initialize()` ends the process with an abort and a C++
stack trace when the coordinator never answers or a process never comes,
after its initialization timeout. A scheduler's environment can name a job
that cannot be joined (a batch script that runs train.py once where the job
has two tasks, a coordinator host that is down), and that deserves one
`error:` line instead. So the processes meet first on the coordinator's own
port: process 0 listens there, every other process connects and says who it
is, and process 0 answers once all have come. Process 0 then closes the
port and JAX's coordination service takes it over; the other processes'
JAX clients retry until it listens.
"""

import errno
import json
import socket
import time

from meshfit.errors import UsageError

# How often a process retries a coordinator that does not answer yet.
_RETRY_SECONDS = 0.25


def split_address(address: str) -> tuple[str, int]:
  """('host', port) of 'host:port' or '[v6]:port'."""
  host, port = address.rsplit(':', 1)
  return host.strip('[]'), int(port)


def meet(address: str, num_processes: int, process_id: int,
         timeout_seconds: float, job: str) -> None:
  """Returns once every process of the job has reached this point.

  Args:
    address: HOST:PORT of process 0's coordinator.
    num_processes: processes in the job.
    process_id: this process, in [0, num_processes).
    timeout_seconds: how long to wait for the others.
    job: what describes the job, for the messages (e.g. 'SLURM job 42').

  Raises:
    UsageError: the others did not all come, or disagree about the job.
  """
  deadline = time.monotonic() + timeout_seconds
  if process_id == 0:
    _host(address, num_processes, deadline, timeout_seconds, job)
  else:
    _visit(address, num_processes, process_id, deadline, timeout_seconds,
           job)


def _host(address: str, num_processes: int, deadline: float,
          timeout_seconds: float, job: str) -> None:
  """Process 0: waits until every other process has said who it is."""
  _, port = split_address(address)
  try:
    server = _listen(port)
  except OSError as e:
    raise UsageError(
        f'process 0 of {job} cannot listen on port {port} of the coordinator '
        f'address {address} ({e.strerror}): another program or job holds it; '
        'free it, or give another port (--coordinator_address=HOST:PORT, or '
        'JAX_COORDINATOR_PORT=PORT under a scheduler)') from e
  arrived: dict[int, socket.socket] = {}
  try:
    while len(arrived) < num_processes - 1:
      left = deadline - time.monotonic()
      if left <= 0:
        missing = sorted(set(range(1, num_processes)) - set(arrived))
        raise UsageError(
            f'process{"es" if len(missing) > 1 else ""} '
            f'{", ".join(map(str, missing))} of the {num_processes} of {job} '
            f'did not reach the coordinator {address} within '
            f'--initialization_timeout_seconds={timeout_seconds:g}; start '
            'every process of the job (under SLURM, through srun), or give '
            'a slow start a longer timeout')
      server.settimeout(left)
      try:
        conn, _ = server.accept()
      except TimeoutError:
        continue
      conn.settimeout(max(deadline - time.monotonic(), 0.1))
      try:
        said = json.loads(conn.makefile('r', encoding='utf-8').readline())
        problem = _disagreement(said, num_processes, arrived)
      except (OSError, ValueError, TypeError, KeyError):
        conn.close()  # not one of ours, or gone: wait for the real one
        continue
      if problem:
        _answer(conn, problem)
        conn.close()
        continue
      arrived[said['process_id']] = conn
    for conn in arrived.values():
      _answer(conn, 'ok')
    for conn in arrived.values():
      _wait_closed(conn)
  finally:
    for conn in arrived.values():
      conn.close()
    server.close()


def _listen(port: int) -> socket.socket:
  """A server on every address of this host, as JAX's service binds."""
  if socket.has_dualstack_ipv6():
    try:
      return socket.create_server(('', port), family=socket.AF_INET6,
                                  dualstack_ipv6=True)
    except OSError as e:
      if e.errno == errno.EADDRINUSE:
        raise
  return socket.create_server(('', port))


def _disagreement(said: dict, num_processes: int,
                  arrived: dict[int, socket.socket]) -> str | None:
  """What is wrong with a process's view of the job, if anything."""
  if said['num_processes'] != num_processes:
    return (f'process {said["process_id"]} counts {said["num_processes"]} '
            f'processes in the job, process 0 counts {num_processes}')
  if said['process_id'] in arrived:
    return (f'two processes claim process id {said["process_id"]}; give '
            'each its own')
  return None


def _answer(conn: socket.socket, message: str) -> None:
  try:
    conn.sendall(message.encode('utf-8') + b'\n')
  except OSError:
    pass  # it left; its own timeout reports it


def _wait_closed(conn: socket.socket) -> None:
  """Lets the visitor close first, so that the port's closing handshake
  does not hold it for JAX's service to bind."""
  try:
    conn.settimeout(5)
    conn.recv(1)
  except OSError:
    pass
  conn.close()


def _visit(address: str, num_processes: int, process_id: int,
           deadline: float, timeout_seconds: float, job: str) -> None:
  """Any other process: says who it is, and waits for process 0's answer."""
  host, port = split_address(address)
  hello = json.dumps({'process_id': process_id,
                      'num_processes': num_processes}).encode() + b'\n'
  while True:
    left = deadline - time.monotonic()
    if left <= 0:
      raise UsageError(
          f'the coordinator {address} of {job} did not answer process '
          f'{process_id} within --initialization_timeout_seconds='
          f'{timeout_seconds:g}: process 0 is not running there; start it '
          '(every process of the job, under SLURM through srun), or check '
          'that this host reaches that address')
    try:
      with socket.create_connection((host, port), timeout=left) as conn:
        conn.sendall(hello)
        conn.settimeout(max(deadline - time.monotonic(), 0.1))
        answer = conn.makefile('r', encoding='utf-8').readline().strip()
    except OSError:
      answer = ''  # not listening yet, or process 0 left: try again
    if answer == 'ok':
      return
    if answer:
      raise UsageError(f'{job} cannot be joined: {answer}')
    time.sleep(min(_RETRY_SECONDS, max(deadline - time.monotonic(), 0)))
