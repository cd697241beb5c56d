"""Training speed of meshfit beside the alternatives, measured side by side.

For each model size, the same MLP, batch, optimizer (Adam, constant learning
rate) and number of steps run through:

  meshfit        `train_and_evaluate` itself, on a Parquet table of the
                 size's shape: its input pipeline, calls of many steps, loss
                 checks, metrics, logging and checkpoints
  jit            a minimal hand-written `jax.jit` step over device-resident
                 batches: the zero-framework floor
  pmap           the JAX 101 tutorial's update: params replicated, the batch
                 split over devices, gradients `pmean`'d
  torch          PyTorch eager on CPU (optional: requirements-bench.txt)

Sections (--sections):

  main           the four above, and meshfit with one step per call
                 (`steps_per_call=1`: what calls of many steps save)
  precision      bfloat16 compute (`model.dtype`), meshfit, jit and torch
  checkpoint     meshfit with a checkpoint every second against none, over
                 `checkpoint_steps`; the checkpoints written are counted in
                 the workdir
  members        ensembles of --members models of --members_size, each on
                 its own batch (`model.ensemble_size`, members split over
                 the devices that divide them), against one model:
                 steps/s, model-examples/s, and the host's share of a step
  first_minute   `configs/csv.py` on a small table, train then predict, each
                 a fresh `train.py` process: cold (no compilation cache, no
                 prepared copy), warm (both kept) and as typed (warm, no
                 `--verbose`); the phases read from its timestamped lines

The host's share: meshfit's loop runs in one thread that makes each call's
batches (row indices of the table on the devices), dispatches the jitted
call, checks losses and logs; the devices run the call. `on_call` (a
parameter of `train_and_evaluate`) is called in that thread after each
dispatch, so the thread's CPU time between two calls is the host's work for
a call, waiting excluded. host us/step is that over the steps, and host
share its part of a step's wall time: near 100% the host is the bound and
the devices wait for it. device us/step is the wall time of the same run
with every call waited for (the devices never run ahead), less the host's.

Every variant runs once per round and the rounds interleave them (the start
rotates), so slow drifts in the load of other processes reach all of them.
Each variant is reported at its best round (the median beside it), every
ratio one of bests. Times are steady state: a meshfit run's window opens
when its first call (which compiles) has finished and closes when its last
one has; set-up, the final evaluation and checkpoint are outside it.

    python benchmarks/speed.py                      # everything, ~15 minutes
    python benchmarks/speed.py --sizes=small --repeats=2 --sections=main
    python benchmarks/speed.py --sizes=small --sections=members --repeats=3

It runs on the process's devices: one CPU device by default.
`XLA_FLAGS=--xla_force_host_platform_device_count=N` splits the CPU into N
virtual devices (meshfit, jit and pmap then run over them).
"""

import collections
import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

# Before TensorFlow / TFDS are imported: keep everything local and quiet.
os.environ.setdefault('NO_GCE_CHECK', 'true')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
from meshfit.parallel import xla_flags  # noqa: E402  (imports no jax)

# The XLA flags train.py starts with; every variant of this process runs
# under them (the jit and pmap loops too: compare like with like).
xla_flags.apply()

from absl import app, flags, logging  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import bench_common  # noqa: E402
from bench_common import markdown_table, number  # noqa: E402
from meshfit.configs import default  # noqa: E402
from meshfit.train.loop import train_and_evaluate  # noqa: E402

SECTIONS = ('main', 'precision', 'checkpoint', 'members', 'first_minute')

FLAGS = flags.FLAGS
flags.DEFINE_list('sizes', ['tiny', 'small', 'medium', 'large'],
                  'Model sizes of the main, precision and checkpoint '
                  'sections.')
flags.DEFINE_integer('steps', None, 'Timed steps of each meshfit run '
                     '(default: per size; members: as many as take about '
                     '--seconds); also the most any other variant runs.')
flags.DEFINE_float('seconds', 0.5, 'Rough time of each calibrated run per '
                   'round: its steps are calibrated to it once.')
flags.DEFINE_integer('repeats', 4, 'Rounds; each runs every variant once.')
flags.DEFINE_list('sections', list(SECTIONS),
                  f'Any of {", ".join(SECTIONS)}.')
flags.DEFINE_list('members', ['1', '8', '32', '128'],
                  'Ensemble sizes of the members section.')
flags.DEFINE_string('members_size', 'small',
                    'Model size of the members section.')
flags.DEFINE_integer('torch_threads', 0, 'torch.set_num_threads for the '
                     'PyTorch rows; 0 keeps its default (one per core).')
_TABLE = os.path.join(bench_common.DATASETS, 'tables', 'babies', '0')
flags.DEFINE_string('train', os.path.join(_TABLE, 'train.csv'),
                    'first_minute: the training file.')
flags.DEFINE_string('test', os.path.join(_TABLE, 'test.csv'),
                    'first_minute: the eval file (and predict input).')
