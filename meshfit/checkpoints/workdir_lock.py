"""One trainer per workdir: a lock file that names its owner.

`workdir/lock` holds the host, pid and start time of the process that
trains there. A second trainer refuses to start while the owner lives; a
lock whose owner is dead (same host, pid gone or reused) is taken over.
The processes of one multi-host job share the lock: process 0 holds it and
tells the others whether it got it.
"""

import json
import os
import socket
import time

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from meshfit.errors import UsageError

LOCK_NAME = 'lock'


def check_workdir(workdir: str) -> None:
  """The workdir must be a directory (or not exist yet)."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise UsageError(f'workdir {workdir} is a file; give a directory path')


def _start_time(pid: int) -> str | None:
  """The process's start time in clock ticks (tells a reused pid apart)."""
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
      return f.read().rsplit(')', 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _alive(owner: dict) -> bool:
  if owner.get('host') != socket.gethostname():
    return True  # cannot tell from here: assume it lives
  pid = owner.get('pid')
  if not isinstance(pid, int):
    return False
  start = _start_time(pid)
  return start is not None and start == owner.get('start_time')


class WorkdirLock:
  """Context manager holding `workdir/lock` for the duration of training."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, LOCK_NAME)
    self._held = False

  def _try_acquire(self) -> str | None:
    """Takes the lock; returns why not if another live trainer holds it."""
    me = {'host': socket.gethostname(), 'pid': os.getpid(),
          'start_time': _start_time(os.getpid()),
          'since': time.strftime('%Y-%m-%d %H:%M:%S')}
    for _ in range(2):
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        try:
          with open(self.path, encoding='utf-8') as f:
            owner = json.load(f)
        except (OSError, json.JSONDecodeError):
          owner = {}
        if owner and _alive(owner):
          return (f'workdir {os.path.dirname(self.path)} is in use by a '
                  f'training run on host {owner.get("host")} pid '
                  f'{owner.get("pid")} (since {owner.get("since")}); wait '
                  f'for it to finish or stop it (if it is gone, delete '
                  f'{self.path})')
        logging.warning('Taking over the lock of a dead trainer: %s', owner)
        os.remove(self.path)
        continue
      with os.fdopen(fd, 'w', encoding='utf-8') as f:
        json.dump(me, f)
      self._held = True
      return None
    return f'could not take {self.path}; another trainer is starting'

  def __enter__(self) -> 'WorkdirLock':
    workdir = os.path.dirname(self.path)
    try:
      os.makedirs(workdir, exist_ok=True)
      refusal = self._try_acquire() if jax.process_index() == 0 else None
    except PermissionError as e:  # refused like a held lock: every
      # process of a job learns of it below
      refusal = (f'cannot write in workdir {workdir} ({e.strerror}); train '
                 'into a directory this user may write, or change its '
                 'permissions')
    if jax.process_count() > 1:
      refused = multihost_utils.broadcast_one_to_all(
          np.int32(refusal is not None))
      if refused and refusal is None:
        refusal = ('process 0 could not lock the workdir: another training '
                   'run holds it')
    if refusal:
      raise UsageError(refusal)
    return self

  def __exit__(self, *exc) -> None:
    if self._held:
      os.remove(self.path)
      self._held = False
