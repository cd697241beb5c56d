"""Joins the processes of one job with `jax.distributed`, before any JAX use.

A job runs one process per host (or per accelerator), all executing the
same program. Where a scheduler started them, its environment says how many
there are, which one this is and where process 0 runs: jax's own cluster
detection reads SLURM (`srun`), Open MPI (`mpirun`), Kubernetes Jobs and
JobSets (with `jax[k8s]`) and Cloud TPU VMs (GCE and GKE). Elsewhere every
process is started with the same `--coordinator_address=HOST:PORT
--num_processes=N` and its own `--process_id=I`; under a scheduler any of
these flags overrides what the environment says, and `--num_processes=1`
runs a single process whatever the environment. Without a scheduler or the
flags, the job is a single process and nothing is initialised.

A process that dies must not leave the others waiting forever in a
collective. The coordination service (hosted by process 0) marks a process
dead when it has sent no heartbeat for `heartbeat_timeout_seconds` (checked
every second), and then every remaining process terminates itself with a
non-zero status. If process 0 itself dies, the others lose their connection
to the service and terminate at once. A process that fails leaves at once
too (`exit_at_once_on_failure`), so that it counts as dead rather than
waiting for peers stuck in a collective. `shutdown_timeout_seconds` bounds
how long a finished process waits at exit for the others to finish too.
"""

import contextlib
import dataclasses
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator

import jax
from absl import logging

from meshfit.errors import UsageError
from meshfit.parallel import rendezvous

# HOST:PORT, where HOST is a name, an IPv4 address or a bracketed IPv6 one.
_ADDRESS = re.compile(
    r'^(?P<host>\[[0-9A-Fa-f:.]+\]|[^:\s\[\]]+):(?P<port>\d+)$')

# jax's cluster environments by class name: how a person calls the
# scheduler, and the variables that give this process's id and the count.
_SCHEDULERS = {
    'SlurmCluster': ('SLURM', ('SLURM_PROCID', 'SLURM_NTASKS')),
    'OmpiCluster': ('Open MPI', ('OMPI_COMM_WORLD_RANK',
                                 'OMPI_COMM_WORLD_SIZE')),
    'GkeTpuCluster': ('Cloud TPU on GKE', ('TPU_WORKER_ID',
                                           'TPU_WORKER_HOSTNAMES')),
    'GceTpuCluster': ('Cloud TPU VM', ()),
    'K8sCluster': ('Kubernetes', ()),
}


@dataclasses.dataclass(frozen=True)
class Options:
  """How this process joins the job (the multi-host flags of train.py).

  Attributes:
    coordinator_address: HOST:PORT of process 0's coordination service, or
      None: the scheduler's environment says it.
    num_processes: processes in the job, or None (the environment says).
      1 runs a single process whatever the environment.
    process_id: this process's index in [0, num_processes), or None (the
      environment says).
    heartbeat_timeout_seconds: a process silent for this long is dead, and
      the others exit.
    shutdown_timeout_seconds: how long a finished process waits at exit for
      the others.
    initialization_timeout_seconds: how long to wait for every process to
      connect at start-up.
  """
  coordinator_address: str | None
  num_processes: int | None
  process_id: int | None
  heartbeat_timeout_seconds: int
  shutdown_timeout_seconds: int
  initialization_timeout_seconds: int

  @property
  def explicit(self) -> bool:
    """Whether the flags alone describe the job (all three given)."""
    return None not in (self.coordinator_address, self.num_processes,
                        self.process_id)


@dataclasses.dataclass(frozen=True)
class Job:
  """The job this process joins.

  Attributes:
    coordinator_address: HOST:PORT of process 0's coordination service.
    num_processes: processes in the job.
    process_id: this process, in [0, num_processes).
    described_by: what described it, for messages: 'SLURM job 42', 'the
      Open MPI job', 'the job of the flags'.
  """
  coordinator_address: str
  num_processes: int
  process_id: int
  described_by: str


def validate(options: Options) -> None:
  """Checks the multi-host flags that are given, before anything starts.

  Raises:
    UsageError: a flag is out of range or malformed.
  """
  if options.coordinator_address is not None:
    _check_address(options.coordinator_address, '--coordinator_address=')
  if options.num_processes is not None and options.num_processes < 1:
    raise UsageError(f'--num_processes={options.num_processes} must be at '
                     'least 1')
  if options.process_id is not None:
    if options.num_processes is not None and not (
        0 <= options.process_id < options.num_processes):
      raise UsageError(
          f'--process_id={options.process_id} must be in 0..'
          f'{options.num_processes - 1} (one distinct id per process of '
          f'--num_processes={options.num_processes})')
    if options.process_id < 0:
      raise UsageError(f'--process_id={options.process_id} must be at least '
                       '0')
  for name in ('heartbeat_timeout_seconds', 'shutdown_timeout_seconds',
               'initialization_timeout_seconds'):
    if getattr(options, name) < 1:
      raise UsageError(f'--{name}={getattr(options, name)} must be at least '
                       '1 second')