flags.DEFINE_string('target', 'bwt', 'first_minute: the column to predict.')
flags.DEFINE_string('json', None, 'Also write every measurement here.')
flags.DEFINE_integer('matmul_n', 2048, 'Side of the square matmul whose '
                     'best rate is the peak that "of peak" divides by.')

LEARNING_RATE = 1e-3
# Distinct batches in each table (the loops over in-memory arrays cycle
# through as many).
NUM_BATCHES = 8
# The checkpoint section's period: short enough for several saves in its
# window, so that the cost of one save can be read off in the steady state.
CHECKPOINT_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class Size:
  """One benchmark model: `features -> hidden... -> targets` at `batch_size`."""
  name: str
  num_features: int
  hidden_sizes: tuple[int, ...]
  num_targets: int
  batch_size: int
  default_steps: int
  # Steps of the checkpoint comparison: long enough that it measures the
  # steady cost of checkpoints every CHECKPOINT_SECONDS (several of them)
  # rather than one save's latency.
  checkpoint_steps: int

  @property
  def layer_sizes(self) -> tuple[int, ...]:
    return (self.num_features, *self.hidden_sizes, self.num_targets)

  @property
  def num_params(self) -> int:
    return sum((a + 1) * b for a, b in zip(self.layer_sizes[:-1],
                                           self.layer_sizes[1:]))

  @property
  def flops_per_step(self) -> float:
    # Forward 2 flops per weight and example, backward 4.
    return 6.0 * self.num_params * self.batch_size

  @property
  def target_names(self) -> tuple[str, ...]:
    return (('y',) if self.num_targets == 1 else
            tuple(f'y{i}' for i in range(self.num_targets)))


# Default steps: windows of ~0.3 s or more; a best of a few shorter ones
# rewards whichever variant got lucky.
SIZES = {s.name: s for s in (
    Size('tiny', 1, (), 1, 128, default_steps=20_000,
         checkpoint_steps=600_000),
    Size('small', 10, (64, 64), 1, 256, default_steps=4000,
         checkpoint_steps=80_000),
    Size('medium', 10, (512, 512), 1, 1024, default_steps=100,
         checkpoint_steps=1_000),
    Size('large', 784, (2048,) * 3, 10, 2048, default_steps=3,
         checkpoint_steps=15),
)}


@dataclasses.dataclass(frozen=True)
class Data:
  """A random regression table of a size's shape: Parquet files for
  meshfit, the same rows in memory for the other loops."""
  x_NxF: np.ndarray
  y_NxT: np.ndarray
  train_path: str
  eval_path: str

  def batches(self, batch_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(self.x_NxF[i:i + batch_size], self.y_NxT[i:i + batch_size])
            for i in range(0, self.x_NxF.shape[0], batch_size)]


def make_data(size: Size, workroot: str) -> Data:
  """NUM_BATCHES batches of `size` in one Parquet file (and an evaluation
  file of one batch), and the same rows in memory."""
  import pyarrow.parquet as pq  # noqa: PLC0415
  train, eval_path = bench_common.write_table(
      os.path.join(workroot, f'table_{size.name}'),
      NUM_BATCHES * size.batch_size, size.num_features, size.num_targets,
      eval_rows=size.batch_size)
  table = pq.read_table(train).to_pandas()
  return Data(table[[f'x{i}' for i in range(size.num_features)]].to_numpy(
      np.float32), table[list(size.target_names)].to_numpy(np.float32),
              train, eval_path)


# ---------------------------------------------------------------------------
# The variants. Each is set up (and compiled) once; `run(n)` then returns the
# seconds that n steady-state steps take.


class Variant:
  """A way to train; `run(n)` times n steps after set-up and warm-up."""
  name: str
  # Runs exactly its steps (a window that holds logs and checkpoints)
  # rather than a number calibrated to --seconds.
  fixed_steps: int | None = None

  def run(self, num_steps: int) -> float:
    raise NotImplementedError


class CallClock:
  """An `on_call` observer: the wall, loop-thread CPU and process CPU time
  after each train call of a run.

  The first call (which compiles) and the last are waited for before they
  are timed, so that the window between them holds whole calls; with
  `wait_every`, every call is (the devices then never run ahead of the
  host).
  """

  def __init__(self, last_step: int, wait_every: bool = False):
    self.last_step, self.wait_every = last_step, wait_every
    self.marks: list[tuple[int, float, float, float]] = []

  def __call__(self, step: int, losses: jax.Array) -> None:
    if self.wait_every or not self.marks or step == self.last_step:
      jax.block_until_ready(losses)
    self.marks.append((step, time.perf_counter(), time.thread_time(),
                       time.process_time()))

  def window(self) -> dict[str, float]:
    """Steps, wall seconds, loop-thread CPU seconds and process CPU seconds
    from the first call's end to the last's."""
    (s0, w0, t0, p0), (s1, w1, t1, p1) = self.marks[0], self.marks[-1]
    return {'steps': s1 - s0, 'seconds': w1 - w0, 'host_seconds': t1 - t0,
            'cpu_seconds': p1 - p0}


