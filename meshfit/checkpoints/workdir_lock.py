"""One trainer per workdir: a lock file that names its owner and says it lives.

`workdir/lock` holds the host, pid and start time of the process that
trains there, a unique id, and `alive`: the wall-clock time its owner last
rewrote it (every HEARTBEAT_SECONDS). The lock is created only if absent
(O_EXCL locally, a generation-match precondition on gs://), so of two
trainers starting at once exactly one gets it; the other refuses to start
while the owner lives.

An owner is dead when, on this host, its pid is gone or reused, or, on any
host, its heartbeat is older than STALE_SECONDS: a preempted TPU VM comes
back under another name and pid, and its lock in a gs:// workdir must not
hold the run forever. A dead owner's lock is taken over; of several
trainers taking over the same lock at once, the one that creates
`lock.takeover-<dead owner's id>` (again only if absent) wins.

The processes of one multi-host job share the lock: process 0 holds it and
tells the others whether it got it.
"""

import hashlib
import json
import os
import socket
import threading
import time
import uuid

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from meshfit import storage
from meshfit.errors import UsageError

LOCK_NAME = 'lock'
# How often the owner rewrites the lock, and how old a heartbeat makes the
# owner dead. Seconds; far apart so that a busy host is not taken for dead.
HEARTBEAT_SECONDS = 60.0
STALE_SECONDS = 600.0


def check_workdir(workdir: str) -> None:
  """The workdir must be a directory (or not exist yet), on known storage.

  Raises:
    UsageError: a file, or a URL of a scheme meshfit does not know.
  """
  try:
    if storage.isfile(workdir):
      raise UsageError(f'workdir {workdir} is a file; give a directory path')
  except storage.StorageError as e:
    raise UsageError(str(e)) from None


def _start_time(pid: int) -> str | None:
  """The process's start time in clock ticks (tells a reused pid apart)."""
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
      return f.read().rsplit(')', 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _alive(owner: dict, now: float) -> bool:
  """Whether the lock's owner may still be training."""
  if owner.get('host') == socket.gethostname():
    pid = owner.get('pid')
    if not isinstance(pid, int):
      return False
    start = _start_time(pid)
    return start is not None and start == owner.get('start_time')
  alive = owner.get('alive')
  if not isinstance(alive, (int, float)):
    return True  # a lock of an older meshfit: cannot tell from here
  return now - alive < STALE_SECONDS


class WorkdirLock:
  """Context manager holding `workdir/lock` for the duration of training."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.path = storage.join(workdir, LOCK_NAME)
    self._me = {'host': socket.gethostname(), 'pid': os.getpid(),
                'start_time': _start_time(os.getpid()),
                'since': time.strftime('%Y-%m-%d %H:%M:%S'),
                'id': uuid.uuid4().hex}
    self._held = False
    self._token: str | None = None  # the takeover file this lock made
    self._stop = threading.Event()
    self._beat: threading.Thread | None = None

  def _content(self) -> str:
    return json.dumps({**self._me, 'alive': time.time()})

  def _read(self) -> tuple[dict, bytes] | None:
    """(owner, raw content) of the lock, or None when there is none."""
    try:
      raw = storage.read_bytes(self.path)
    except FileNotFoundError:
      return None
    try:
      owner = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
      owner = {}
    return (owner if isinstance(owner, dict) else {}), raw

  def _try_acquire(self) -> str | None:
    """Takes the lock; returns why not if another live trainer holds it."""
    for _ in range(3):
      if storage.create_exclusive(self.path, self._content()):
        return None
      found = self._read()
      if found is None:
        continue  # released in between: try again
      owner, raw = found
      if owner and _alive(owner, time.time()):
        return (f'workdir {self.workdir} is in use by a training run on '
                f'host {owner.get("host")} pid {owner.get("pid")} (since '
                f'{owner.get("since")}); wait for it to finish or stop it '
                f'(a lock not refreshed for {STALE_SECONDS / 60:g} minutes '
                f'is taken over; if that run is gone, delete {self.path})')
      # Named after the dead owner: of several takers, one creates it.
      dead = owner.get('id') or hashlib.sha256(raw).hexdigest()[:16]
      token = f'{self.path}.takeover-{dead}'
      if not storage.create_exclusive(token, self._content()):
        return (f'another trainer is taking over the lock {self.path} of a '
                'dead run; wait for it to finish or stop it')
      logging.warning('Taking over the lock of a dead trainer: %s', owner)
      with storage.atomic_write(self.path) as f:
        f.write(self._content())
      self._token = token
      return None
    return f'could not take {self.path}; another trainer is starting'

  def _heartbeat(self) -> None:
    """Rewrites the lock every HEARTBEAT_SECONDS while this run holds it."""
    while not self._stop.wait(HEARTBEAT_SECONDS):
      try:
        found = self._read()
        if found is None or found[0].get('id') != self._me['id']:
          logging.error('The lock %s is no longer this run\'s (another '
                        'trainer took it over); its heartbeat stops.',
                        self.path)
          return
        with storage.atomic_write(self.path) as f:
          f.write(self._content())
      except (OSError, storage.StorageError) as e:
        # A missed beat is retried at the next; STALE_SECONDS allows many.
        logging.warning('Could not refresh the lock %s: %s', self.path, e)

  def __enter__(self) -> 'WorkdirLock':
    refusal = None
    try:
      storage.makedirs(self.workdir)
      if jax.process_index() == 0:
        refusal = self._try_acquire()
        self._held = refusal is None
    except PermissionError as e:  # refused like a held lock: every
      # process of a job learns of it below
      refusal = (f'cannot write in workdir {self.workdir} ({e.strerror}); '
                 'train into a directory this user may write, or change its '
                 'permissions')
    except storage.StorageError as e:
      refusal = str(e)
    if jax.process_count() > 1:
      refused = multihost_utils.broadcast_one_to_all(
          np.int32(refusal is not None))
      if refused and refusal is None:
        refusal = ('process 0 could not lock the workdir: another training '
                   'run holds it')
    if refusal:
      raise UsageError(refusal)
    if self._held:
      self._beat = threading.Thread(target=self._heartbeat, daemon=True,
                                    name='meshfit-lock-heartbeat')
      self._beat.start()
    return self

  def __exit__(self, exc_type, *exc) -> None:
    if not self._held:
      return
    self._stop.set()
    if self._beat is not None:
      self._beat.join()
    self._held = False
    if (exc_type is not None and issubclass(exc_type, storage.StorageError)
        and storage.is_remote(self.path)):
      # The storage is unreachable: a release would only wait out retries.
      logging.warning('The lock %s is left; it is taken over %g minutes '
                      'after its last heartbeat.', self.path,
                      STALE_SECONDS / 60)
      return
    try:
      found = self._read()
      if found is not None and found[0].get('id') == self._me['id']:
        storage.remove(self.path)
      if self._token is not None:
        storage.remove(self._token)
    except (OSError, storage.StorageError) as e:
      # The run's own error (the network, most likely) is the one to report;
      # without its heartbeat the lock is taken over after STALE_SECONDS.
      logging.warning('Could not release the lock %s: %s', self.path, e)
