"""The meeting of a job's processes before jax.distributed joins them."""

import socket
import threading
import time

import pytest

from cli_helpers import free_port

from meshfit.errors import UsageError
from meshfit.parallel import rendezvous


def _meet_all(address: str, ids: list[int], num_processes: int,
              timeout: float) -> list[Exception | None]:
  """Runs `meet` for each id in its own thread; what each raised."""
  outcome: list[Exception | None] = [None] * len(ids)

  def one(index: int) -> None:
    try:
      rendezvous.meet(address, num_processes, ids[index], timeout, 'job 7')
    except UsageError as e:
      outcome[index] = e

  threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ids))]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout + 10)
  assert not any(t.is_alive() for t in threads)
  return outcome


def test_every_process_meets_and_the_port_is_free_again():
  port = free_port()
  start = time.monotonic()
  assert _meet_all(f'127.0.0.1:{port}', [2, 1, 0], 3, 30) == [None] * 3
  assert time.monotonic() - start < 5
  # JAX's coordination service binds the port next.
  with socket.create_server(('', port)):
    pass


def test_a_coordinator_that_never_answers_is_an_error_in_time():
  start = time.monotonic()
  [error] = _meet_all(f'127.0.0.1:{free_port()}', [1], 2, 1)
  assert 1 <= time.monotonic() - start < 3
  assert 'the coordinator 127.0.0.1:' in str(error)
  assert ('of job 7 did not answer process 1 within '
          '--initialization_timeout_seconds=1') in str(error)


def test_processes_that_never_come_are_named_in_time():
  start = time.monotonic()
  host, visitor = _meet_all(f'127.0.0.1:{free_port()}', [0, 2], 4, 1)
  assert 1 <= time.monotonic() - start < 3
  assert visitor is not None  # process 0 never answered it
  assert str(host).startswith(
      'processes 1, 3 of the 4 of job 7 did not reach the coordinator')


def test_two_processes_with_one_id_are_told_so():
  outcome = _meet_all(f'127.0.0.1:{free_port()}', [0, 1, 1], 3, 2)
  messages = [str(e) for e in outcome]
  # Process 0 admits one of them, tells the other, and waits for process 2.
  assert messages[0].startswith('process 2 of the 3 of job 7 did not reach')
  assert sorted(messages[1:])[0] == (
      'job 7 cannot be joined: two processes claim process id 1; give each '
      'its own')


def test_a_taken_port_is_an_error():
  with socket.create_server(('', 0)) as taken:
    port = taken.getsockname()[1]
    with pytest.raises(UsageError, match=f'cannot listen on port {port}'):
      rendezvous.meet(f'127.0.0.1:{port}', 2, 0, 5, 'job 7')