def _check_address(address: str, source: str) -> None:
  """Raises UsageError unless `address` (given by `source`) is HOST:PORT."""
  match = _ADDRESS.match(address)
  if not match:
    raise UsageError(
        f'{source}{address!r} must be HOST:PORT, e.g. 10.0.0.2:8476 (the '
        'host of process 0)')
  if not 0 < int(match['port']) < 65536:
    raise UsageError(f'{source}{address!r}: port {match["port"]} must be in '
                     '1..65535')


def find_scheduler() -> type | None:
  """jax's cluster environment that describes this process's job, if any.

  The same search as `jax.distributed.initialize()`: the first environment
  present, leaving out those jax only uses when asked (mpi4py). The search
  is private API, so a jax that moved it means "no scheduler" rather than a
  crash.

  Returns:
    A `jax._src.clusters.ClusterEnv` subclass, or None.
  """
  try:
    from jax._src import clusters  # noqa: PLC0415
  except ImportError:
    return None
  for env in clusters.ClusterEnv._cluster_types:  # noqa: SLF001
    if env.opt_in_only_method:
      continue
    try:
      if env.is_env_present():
        return env
    except Exception as e:  # noqa: BLE001 (any scheduler's failure to say)
      name = _SCHEDULERS.get(env.__name__, (env.__name__, ()))[0]
      raise UsageError(
          f'{name} seems to have started this process, but jax cannot read '
          f'its job: {e}; give --coordinator_address, --num_processes and '
          '--process_id, or --num_processes=1 to run alone') from e
  return None


def _described_by(env: type) -> str:
  name = _SCHEDULERS.get(env.__name__, (env.__name__, ()))[0]
  if name == 'SLURM':
    return f'SLURM job {os.environ.get("SLURM_JOB_ID")}'
  return f'the {name} job'


def resolve(options: Options) -> Job | None:
  """The job this process belongs to: the flags, over the environment.

  Args:
    options: the multi-host flags.

  Returns:
    The job, or None when this process runs alone.

  Raises:
    UsageError: the flags are invalid or incomplete, or the environment
      names a job that cannot be joined.
  """
  validate(options)
  if options.num_processes == 1:
    return None
  if options.explicit:
    return Job(options.coordinator_address, options.num_processes,
               options.process_id, 'the job of the flags')
  env = find_scheduler()
  if env is None:
    _require_every_flag(options)
    _warn_outside_srun()
    return None
  return _scheduled_job(env, options)


def _warn_outside_srun() -> None:
  """Says so when a SLURM batch script of several tasks ran train.py itself:
  only srun's tasks (steps) carry the variables that join them."""
  tasks = os.environ.get('SLURM_NTASKS', '1')
  if ('SLURM_JOB_ID' in os.environ and 'SLURM_STEP_NODELIST' not in
      os.environ and tasks.isdigit() and int(tasks) > 1):
    logging.warning(
        'SLURM job %s has %s tasks, but this process was not started by '
        'srun: it runs alone. Start train.py with `srun python train.py ...` '
        'to run it as one job over all of them.',
        os.environ['SLURM_JOB_ID'], tasks)


def _require_every_flag(options: Options) -> None:
  """Without a scheduler, the flags say all of the job or none of it."""
  missing = [name for name, value in (
      ('--coordinator_address', options.coordinator_address),
      ('--num_processes', options.num_processes),
      ('--process_id', options.process_id)) if value is None]
  if 0 < len(missing) < 3:
    raise UsageError(
        f'{", ".join(missing)} missing: give --coordinator_address=HOST:PORT, '
        '--num_processes=N and --process_id=I together (or none of them '
        'under SLURM, Open MPI, Kubernetes or on a Cloud TPU VM, which say '
        'them, or for a single process)')


def _scheduled_job(env: type, options: Options) -> Job | None:
  """The job a scheduler's environment describes, the flags given over it.

  Returns:
    The job, or None for a job of one process.
  """
  name, variables = _SCHEDULERS.get(env.__name__, (env.__name__, ()))
  described_by = _described_by(env)
  try:
    num_processes = options.num_processes or _process_count(env)
    if num_processes == 1:
      logging.info('%s has one process: running alone.', described_by)
      return None
    process_id = (options.process_id if options.process_id is not None
                  else env.get_process_id())
    address = options.coordinator_address or env.get_coordinator_address(
        timeout_secs=options.initialization_timeout_seconds,
        override_coordinator_port=os.environ.get('JAX_COORDINATOR_PORT'))
  except Exception as e:  # noqa: BLE001 (any scheduler's failure to say)
    raise UsageError(
        f'{name} describes this process\'s job, but jax cannot read it: '
        f'{e}; give --coordinator_address, --num_processes and --process_id, '
        'or --num_processes=1 to run alone') from e
  if not 0 <= process_id < num_processes:
    said = ', '.join(f'{v}={os.environ.get(v)}' for v in variables)
    raise UsageError(
        f'{described_by} makes this process number {process_id} of '
        f'{num_processes}{f" ({said})" if said else ""}, out of '
        f'0..{num_processes - 1}: the scheduler\'s variables were changed '
        'by hand or come from another job; start the processes through the '
        'scheduler')
  _check_address(address, f"{name}'s coordinator address ")
  return Job(address, num_processes, process_id, described_by)