class Meshfit(Variant):
  """`train_and_evaluate` in a fresh workdir per run, on `data`'s files.

  The prepared copy of the table and the compilation cache are kept in
  `workroot` for every run after the first (set-up is not timed).
  """

  def __init__(self, size: Size, data: Data, workroot: str, *,
               dtype: str = 'float32', members: int = 1,
               steps_per_call: int = 0,
               checkpoint_every_seconds: float | None = None,
               steps: int | None = None, wait_every: bool = False):
    self.name = 'meshfit'
    if dtype != 'float32':
      self.name += f' {dtype}'
    if members > 1:
      self.name += f', {members} members'
    if steps_per_call:
      self.name += (f', {steps_per_call} step'
                    f'{"s" if steps_per_call > 1 else ""} per call')
    if checkpoint_every_seconds is not None:
      self.name += (f', ckpt every {checkpoint_every_seconds:g} s'
                    if checkpoint_every_seconds else ', no ckpt')
    if steps:
      self.name += f', {steps:,} steps'
    if wait_every:
      self.name += ', every call waited for'
    self.fixed_steps = steps
    self._workroot = workroot
    self._checkpointing = bool(checkpoint_every_seconds)
    self._wait_every = wait_every
    self.config = default.get_config()
    c = self.config
    c.dataset.name = 'csv_regression'
    c.dataset.train_path, c.dataset.eval_path = data.train_path, data.eval_path
    c.dataset.target_columns = size.target_names
    c.dataset.data_dir = os.path.join(workroot, 'data')
    c.model.hidden_sizes = size.hidden_sizes
    c.model.dtype = dtype
    c.model.ensemble_size = members
    # Members split over as many devices as divide them; the rest of the
    # devices split each batch.
    c.mesh.members = math.gcd(members, jax.device_count())
    c.optimizer.name = 'adam'
    c.optimizer.schedule = 'constant'
    c.optimizer.learning_rate = LEARNING_RATE
    c.batch_size = size.batch_size
    c.eval_batch_size = size.batch_size
    c.steps_per_call = steps_per_call
    c.plots = False
    c.compilation_cache_dir = os.path.join(workroot, 'jax_cache')
    if checkpoint_every_seconds is not None:
      c.checkpoint_every_seconds = checkpoint_every_seconds
    # Count every checkpoint of the window afterwards.
    c.max_checkpoints_to_keep = 10**6
    # Checkpoints written inside each run's window (by the clock).
    self.checkpoints: list[int] = []
    # The window of each run (CallClock.window).
    self.windows: list[dict[str, float]] = []
    # The first call's steps (a run's window opens after it), once a run
    # has shown it.
    self._first = 0

  def _train(self, num_steps: int) -> tuple[int, dict[str, float]]:
    """A run of `self._first` steps and `num_steps` more: its first call's
    steps and the window after that call."""
    config = self.config.copy_and_resolve_references()
    config.num_train_steps = self._first + num_steps
    # One evaluation, after the last step.
    config.eval_every_steps = config.num_train_steps
    clock = CallClock(config.num_train_steps, self._wait_every)
    workdir = tempfile.mkdtemp(dir=self._workroot)
    try:
      train_and_evaluate(config, workdir, on_call=clock)
      first = clock.marks[0][0]
      if self._checkpointing:
        # Checkpoints inside the window (not the final one).
        self.checkpoints.append(len([
            d for d in os.listdir(os.path.join(workdir, 'checkpoints'))
            if d.isdigit() and first < int(d) < config.num_train_steps]))
    finally:
      shutil.rmtree(workdir, ignore_errors=True)
    return first, clock.window()

  def run(self, num_steps: int) -> float:
    # At least a second call as long as the first, so that the window holds
    # one: a run of fewer steps than a call is run again, longer.
    window = {'steps': 0}
    while not window['steps']:
      self._first, window = self._train(max(num_steps, self._first))
    self.windows.append(window)
    return window['seconds'] * num_steps / window['steps']


def _init_mlp(size: Size, seed: int = 0) -> list[tuple[jax.Array, jax.Array]]:
  keys = jax.random.split(jax.random.key(seed), len(size.layer_sizes) - 1)
  init = jax.nn.initializers.lecun_normal()
  return [(init(k, (a, b), jnp.float32), jnp.zeros((b,), jnp.float32))
          for k, a, b in zip(keys, size.layer_sizes[:-1],
                             size.layer_sizes[1:])]


def mlp_loss(params: Sequence[tuple[jax.Array, jax.Array]], x_BxF: jax.Array,
             y_BxT: jax.Array, dtype: jnp.dtype) -> jax.Array:
  """The benchmark MLP: dense layers multiplying in `dtype` (accumulating in
  float32) with ReLU between them, then the mean squared error."""
  h = x_BxF
  for i, (w, b) in enumerate(params):
    h = jax.lax.dot(h.astype(dtype), w.astype(dtype),
                    preferred_element_type=jnp.float32) + b
    if i < len(params) - 1:
      h = jax.nn.relu(h)
  return jnp.mean((h - y_BxT)**2)


