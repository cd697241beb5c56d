"""A single-node SLURM cluster on this machine, for tests/test_slurm.py.

Debian's slurmctld and slurmd with their own munge daemon, configured from
tests/slurm/slurm.conf and living in one temporary directory: nothing of the
host's own SLURM or munge set-up is read or changed. `make slurm-setup`
installs the packages (as root); where they are missing the tests skip, and
under CI (CI=true) they fail instead.
"""

import os
import shutil
import socket
import subprocess
import time

import pytest

from cli_helpers import free_port

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'slurm',
                      'slurm.conf')
PROGRAMS = ('munged', 'slurmctld', 'slurmd', 'sbatch', 'scontrol', 'sinfo')
START_TIMEOUT_S = 60
# The ports jax derives from a SLURM job id: the top 4096.
_JAX_PORTS = 61440


def unavailable() -> str | None:
  """Why this machine cannot run the cluster, or None."""
  missing = [p for p in PROGRAMS if shutil.which(p) is None]
  if missing:
    return (f'SLURM is not installed ({", ".join(missing)} not found): as '
            'root, `make slurm-setup` installs Debian\'s slurmctld, slurmd, '
            'slurm-client and munge')
  if os.geteuid() != 0:
    return 'slurmd launches tasks as root: run the SLURM tests as root'
  return None


def require() -> None:
  """Skips the calling test where the cluster cannot run; fails under CI."""
  reason = unavailable()
  if reason is None:
    return
  if os.environ.get('CI') == 'true':
    pytest.fail(f'CI must run the SLURM tests: {reason}')
  pytest.skip(reason)


def _node_name() -> str:
  """This host's name where it resolves, else localhost: jax takes the
  coordinator's address from the node's name."""
  host = socket.gethostname()
  try:
    socket.gethostbyname(host)
  except OSError:
    return 'localhost'
  return host


class Cluster:
  """The running cluster: its directory and the environment of its clients.

  Attributes:
    dir: where its config, state, logs and munge socket live.
    env: os.environ plus SLURM_CONF, for sbatch, srun and scontrol.
  """

  def __init__(self, directory: str, cpus: int):
    """Starts munged, slurmctld and slurmd; waits until the node is idle.

    Args:
      directory: an empty directory of its own.
      cpus: CPUs the node offers to jobs.
    """
    self.dir = directory
    os.chmod(directory, 0o700)  # munged refuses a key others could read
    for sub in ('state', 'spool'):
      os.makedirs(os.path.join(directory, sub))
    host = _node_name()
    with open(CONFIG, encoding='utf-8') as f:
      config = f.read().format(
          host=host, dir=directory, cpus=cpus,
          controller_port=free_port(20000, 60000),
          node_port=free_port(20000, 60000),
          # Its first job's coordinator port (jax's job id % 4096) is free.
          first_job_id=free_port(_JAX_PORTS, 65536) - _JAX_PORTS + 4096)
    self.config = os.path.join(directory, 'slurm.conf')
    with open(self.config, 'w', encoding='utf-8') as f:
      f.write(config)
    self.env = dict(os.environ, SLURM_CONF=self.config)
    key = os.path.join(directory, 'munge.key')
    with open(key, 'wb') as f:
      f.write(os.urandom(1024))
    os.chmod(key, 0o600)
    self._pid_files = []
    self._daemon('munged', '--force', f'--socket={directory}/munge.socket',
                 f'--key-file={key}', f'--pid-file={directory}/munged.pid',
                 f'--log-file={directory}/munged.log',
                 f'--seed-file={directory}/munged.seed')
    self._daemon('slurmctld', '-f', self.config, '-i')
    self._daemon('slurmd', '-f', self.config, '-N', host)
    deadline = time.monotonic() + START_TIMEOUT_S
    while self.run('sinfo', '-h', '-o', '%T', check=False).strip() != 'idle':
      if time.monotonic() > deadline:
        self.stop()
        raise RuntimeError(f'the SLURM node is not idle after '
                           f'{START_TIMEOUT_S} s:\n{self.logs()}')
      time.sleep(0.2)

  def _daemon(self, program: str, *args: str) -> None:
    """Starts a daemon that forks into the background and writes its pid."""
    self._pid_files.append(os.path.join(self.dir, f'{program}.pid'))
    subprocess.run([program, *args], env=self.env, check=True,
                   capture_output=True, timeout=START_TIMEOUT_S)

  def run(self, *args: str, check: bool = True,
          env: dict[str, str] | None = None) -> str:
    """A SLURM command's stdout (run with `env`, by default `self.env`)."""
    proc = subprocess.run(args, env=env or self.env, capture_output=True,
                          text=True, timeout=60)
    if check and proc.returncode != 0:
      raise RuntimeError(f'{" ".join(args)}: {proc.stderr}')
    return proc.stdout

  def job(self, job_id: str) -> dict[str, str]:
    """`scontrol show job`'s fields of a job."""
    fields = self.run('scontrol', 'show', 'job', '-o', job_id).split()
    return dict(f.split('=', 1) for f in fields if '=' in f)

  def task_pids(self, job_id: str) -> dict[int, int]:
    """The process of each task of a job's first step, by task id."""
    pids = {}
    for line in self.run('scontrol', 'listpids', job_id).splitlines()[1:]:
      pid, _, step, _, task = line.split()
      if step == '0' and task != '-':
        pids[int(task)] = int(pid)
    return pids

  def logs(self) -> str:
    text = []
    for name in ('slurmctld.log', 'slurmd.log', 'munged.log'):
      path = os.path.join(self.dir, name)
      if os.path.exists(path):
        with open(path, encoding='utf-8', errors='replace') as f:
          text.append(f'--- {name} ---\n{f.read()[-3000:]}')
    return '\n'.join(text)

  def stop(self) -> None:
    """Ends the daemons this cluster started, newest first."""
    for pid_file in reversed(self._pid_files):
      try:
        with open(pid_file, encoding='utf-8') as f:
          os.kill(int(f.read().strip()), 15)
      except (OSError, ValueError):
        pass  # it never started, or has gone