def _process_count(env: type) -> int:
  try:
    return env.get_process_count()
  except KeyError:
    if env.__name__ != 'K8sCluster':
      raise
    # A pod of a Deployment, or a bare pod: no Job, so no other processes.
    return 1


def initialize(options: Options,
               on_join: Callable[[int], None] | None = None
               ) -> tuple[int, int]:
  """Joins the job, if it has several processes; call before any JAX use.

  Its log lines are tagged `[pI/N] ` from then on, and each process logs
  one line saying which job it joined and its place in it.

  Args:
    options: the multi-host flags.
    on_join: called with this process's id once it has joined, after the
      line saying so (train.py keeps the other INFO lines of the processes
      other than 0 off their consoles).

  Returns:
    (process_id, num_processes) of this process.

  Raises:
    UsageError: invalid flags, or a job that cannot be joined: a
      coordinator that never answers, a process that never comes (within
      `initialization_timeout_seconds`), an id out of range.
  """
  job = resolve(options)
  if job is None:
    return 0, 1
  tag_logs(job.process_id, job.num_processes)  # jax's start-up lines too
  # jax.distributed aborts the process when a peer never comes; meeting
  # first turns that into an error a person can act on.
  rendezvous.meet(job.coordinator_address, job.num_processes, job.process_id,
                  options.initialization_timeout_seconds, job.described_by)
  # Only the CPU backend reads this: processes exchange CPU collectives over
  # TCP (gloo). TPU and GPU backends have their own interconnects.
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(
      coordinator_address=job.coordinator_address,
      num_processes=job.num_processes,
      process_id=job.process_id,
      initialization_timeout=options.initialization_timeout_seconds,
      heartbeat_timeout_seconds=options.heartbeat_timeout_seconds,
      shutdown_timeout_seconds=options.shutdown_timeout_seconds)
  logging.info(
      'Joined %s as process %d of %d (coordinator %s). If a process dies, '
      'the others exit within --heartbeat_timeout_seconds=%d plus a few '
      'seconds.', job.described_by, job.process_id, job.num_processes,
      job.coordinator_address, options.heartbeat_timeout_seconds)
  if on_join is not None:
    on_join(job.process_id)
  return job.process_id, job.num_processes


class _ProcessTag(logging.logging.Formatter):
  """Puts `[pI/N] ` before every log line, so mixed logs say who speaks."""

  def __init__(self, inner: logging.logging.Formatter, tag: str):
    super().__init__()
    self._inner, self._tag = inner, tag

  def format(self, record) -> str:
    return self._tag + self._inner.format(record)


def tag_logs(process_id: int, num_processes: int) -> None:
  """Prefixes this process's log lines with `[p<process_id>/<num_processes>]`.

  Only for jobs of several processes: a single process's logs stay as they
  were.
  """
  if num_processes < 2:
    return
  handler = logging.get_absl_handler()
  inner = handler.python_handler.formatter or logging.PythonFormatter()
  handler.setFormatter(_ProcessTag(inner, f'[p{process_id}/{num_processes}] '))


@contextlib.contextmanager
def exit_at_once_on_failure(num_processes: int) -> Iterator[None]:
  """Makes a failing process of a multi-process job leave without waiting.

  Python's normal exit runs jax's shutdown barrier, which waits up to
  `shutdown_timeout_seconds` for every process to arrive. After a failure
  that only this process saw (a bad file on one host, Ctrl-C), the others are
  inside a collective that never completes and never arrive: every process
  would hang for the whole shutdown timeout. Leaving at once instead makes
  this process a dead peer, which the others notice within their heartbeat
  timeout. A single process exits normally.

  Args:
    num_processes: processes in the job.

  Yields:
    Nothing; wraps the work of the process.
  """
  if num_processes < 2:
    yield
    return
  try:
    yield
  except SystemExit as e:
    if e.code in (None, 0):
      raise
    _exit_now(e.code if isinstance(e.code, int) else 1)
  except BaseException:  # noqa: BLE001 (reported, then the process ends)
    traceback.print_exc()
    _exit_now(1)


def _exit_now(status: int) -> None:
  """Flushes what this process has said, then ends it without clean-up."""
  logging.error('This process failed (exit status %d); leaving without the '
                'shutdown barrier so that the other processes stop within '
                'their heartbeat timeout.', status)
  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # noqa: SLF001 (atexit would wait at the barrier)