def _adam_update(params, opt_state, x_BxF, y_BxT, *, dtype, tx, axis=None):
  loss, grads = jax.value_and_grad(mlp_loss)(params, x_BxF, y_BxT, dtype)
  if axis is not None:
    loss, grads = jax.lax.pmean((loss, grads), axis)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


class _UpdateLoop(Variant):
  """Steps a jitted or pmapped update over pre-placed batches."""

  def _inputs(self, i: int) -> tuple:
    """What step i takes beside the params and optimizer state."""
    return self._batches[i % len(self._batches)]

  def run(self, num_steps: int) -> float:
    # XLA:CPU's collectives need the work in flight bounded (several
    # devices): each step waits for the one two before it.
    pending = collections.deque()
    start = time.perf_counter()
    for i in range(num_steps):
      self._params, self._opt_state, loss = self._step(
          self._params, self._opt_state, *self._inputs(i))
      pending.append(loss)
      if len(pending) > 2:
        jax.block_until_ready(pending.popleft())
    jax.block_until_ready((self._params, loss))
    return time.perf_counter() - start


class MinimalJit(_UpdateLoop):
  """The floor: one jitted, donating step over device-resident batches."""

  def __init__(self, size: Size, data: Data, dtype: str = 'float32'):
    self.name = 'jit' if dtype == 'float32' else f'jit {dtype}'
    mesh = jax.make_mesh((jax.device_count(),), ('data',),
                         axis_types=(jax.sharding.AxisType.Auto,))
    replicated = NamedSharding(mesh, P())
    split = NamedSharding(mesh, P('data'))
    tx = optax.adam(LEARNING_RATE)
    self._params = jax.device_put(_init_mlp(size), replicated)
    self._opt_state = jax.device_put(tx.init(self._params), replicated)
    self._batches = [jax.device_put(b, split)
                     for b in data.batches(size.batch_size)]
    self._step = jax.jit(functools.partial(
        _adam_update, dtype=jnp.dtype(dtype), tx=tx), donate_argnums=(0, 1))
    self.run(2)


class MembersJit(_UpdateLoop):
  """The hand-written form of K members: their params stacked, one jitted,
  donating step vmapped over them, each member's batch drawn on the
  devices (uniform rows of the table held there), members split over the
  devices as meshfit splits them and each batch over the rest."""

  def __init__(self, size: Size, data: Data, members: int):
    self.name = f'jit, {members} members, batches drawn on device'
    split = math.gcd(members, jax.device_count())
    mesh = jax.make_mesh((split, jax.device_count() // split),
                         ('members', 'data'),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    by_member = NamedSharding(mesh, P('members'))
    batches = NamedSharding(mesh, P('members', 'data'))
    replicated = NamedSharding(mesh, P())
    tx = optax.adam(LEARNING_RATE)
    params = jax.tree.map(lambda *a: jnp.stack(a),
                          *[_init_mlp(size, seed) for seed in range(members)])
    self._params = jax.device_put(params, by_member)
    self._opt_state = jax.device_put(jax.vmap(tx.init)(params), by_member)
    x = jax.device_put(data.x_NxF, replicated)
    y = jax.device_put(data.y_NxT, replicated)
    update = jax.vmap(functools.partial(_adam_update,
                                        dtype=jnp.dtype(jnp.float32), tx=tx))
    shape = (members, size.batch_size)

    def step(params, opt_state, i):
      idx = jax.random.randint(jax.random.fold_in(jax.random.key(0), i),
                               shape, 0, x.shape[0])
      idx = jax.lax.with_sharding_constraint(idx, batches)
      params, opt_state, loss = update(params, opt_state, x[idx], y[idx])
      return params, opt_state, loss.mean()

    self._step = jax.jit(step, donate_argnums=(0, 1))
    self.run(2)

  def _inputs(self, i: int) -> tuple:
    return (np.int32(i),)  # the step draws its own batches from it


class Pmap(_UpdateLoop):
  """JAX 101: `pmap` with params replicated and gradients `pmean`'d."""

  def __init__(self, size: Size, data: Data):
    self.name = 'pmap'
    n = jax.local_device_count()
    tx = optax.adam(LEARNING_RATE)
    params = _init_mlp(size)
    opt_state = tx.init(params)
    to_devices = jax.pmap(lambda a: a)
    # As the tutorial does: a leading device axis, one copy per device.
    self._params, self._opt_state = to_devices(jax.tree.map(
        lambda a: jnp.stack([a] * n), (params, opt_state)))
    self._batches = [to_devices(jax.tree.map(
        lambda a: a.reshape((n, a.shape[0] // n) + a.shape[1:]), b))
                     for b in data.batches(size.batch_size)]
    self._step = jax.pmap(
        functools.partial(_adam_update, dtype=jnp.dtype(jnp.float32), tx=tx,
                          axis='batch'),
        axis_name='batch', donate_argnums=(0, 1))
    self.run(2)


class Torch(Variant):
  """PyTorch eager on CPU: nn.Sequential, Adam, MSE; bf16 via autocast.

  `threads` (0: the process's setting) applies while this variant runs.
  """

  def __init__(self, size: Size, data: Data, dtype: str = 'float32',
               threads: int = 0):
    import torch  # noqa: PLC0415  (optional)
    self.name = 'torch' if dtype == 'float32' else f'torch {dtype} autocast'
    if threads:
      self.name += f', {threads} thread{"s" if threads > 1 else ""}'
    self.dtype, self._threads, self._torch = dtype, threads, torch
    torch.manual_seed(0)
    layers = []
    sizes = size.layer_sizes
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
      layers.append(torch.nn.Linear(a, b))
      if i < len(sizes) - 2:
        layers.append(torch.nn.ReLU())
    self._model = torch.nn.Sequential(*layers)
    self._opt = torch.optim.Adam(self._model.parameters(), lr=LEARNING_RATE)
    self._batches = [(torch.from_numpy(np.ascontiguousarray(x)),
                      torch.from_numpy(np.ascontiguousarray(y)))
                     for x, y in data.batches(size.batch_size)]
    self.run(2)

  def run(self, num_steps: int) -> float:
    torch = self._torch
    threads = torch.get_num_threads()
    torch.set_num_threads(self._threads or threads)
    try:
      autocast = (torch.autocast('cpu', dtype=torch.bfloat16)
                  if self.dtype == 'bfloat16' else contextlib.nullcontext())
      start = time.perf_counter()
      for i in range(num_steps):
        x, y = self._batches[i % len(self._batches)]
        self._opt.zero_grad(set_to_none=True)
        with autocast:
          pred = self._model(x)
        loss = torch.nn.functional.mse_loss(pred.float(), y)
        loss.backward()
        self._opt.step()
      loss.item()
      return time.perf_counter() - start
    finally:
      torch.set_num_threads(threads)


def _matmul_peaks(have_torch: bool) -> dict[str, float]:
  """GFLOP/s of one square matmul, best of five, per library and dtype."""
  n = FLAGS.matmul_n
  flops = 2.0 * n**3
  rng = np.random.default_rng(0)
  a_np = rng.standard_normal((n, n), np.float32)
  b_np = rng.standard_normal((n, n), np.float32)
  out = {}

  def best(fn: Callable[[], Any]) -> float:
    fn()
    times = []
    for _ in range(5):
      start = time.perf_counter()
      fn()
      times.append(time.perf_counter() - start)
    return flops / min(times) / 1e9

  a, b = jnp.asarray(a_np), jnp.asarray(b_np)
  f32 = jax.jit(lambda a, b: a @ b)
  out['XLA f32'] = best(lambda: f32(a, b).block_until_ready())
  a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
  bf16 = jax.jit(lambda a, b: jax.lax.dot(
      a, b, preferred_element_type=jnp.float32))
  out['XLA bf16 -> f32 acc'] = best(lambda: bf16(a16, b16).block_until_ready())
  if have_torch:
    import torch  # noqa: PLC0415
    ta, tb = torch.from_numpy(a_np), torch.from_numpy(b_np)
    out['torch f32'] = best(lambda: ta @ tb)
    ta16, tb16 = ta.bfloat16(), tb.bfloat16()
    out['torch bf16'] = best(lambda: ta16 @ tb16)
  return out


# ---------------------------------------------------------------------------
# Rounds.


def _calibrate(variant: Variant, max_steps: int, seconds: float,
               min_steps: int) -> int:
  """Steps that take `variant` about `seconds` (min_steps to max_steps)."""
  n = min(10, max_steps)
  while True:
    elapsed = variant.run(n)
    if elapsed >= 0.2 * seconds or n >= max_steps:
      break
    n = min(max_steps, n * 4)
  return max(min_steps, min(max_steps, round(n * seconds / elapsed)))


def run_rounds(variants: Sequence[Variant], num_steps: int, repeats: int,
               peaks: dict[str, list[float]], have_torch: bool,
               seconds: float | None
               ) -> tuple[dict[str, list[float]], dict[str, int]]:
  """steps/s of each variant per round, interleaved.

  Returns:
    steps/s per variant and round, and the steps each variant ran per round.
  """
  # A few steps at least, whatever they take: one step is all noise.
  counts = {v.name: v.fixed_steps or (
      num_steps if seconds is None else
      _calibrate(v, num_steps, seconds, min_steps=min(num_steps, 3)))
            for v in variants}

  def timed(v: Variant) -> Callable[[], float]:
    return lambda: counts[v.name] / v.run(counts[v.name])
  def peak() -> float:
    for name, gflops in _matmul_peaks(have_torch).items():
      peaks.setdefault(name, []).append(gflops)
    return 0.0
  # The peak once per round too, among the variants: "of peak" divides by
  # the best of them.
  runs = {'matmul peak': peak, **{v.name: timed(v) for v in variants}}
  rates = bench_common.interleaved(runs, repeats)
  del rates['matmul peak']
  return rates, counts


def _ratio(rates: dict[str, list[float]], a: str, b: str) -> float | None:
  """best(a) / best(b): each variant's least disturbed round."""
  if a not in rates or b not in rates:
    return None
  return max(rates[a]) / max(rates[b])


def _fmt(x: float | None) -> str:
  return '-' if x is None else f'{x:.2f}x'


# ---------------------------------------------------------------------------
# Sections.


def size_variants(size: Size, data: Data, sections: Sequence[str],
                  workroot: str, have_torch: bool) -> list[Variant]:
  """Every variant of `size` that the chosen sections need."""
  v = []
  if {'main', 'precision', 'checkpoint'} & set(sections):
    v.append(Meshfit(size, data, workroot))
    v.append(MinimalJit(size, data))
  if {'main', 'precision'} & set(sections) and have_torch:
    v.append(Torch(size, data))
  if 'main' in sections:
    v.append(Meshfit(size, data, workroot, steps_per_call=1))
    v.append(Pmap(size, data))
    if have_torch:
      # Immune to the spinning of OpenMP threads on a shared machine.
      v.append(Torch(size, data, threads=1))
  if 'precision' in sections:
    v.append(Meshfit(size, data, workroot, dtype='bfloat16'))
    v.append(MinimalJit(size, data, dtype='bfloat16'))
    if have_torch:
      v.append(Torch(size, data, dtype='bfloat16'))
  if 'checkpoint' in sections:
    for every in (0.0, CHECKPOINT_SECONDS):
      v.append(Meshfit(size, data, workroot, checkpoint_every_seconds=every,
                       steps=FLAGS.steps or size.checkpoint_steps))
  return v


def size_report(size: Size, res: dict[str, Any],
                peaks: dict[str, float]) -> str:
  """The main, precision and checkpoint tables of one size."""
  rates, counts = res['rates'], res['counts']
  peak_f32 = max(v for k, v in peaks.items() if 'bf16' not in k)
  peak_bf16 = max(v for k, v in peaks.items() if 'bf16' in k)
  out = [f'\n### {size.name}: {" -> ".join(map(str, size.layer_sizes))}, '
         f'batch {size.batch_size}, {size.num_params:,} params, '
         f'best of {res["repeats"]} rounds\n']
  rows = []
  for name, r in rates.items():
    best = max(r)
    gflops = best * size.flops_per_step / 1e9
    peak = peak_bf16 if 'bfloat16' in name else peak_f32
    rows.append([name, f'{counts[name]:,}', number(best),
                 number(statistics.median(r)),
                 f'{best * size.batch_size:,.0f}', number(gflops),
                 f'{100 * gflops / peak:.1f}%',
                 _fmt(_ratio(rates, name, 'jit')),
                 _fmt(_ratio(rates, name, 'pmap')),
                 _fmt(_ratio(rates, name, 'torch')),
                 _fmt(_ratio(rates, name, 'torch, 1 thread'))])
  out.append(markdown_table(
      ['variant', 'steps', 'steps/s', 'median', 'examples/s', 'GFLOP/s',
       'of peak', 'x jit', 'x pmap', 'x torch', 'x torch 1t'], rows))

  extra = []
  one_step = 'meshfit, 1 step per call'
  if one_step in rates:
    extra.append(['meshfit (calls of many steps) / meshfit, 1 step per call',
                  _fmt(_ratio(rates, 'meshfit', one_step))])
  for name in ('meshfit', 'jit', 'torch'):
    for bf16 in [n for n in rates if n.startswith(f'{name} bfloat16')]:
      extra.append([f'{bf16} / {name}', _fmt(_ratio(rates, bf16, name))])
  steps = FLAGS.steps or size.checkpoint_steps
  base = f'meshfit, no ckpt, {steps:,} steps'
  ckpt = f'meshfit, ckpt every {CHECKPOINT_SECONDS:g} s, {steps:,} steps'
  if ckpt in rates:
    ratio = _ratio(rates, ckpt, base)
    window = steps / max(rates[ckpt])  # seconds
    saves = res.get('checkpoints') or [0]
    per_save = (window - steps / max(rates[base])) / max(
        statistics.median(saves), 1)
    default_seconds = default.get_config().checkpoint_every_seconds
    extra.append([f'{ckpt} / no ckpt (cost {100 * (1 - ratio):.1f}%; '
                  f'{min(saves)} to {max(saves)} checkpoints in its '
                  f'{window:.1f} s)', _fmt(ratio)])
    if max(saves):
      extra.append([f'one save costs training {1e3 * per_save:.0f} ms; at '
                    'the default checkpoint_every_seconds='
                    f'{default_seconds:g}: cost',
                    f'{100 * per_save / default_seconds:.2f}%'])
  if extra:
    out.append('\n' + markdown_table(['ratio', 'value'], extra))
  return '\n'.join(out)


def members_section(size: Size, data: Data, members: Sequence[int],
                    workroot: str, repeats: int, peaks: dict[str, list[float]],
                    have_torch: bool) -> dict[str, Any]:
  """For each ensemble size, meshfit as it runs, with every call waited
  for (the device's time), and the hand-written jitted loop of as many
  members (`MembersJit`), interleaved."""
  variants = {}
  for m in members:
    variants[m] = (Meshfit(size, data, workroot, members=m),
                   Meshfit(size, data, workroot, members=m, wait_every=True))
  loops = {m: MembersJit(size, data, m) for m in members}
  flat = [v for pair in variants.values() for v in pair]
  if FLAGS.steps:
    counts = {v.name: FLAGS.steps for v in flat}
  else:
    counts = {}
    for free, waited in variants.values():
      # Calibrated on the run as it is; its waited twin runs as many steps.
      counts[free.name] = _calibrate(free, size.default_steps,
                                     FLAGS.seconds, min_steps=3)
      counts[waited.name] = counts[free.name]
  for v in flat:
    v.windows.clear()
    v.fixed_steps = counts[v.name]
  for m, loop in loops.items():
    loop.fixed_steps = counts[variants[m][0].name]
  rates, _ = run_rounds(flat + list(loops.values()), 0, repeats, peaks,
                        have_torch, None)
  rows = {}
  for m, (free, waited) in variants.items():
    fast = max(free.windows, key=lambda w: w['steps'] / w['seconds'])
    # The host's work in the fastest run; the waited run's device time is
    # its wall less its host's.
    host_us = 1e6 * fast['host_seconds'] / fast['steps']
    waited_us = [1e6 * (w['seconds'] - w['host_seconds']) / w['steps']
                 for w in waited.windows]
    rows[str(m)] = {
        'devices': free.config.mesh.members, 'steps': counts[free.name],
        'steps_per_s': rates[free.name],
        'jit_steps_per_s': rates[loops[m].name],
        'host_us': host_us, 'device_us': max(min(waited_us), 0.0),
        'host_share': fast['host_seconds'] / fast['seconds'],
        'cores': fast['cpu_seconds'] / fast['seconds']}
  return {'size': size.name, 'repeats': repeats, 'members': rows}


def members_report(res: dict[str, Any], peak_f32: float) -> str:
  """The ensembles' speed beside one model's, and the host's share."""
  size = SIZES[res['size']]
  one = res['members'].get('1')
  one_rate = max(one['steps_per_s']) if one else None
  rows = []
  for m, info in res['members'].items():
    k = int(m)
    rate = max(info['steps_per_s'])
    gflops = rate * k * size.flops_per_step / 1e9
    host, device = info['host_us'], info['device_us']
    rows.append([m, str(info['devices']), f'{info["steps"]:,}', number(rate),
                 number(statistics.median(info['steps_per_s'])),
                 f'{rate * k * size.batch_size:,.0f}',
                 _fmt(None if one_rate is None else rate * k / one_rate),
                 number(gflops), f'{100 * gflops / peak_f32:.1f}%',
                 f'{info["cores"]:.2f}', f'{host:,.1f}', f'{device:,.1f}',
                 f'{100 * info["host_share"]:.0f}%',
                 _fmt(rate / max(info['jit_steps_per_s']))])
  return '\n'.join([
      f'\n### Members ({size.name}: {" -> ".join(map(str, size.layer_sizes))}'
      f', batch {size.batch_size} per member, {size.num_params:,} params per '
      f'member; best of {res["repeats"]} rounds)\n',
      'model-examples/s is members x batch x steps/s; cores busy is process '
      'CPU / wall; host us/step is the loop thread\'s CPU time a step, '
      'host share that over the wall time of a step (near 100%: the host is '
      'the bound); device us/step is the wall time of a step with every '
      'call waited for, less the host\'s; x jit loop is steps/s over '
      'that of the hand-written jitted loop of as many members, their '
      'batches drawn on the devices (best rounds).\n',
      markdown_table(['members', 'devices', 'steps', 'steps/s', 'median',
                      'model-examples/s', 'x 1 member', 'GFLOP/s', 'of peak',
                      'cores busy', 'host us/step', 'device us/step',
                      'host share', 'x jit loop'], rows)])


def first_minute(scratch: str) -> list[list[str]]:
  """configs/csv.py on --train: train then predict, fresh processes, cold,
  warm and warm as typed (no --verbose: its phases are not read)."""
  cache, data = os.path.join(scratch, 'cache'), os.path.join(scratch, 'data')
  rows = []
  for kind in ('cold', 'warm', 'as typed'):
    workdir = os.path.join(scratch, f'{kind.replace(" ", "_")}_run')
    verbose = [] if kind == 'as typed' else ['--verbose']
    run = bench_common.checked(bench_common.train_py([
        '--config=configs/csv.py', f'--workdir={workdir}',
        f'--config.dataset.train_path={FLAGS.train}',
        f'--config.dataset.eval_path={FLAGS.test}',
        f"--config.dataset.target_columns=('{FLAGS.target}',)",
        f'--config.dataset.data_dir={data}',
        f'--config.compilation_cache_dir={cache}', *verbose]))
    marks = [0.0] + [bench_common.first_log(run, p) for p in (
        r'JAX process', r'Sized to', r'Training steps',
        r'\] \[\d+\] train/', r'Done:')] + [run.seconds]
    predict = bench_common.checked(bench_common.train_py([
        '--mode=predict', f'--workdir={workdir}', f'--input={FLAGS.test}',
        f'--output={os.path.join(scratch, "predictions.csv")}']))
    step = re.search(r'Done: (?:best )?step (\d+)', run.output)
    spans = ([f'{b - a:.2f}' if a is not None and b is not None else '?'
              for a, b in zip(marks, marks[1:])] if verbose
             else ['-'] * (len(marks) - 1))
    rows.append([kind, f'{run.seconds + predict.seconds:.2f}',
                 f'{run.seconds:.2f}', *spans, f'{predict.seconds:.2f}',
                 step[1] if step else '?'])
  return rows


FIRST_MINUTE_HEADER = ['run', 'train + predict, s', 'train, s', 'imports',
                       'prepare', 'set up', 'first call', 'training',
                       'after the last step', 'predict, s', 'model step']


def main(argv: Sequence[str]) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)
  bad = (set(FLAGS.sizes) - set(SIZES) or set(FLAGS.sections) - set(SECTIONS)
         or {FLAGS.members_size} - set(SIZES)
         or {m for m in FLAGS.members if not m.isdigit() or int(m) < 1})
  if bad:
    sys.exit(f'error: unknown {sorted(bad)}; sizes: {", ".join(SIZES)}; '
             f'sections: {", ".join(SECTIONS)}')
  try:
    import torch  # noqa: PLC0415
    have_torch = True
    if FLAGS.torch_threads:
      torch.set_num_threads(FLAGS.torch_threads)
  except ImportError:
    have_torch = False
    print('note: torch is not installed, so the PyTorch rows are skipped '
          '(pip install -r requirements-bench.txt adds it).')
  print(bench_common.machine(), flush=True)
  load_before = bench_common.load_average()
  workroot = tempfile.mkdtemp(prefix='meshfit_speed_')
  results = {'machine': bench_common.machine(), 'command': ' '.join(sys.argv),
             'peaks': {}, 'sizes': {}}
  report = []
  try:
    if {'main', 'precision', 'checkpoint'} & set(FLAGS.sections):
      for size_name in FLAGS.sizes:
        size = SIZES[size_name]
        print(f'{size_name}: setting up...', flush=True)
        variants = size_variants(size, make_data(size, workroot),
                                 FLAGS.sections, workroot, have_torch)
        rates, counts = run_rounds(
            variants, FLAGS.steps or size.default_steps, FLAGS.repeats,
            results['peaks'], have_torch,
            None if FLAGS.steps else FLAGS.seconds)
        res = {'counts': counts, 'repeats': FLAGS.repeats, 'rates': rates}
        for v in variants:
          if getattr(v, 'checkpoints', None):
            res['checkpoints'] = v.checkpoints
        results['sizes'][size_name] = res
    if 'members' in FLAGS.sections:
      size = SIZES[FLAGS.members_size]
      print(f'{size.name}: members {", ".join(FLAGS.members)}...', flush=True)
      results['members'] = members_section(
          size, make_data(size, workroot), [int(m) for m in FLAGS.members],
          workroot, FLAGS.repeats, results['peaks'], have_torch)
    if 'first_minute' in FLAGS.sections:
      print(f'first minute of {FLAGS.train}...', flush=True)
      results['first_minute'] = first_minute(workroot)
  finally:
    shutil.rmtree(workroot, ignore_errors=True)
  results['load_average'] = [load_before, bench_common.load_average()]
  print(f'\n{results["machine"]}\n1-minute load average {load_before:.1f} '
        f'before, {results["load_average"][1]:.1f} after (other processes '
        'share the cores: compare ratios, not absolute rates).\n')
  peaks = {k: max(v) for k, v in results['peaks'].items()}
  if peaks:
    report.append(f'Matmul peak ({FLAGS.matmul_n}^3, best of every round):\n')
    report.append(markdown_table(['matmul', 'GFLOP/s'],
                                 [[k, f'{v:.0f}'] for k, v in peaks.items()]))
  for size_name, res in results['sizes'].items():
    report.append(size_report(SIZES[size_name], res, peaks))
  if 'members' in results:
    report.append(members_report(
        results['members'],
        max(v for k, v in peaks.items() if 'bf16' not in k)))
  if 'first_minute' in results:
    report.append(f'\n### First minute: {FLAGS.train}, configs/csv.py, train '
                  'then predict, each a fresh train.py process\n')
    report.append(markdown_table(FIRST_MINUTE_HEADER,
                                 results['first_minute']))
  print('\n'.join(report))
  if FLAGS.json:
    with open(FLAGS.json, 'w', encoding='utf-8') as f:
      json.dump(results, f, indent=1)


if __name__ == '__main__':
  app.run(main)
