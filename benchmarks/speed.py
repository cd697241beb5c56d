"""Training speed of meshfit beside the alternatives, measured side by side.

For each model size, the same MLP, batch, optimizer (Adam, constant learning
rate) and number of steps run through:

  meshfit        `loop.train_and_evaluate` itself: its input pipeline,
                 loss watch, metrics, logging and checkpoint checks
  jit            a minimal hand-written `jax.jit` step over device-resident
                 batches: the zero-framework floor
  pmap           the JAX 101 tutorial's update: params replicated, the batch
                 split over devices, gradients `pmean`'d
  torch          PyTorch eager on CPU (optional: requirements-bench.txt)

plus bfloat16-compute variants, meshfit with checkpoints by the clock, the
input pipeline alone and, but for large (whose calls are single steps), a
ladder from meshfit's bare jitted calls (1 step each, then as many as meshfit
runs per call) to its whole loop. The norm section times the logged gradient
norm of each size both ways `steps.global_norm` can compute it. The members
section trains ensembles of --members models of --members_size (each on its
own batch) through meshfit's jitted calls, against one model, and splits
their step into its matmuls, Adam's update, the input pipeline and the rest;
with several devices, each ensemble's members split over as many as divide
them (a single model on one device).
Time to the first step (cold, warm and without the persistent compilation
cache) is measured in fresh processes.

Every variant runs once per round and the rounds interleave them (the start
rotates), so slow drifts in the load of other processes reach all of them.
Bursts do not, so each variant is reported at its best round (its least
disturbed one; the median is printed beside it) and every ratio is one of
bests, like `timeit`'s minimum.
Times are steady state: compilation and warm-up steps are excluded. meshfit
runs the size's steps per round (so its window holds logs and checkpoints);
the other variants run as many steps as take about --seconds.

    python benchmarks/speed.py                      # everything, ~10 minutes
    python benchmarks/speed.py --sizes=small --repeats=2 --sections=main

It runs on the process's devices: one CPU device by default.
`XLA_FLAGS=--xla_force_host_platform_device_count=N` splits the CPU into N
virtual devices (meshfit, jit and pmap then run data-parallel over them).

meshfit is run through its public seams: `train_and_evaluate` is handed
in-memory random tables of each size's shape (`splits=`; there is no
784-feature dataset) and an observer of its train calls (`on_call=`, which
timestamps each call, waiting for the two that end the timed window: its
first call, which compiles, is not timed). Nothing of meshfit is replaced.
"""

import contextlib
import dataclasses
import functools
import itertools
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

# Before TensorFlow / TFDS are imported: keep everything local and quiet.
os.environ.setdefault('NO_GCE_CHECK', 'true')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
from meshfit.parallel import xla_flags  # noqa: E402  (imports no jax)

# meshfit's XLA flags, as train.py sets them; every variant of this process
# runs under them (the jit and pmap loops too: compare like with like).
xla_flags.apply()

from absl import app, flags, logging  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from bench_common import markdown_table, mlp_loss  # noqa: E402
from configs import default  # noqa: E402
from input_pipeline import tables  # noqa: E402
from input_pipeline.tables import Table  # noqa: E402
from meshfit import config as config_lib
from meshfit.data import feeding, splits as splits_lib
from meshfit.model import optim, state as state_lib, steps
from meshfit.parallel import in_flight, sharding
from meshfit.train import call_plan, loop
from meshfit.data.features import FeatureStats, InputLayout  # noqa: E402
from meshfit.model.setup import make_setup  # noqa: E402
from models import low_precision, mlp  # noqa: E402

SECTIONS = ('main', 'precision', 'checkpoint', 'pipeline', 'breakdown',
            'norm', 'first_step', 'members')

FLAGS = flags.FLAGS
flags.DEFINE_list('sizes', ['tiny', 'small', 'medium', 'large'],
                  'Model sizes to run.')
flags.DEFINE_integer('steps', None, 'Timed steps of the meshfit runs per '
                     'round (default: per size); also the most any other '
                     'variant runs.')
flags.DEFINE_float('seconds', 0.5, 'Rough time of each non-meshfit variant '
                   'per round: its steps are calibrated to it once.')
flags.DEFINE_integer('repeats', 4, 'Rounds; each runs every variant once.')
flags.DEFINE_list('sections', list(SECTIONS),
                  f'Any of {", ".join(SECTIONS)}.')
flags.DEFINE_string('first_step_size', 'small',
                    'Model size of the time-to-first-step section.')
flags.DEFINE_list('members', ['1', '8', '32', '128'],
                  'Ensemble sizes of the members section.')
flags.DEFINE_string('members_size', 'small',
                    'Model size of the members section.')
flags.DEFINE_integer('torch_threads', 0, 'torch.set_num_threads for the '
                     'PyTorch rows; 0 keeps its default (one per core). Its '
                     'OpenMP threads spin at barriers and slow down badly '
                     'when other processes take cores.')
flags.DEFINE_string('json', None, 'Also write every measurement here.')
flags.DEFINE_string('first_step_child', None, 'Internal: run one timed '
                    'start-up in this process (JSON: size, cache_dir).')

LEARNING_RATE = 1e-3
# Distinct batches cycled through by the loops over in-memory arrays; the
# meshfit tables hold this many batches' worth of rows.
NUM_BATCHES = 8
MATMUL_N = 2048  # square matmul of the peak measurement
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
  # Steps of the checkpoint comparison: ~10 s, so that it measures the
  # steady cost of checkpoints every CHECKPOINT_SECONDS (several of them)
  # rather than one save's latency.
  checkpoint_steps: int
  # The ladder: meshfit's jitted calls alone (its program's cost apart from
  # its loop's). Large calls are single steps, already the meshfit row.
  breakdown: bool = True

  @property
  def layer_sizes(self) -> tuple[int, ...]:
    return (self.num_features, *self.hidden_sizes, self.num_targets)

  @property
  def num_params(self) -> int:
    return mlp.num_params(self.layer_sizes)

  @property
  def flops_per_step(self) -> float:
    # Forward 2 flops per weight and example, backward 4.
    return 6.0 * self.num_params * self.batch_size


# Default steps: windows of ~0.3 s or more; a best of a few shorter ones
# (1,000 tiny steps take ~10 ms) rewards whichever variant got lucky.
SIZES = {s.name: s for s in (
    Size('tiny', 1, (), 1, 128, default_steps=20_000,
         checkpoint_steps=600_000),
    Size('small', 10, (64, 64), 1, 256, default_steps=4000,
         checkpoint_steps=80_000),
    Size('medium', 10, (512, 512), 1, 1024, default_steps=100,
         checkpoint_steps=1_000),
    Size('large', 784, (2048,) * 3, 10, 2048, default_steps=3,
         checkpoint_steps=15, breakdown=False),
)}


@dataclasses.dataclass(frozen=True)
class Data:
  """A random regression table of `size`'s shape, on the host."""
  x_NxF: np.ndarray
  y_NxT: np.ndarray

  def batches(self, batch_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(self.x_NxF[i:i + batch_size], self.y_NxT[i:i + batch_size])
            for i in range(0, self.x_NxF.shape[0], batch_size)]

  def splits(self, eval_rows: int) -> splits_lib.Splits:
    f, t = self.x_NxF.shape[1], self.y_NxT.shape[1]

    def table(rows: slice) -> Table:
      return Table(self.x_NxF[rows], self.y_NxT[rows],
                   tables.generated_plan(f, t))
    return splits_lib.Splits(train=table(slice(None)),
                       eval=table(slice(0, eval_rows)))


def make_data(size: Size, seed: int = 0) -> Data:
  rng = np.random.default_rng(seed)
  n = NUM_BATCHES * size.batch_size
  x_NxF = rng.standard_normal((n, size.num_features), np.float32)
  w_FxT = rng.standard_normal((size.num_features, size.num_targets))
  y_NxT = np.tanh(x_NxF @ w_FxT) + 0.1 * rng.standard_normal(
      (n, size.num_targets))
  return Data(x_NxF, y_NxT.astype(np.float32))


# ---------------------------------------------------------------------------
# The variants. Each is set up (and compiled) once; `run(n)` then returns the
# seconds that n steady-state steps take.


class Variant:
  """A way to train; `run(n)` times n steps after set-up and warm-up."""
  name: str
  dtype: str = 'float32'
  # Runs exactly the size's steps (a window that holds logs and checkpoints)
  # rather than a number calibrated to --seconds.
  fixed_steps: bool = False
  # Calibrated steps may exceed the size's steps this many times.
  max_steps_factor: int = 1

  def run(self, num_steps: int) -> float:
    raise NotImplementedError

  def close(self) -> None:
    pass


class _Bounded:
  """meshfit's bound on dispatched work (`in_flight`), where XLA:CPU's
  collectives need it (several devices), or `always`."""

  def __init__(self, always: bool = False):
    self._pending = (in_flight.InFlight()
                     if always or jax.device_count() > 1 else None)

  def add(self, output: Any) -> None:
    if self._pending is not None:
      self._pending.add(output)
      for done in self._pending.excess():
        jax.block_until_ready(done)

  def drain(self) -> None:
    if self._pending is not None:
      for done in self._pending.drain():
        jax.block_until_ready(done)


def _steps_per_call(config, size: Size, members: int = 1) -> int:
  """meshfit's call length for `members` models of `size` (one process:
  checkpoints written in the background end no call)."""
  return call_plan.choose_steps_per_call(
      config.steps_per_call, size.flops_per_step * members,
      jax.devices()[0].platform,
      (config.log_every_steps, config.eval_every_steps))


def _first_call(config, size: Size) -> int:
  """The steps of meshfit's first call under `config` (one process: the
  first due checkpoint ends it, as the saver is idle then)."""
  return next(call_plan.plan_calls(
      0, config.num_train_steps, _steps_per_call(config, size),
      periods=(config.log_every_steps, config.eval_every_steps,
               config.checkpoint_every_steps)))


def _meshfit_config(size: Size, *, dtype: str, num_train_steps: int | None,
                    checkpoint_every_seconds: float | None, cache_dir: str):
  config = default.get_config()
  config.model.hidden_sizes = size.hidden_sizes
  config.model.dtype = dtype
  config.optimizer.name = 'adam'
  config.optimizer.schedule = 'constant'
  config.optimizer.learning_rate = LEARNING_RATE
  config.batch_size = size.batch_size
  config.eval_batch_size = size.batch_size
  # One evaluation, after the last step; checkpoints by the clock as asked,
  # else the defaults (none by step count, one every
  # checkpoint_every_seconds, longer than any window here), and the final
  # one after the timed window.
  big = 10**9  # no event before the run's end (None: decided by the caller)
  config.num_train_steps = num_train_steps or big
  config.eval_every_steps = num_train_steps or big
  if checkpoint_every_seconds is not None:
    config.checkpoint_every_seconds = checkpoint_every_seconds
  config.compilation_cache_dir = cache_dir
  return config


class _StopTraining(Exception):
  """Raised by the call observer to end a start-up measurement early."""


def call_timer(step_times: list[float], wait_at: Sequence[int] = (),
               stop_after: int | None = None) -> loop.CallObserver:
  """An observer of meshfit's train calls that timestamps each one.

  Args:
    step_times: gets one `time.perf_counter()` per call (of up to
      `steps_per_call` steps).
    wait_at: steps (of a fresh run) at which a call's results are waited
      for before its timestamp: the ends of a timed window. Other calls are
      timestamped as they are dispatched (the loop itself keeps them within
      two calls of done).
    stop_after: raise `_StopTraining` after this many calls.
  """
  def observe(step: int, losses: jax.Array) -> None:
    if step in wait_at:
      jax.block_until_ready(losses)
    step_times.append(time.perf_counter())
    if stop_after is not None and len(step_times) >= stop_after:
      raise _StopTraining
  return observe


class Meshfit(Variant):
  """`loop.train_and_evaluate` in a fresh workdir per run."""

  def __init__(self, size: Size, data: Data, workroot: str, cache_dir: str,
               dtype: str = 'float32',
               checkpoint_every_seconds: float | None = None,
               steps: int | None = None):
    self.name = 'meshfit'
    if dtype != 'float32':
      self.name += f' {dtype}'
    if checkpoint_every_seconds is not None:
      self.name += (f' ckpt every {checkpoint_every_seconds:g} s'
                    if checkpoint_every_seconds else ' no ckpt')
    if steps:
      self.name += f', {steps:,} steps'
    self.dtype = dtype
    self.fixed_steps = True
    self.steps = steps  # None: the round's number
    self._size, self._workroot, self._cache_dir = size, workroot, cache_dir
    self._checkpoint_every_seconds = checkpoint_every_seconds
    # Checkpoints written inside each run's timed window (by the clock).
    self.checkpoints: list[int] = []
    self._splits = data.splits(eval_rows=size.batch_size)

  def run(self, num_steps: int) -> float:
    # The first call (compilation, prefetch fill) is not timed.
    config = _meshfit_config(
        self._size, dtype=self.dtype, num_train_steps=None,
        checkpoint_every_seconds=self._checkpoint_every_seconds,
        cache_dir=self._cache_dir)
    first = _first_call(config, self._size)
    config.num_train_steps = first + num_steps
    config.eval_every_steps = config.num_train_steps
    config.max_checkpoints_to_keep = 10**6  # count them all afterwards
    workdir = tempfile.mkdtemp(dir=self._workroot)
    times = []
    try:
      # From the first call done to the last call done: num_steps steps.
      loop.train_and_evaluate(
          config, workdir, splits=self._splits,
          on_call=call_timer(times, wait_at=(first, config.num_train_steps)))
      if self._checkpoint_every_seconds:
        # Checkpoints inside the window (not the final one): every one the
        # clock asked for is written.
        self.checkpoints.append(len({
            int(d) for d in os.listdir(os.path.join(workdir, 'checkpoints'))
            if d.isdigit() and first < int(d) < config.num_train_steps}))
    finally:
      shutil.rmtree(workdir, ignore_errors=True)
    return times[-1] - times[0]


def _init_mlp(size: Size, seed: int = 0) -> list[tuple[jax.Array, jax.Array]]:
  keys = jax.random.split(jax.random.key(seed), len(size.layer_sizes) - 1)
  init = jax.nn.initializers.lecun_normal()
  return [(init(k, (a, b), jnp.float32), jnp.zeros((b,), jnp.float32))
          for k, a, b in zip(keys, size.layer_sizes[:-1],
                             size.layer_sizes[1:])]


def _matmul(dtype: jnp.dtype, low_precision_grads: bool):
  """A dense layer's `x @ w` in `dtype`, accumulated in float32; with
  `low_precision_grads`, models/low_precision.py's (its backward dots in `dtype` too,
  the weight gradient's in the form XLA:CPU keeps bfloat16)."""
  if low_precision_grads:
    return functools.partial(low_precision.low_precision_matmul, dtype=dtype)
  return lambda h, w: jax.lax.dot(h.astype(dtype), w.astype(dtype),
                                  preferred_element_type=jnp.float32)


def _adam_update(params, opt_state, x_BxF, y_BxT, *, dtype, tx, axis=None,
                 low_precision_grads=False):
  loss, grads = jax.value_and_grad(mlp_loss)(
      params, x_BxF, y_BxT, _matmul(dtype, low_precision_grads))
  if axis is not None:
    loss, grads = jax.lax.pmean((loss, grads), axis)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


class _UpdateLoop(Variant):
  """Steps a jitted or pmapped update over pre-placed batches."""

  def run(self, num_steps: int) -> float:
    bounded = _Bounded()
    start = time.perf_counter()
    for i in range(num_steps):
      x, y = self._batches[i % len(self._batches)]
      self._params, self._opt_state, loss = self._step(
          self._params, self._opt_state, x, y)
      bounded.add(loss)
    jax.block_until_ready((self._params, loss))
    return time.perf_counter() - start


class MinimalJit(_UpdateLoop):
  """The floor: one jitted, donating step over device-resident batches."""

  def __init__(self, size: Size, data: Data, dtype: str = 'float32',
               low_precision_grads: bool = False):
    self.name = 'jit' if dtype == 'float32' else f'jit {dtype}'
    if low_precision_grads:
      self.name = f'proto: {self.name}, {dtype} backward dots'
    self.dtype = dtype
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
        _adam_update, dtype=jnp.dtype(dtype), tx=tx,
        low_precision_grads=low_precision_grads), donate_argnums=(0, 1))
    self.run(2)



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
    self.dtype = dtype
    self._threads = threads
    self._torch = torch
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
      return self._run(num_steps)
    finally:
      torch.set_num_threads(threads)

  def _run(self, num_steps: int) -> float:
    torch = self._torch
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


def _member_devices(members: int) -> list[jax.Device]:
  """The devices an ensemble of `members` trains on in the members section:
  one per member group, as many as divide it (one for a single model, which
  data parallelism over CPU devices slows down with an all-reduce a step)."""
  return jax.devices()[:math.gcd(members, jax.device_count())]


class _MeshfitParts:
  """meshfit's set-up, state and input pipeline, without its loop, as
  `loop.train_and_evaluate` makes them for an ensemble of `members`.

  On every device with batches split over them (the default mesh), or with
  `devices`, on those with the members split over them (`mesh.members`).
  """

  def __init__(self, size: Size, data: Data, members: int = 1,
               optimizer: str = 'adam',
               devices: Sequence[jax.Device] | None = None):
    config = _meshfit_config(size, dtype='float32', num_train_steps=None,
                             checkpoint_every_seconds=None, cache_dir='')
    config.model.ensemble_size = members
    config.optimizer.name = optimizer
    mesh = None
    if devices is not None:
      config.mesh.members, config.mesh.data = len(devices), 1
      mesh = sharding.make_mesh(1, 1, devices, members=len(devices))
    self.config = config_lib.parse(config)
    self.data, self.size, self.members = data, size, members
    self.layout = InputLayout.numbers(size.num_features)
    self.setup = make_setup(self.config, self.layout,
                                    size.num_targets, mesh)
    self.stats = FeatureStats.fit(self.layout, data.x_NxF, data.y_NxT)
    self.state = state_lib.create_train_state(
        self.setup.arch, self.setup.tx, self.setup.mesh, self.config.seed,
        self.stats, optim.Hyperparameters.of(self.config))
    self.table_ = data.splits(0).train
    self.resident = feeding.fits_on_device(
        self.table_, self.config.dataset.resident_table_mb)

  def feed(self, steps_per_call: int) -> feeding.TrainFeed:
    """The training loop's feed (`chunks(itertools.repeat(k))` draws calls
    of k steps)."""
    return feeding.TrainFeed(
        self.table_, batch_size=self.size.batch_size,
        seed=self.config.seed, mesh=self.setup.mesh,
        steps_per_call=steps_per_call, resident=self.resident,
        prefetch=self.config.dataset.prefetch_batches, members=self.members)

  def table(self, feed: feeding.TrainFeed) -> dict[str, jax.Array]:
    if not self.resident:
      return {}
    return steps.jit_encode(self.setup.mesh, self.layout)(
        self.stats, feed.device_table())


class Pipeline(Variant):
  """meshfit's input pipeline alone: the batches of each call on device.

  The TrainFeed's chunks plus what the jitted call does with them before
  the model sees a batch (gathering the rows of the resident table, or
  encoding streamed rows), for every batch of the call; nothing trained.
  """

  def __init__(self, size: Size, data: Data, members: int = 1,
               devices: Sequence[jax.Device] | None = None):
    self.name = 'input pipeline alone'
    if members > 1:
      self.name += f', {members} members'
    self.max_steps_factor = 100  # a batch costs far less than a step
    self._parts = _MeshfitParts(size, data, members, devices=devices)
    self._k = _steps_per_call(self._parts.config, size, members)
    chunk_sharding = sharding.chunk_sharding(self._parts.setup.mesh)
    layout = self._parts.layout

    def batches(stats, table_z, chunk):
      if 'idx' in chunk:  # K x M x B rows of the table
        out = {name: a[chunk['idx']] for name, a in table_z.items()}
      else:  # each of the K x M batches as train_call encodes it
        x, y = chunk['x'], chunk['y']
        flat = steps.encode(stats, layout,
                            {'x': x.reshape(-1, x.shape[-1]),
                             'y': y.reshape(-1, y.shape[-1])})
        out = {name: a.reshape(x.shape[:3] + a.shape[1:])
               for name, a in flat.items()}
      return jax.lax.with_sharding_constraint(out, chunk_sharding)
    # Placed as train_call places a chunk (see steps.jit_train_call).
    self._batches = jax.jit(batches, in_shardings=(None, None,
                                                   chunk_sharding))

  def run(self, num_steps: int) -> float:
    parts = self._parts
    feed = parts.feed(self._k)
    try:
      chunks = feed.chunks(itertools.repeat(self._k))
      table_z = parts.table(feed)
      stats = parts.stats
      _, chunk = next(chunks)
      jax.block_until_ready(self._batches(stats, table_z, chunk))
      calls = -(-num_steps // self._k)
      bounded = _Bounded(always=True)
      start = time.perf_counter()
      for _ in range(calls):
        _, chunk = next(chunks)
        bounded.add(self._batches(stats, table_z, chunk))
      bounded.drain()
      return (time.perf_counter() - start) * num_steps / (calls * self._k)
    finally:
      feed.close()


class MeshfitCalls(Variant):
  """meshfit's jitted train calls and TrainFeed, without the rest of its
  loop (no loss checks, logging, evaluation or checkpoints).

  With `members`, one ensemble of that many models of `size`, each on its
  own batch of size.batch_size, as `model.ensemble_size` trains them.
  """

  def __init__(self, size: Size, data: Data, steps_per_call: int,
               members: int = 1, optimizer: str = 'adam',
               devices: Sequence[jax.Device] | None = None):
    parts = _MeshfitParts(size, data, members, optimizer, devices)
    self.name = f'mf: train calls of {steps_per_call} step' + (
        's' if steps_per_call > 1 else '')
    if members > 1 or optimizer != 'adam':
      self.name += f', {members} member' + ('s' if members > 1 else '')
    if optimizer != 'adam':
      self.name += f', {optimizer}'
    self.members, self.steps_per_call = members, steps_per_call
    # (seconds per step, process CPU seconds / wall seconds) of each run:
    # more than 1 core busy shows XLA running the step on several threads.
    self.runs: list[tuple[float, float]] = []
    self._parts, self._k = parts, steps_per_call
    self._step = steps.jit_train_call(
        parts.setup.graphdef, parts.layout, parts.setup.member_tx,
        parts.setup.shardings, parts.setup.mesh,
        parts.config.log_every_steps, parts.setup.dropout)
    self._state = parts.state
    self.run(2 * steps_per_call)

  def run(self, num_steps: int) -> float:
    feed = self._parts.feed(self._k)
    try:
      chunks = feed.chunks(itertools.repeat(self._k))
      table_z = self._parts.table(feed)
      calls = -(-num_steps // self._k)
      bounded = _Bounded(always=True)
      jax.block_until_ready(table_z)  # its upload is set-up, not training
      cpu = time.process_time()
      start = time.perf_counter()
      for _ in range(calls):
        n, chunk = next(chunks)
        self._state, losses, _ = self._step(self._state, table_z, chunk,
                                            np.int32(n))
        bounded.add(losses)
      bounded.drain()
      jax.block_until_ready(self._state)
      wall = time.perf_counter() - start
      self.runs.append((wall / (calls * self._k),
                        (time.process_time() - cpu) / wall))
      # Per step: the last call may run a few more than asked.
      return wall * num_steps / (calls * self._k)
    finally:
      feed.close()


class MemberMatmuls(Variant):
  """The matmuls of an ensemble's steps and nothing else, as its vmapped
  step has them.

  Each layer's forward dot and, through `jax.vjp` of the layers without
  biases or activations, its weight and input gradients, batched over a
  leading member dimension; calls of `steps_per_call` steps in a
  `fori_loop` like meshfit's, each step's weights moved by a tiny multiple
  of its gradients so that no step can be hoisted out of the loop.
  """

  def __init__(self, size: Size, data: Data, steps_per_call: int,
               members: int, devices: Sequence[jax.Device]):
    self.name = f'matmuls alone, {members} member' + (
        's' if members > 1 else '')
    self.max_steps_factor = 10  # a step's matmuls cost less than the step
    self._k = steps_per_call
    # The members split over `devices`, as meshfit's mesh.members does.
    mesh = jax.sharding.Mesh(np.array(devices), ('members',))
    per_member = NamedSharding(mesh, P('members'))
    batches = NamedSharding(mesh, P(None, 'members'))

    def stacked(a_NxC):  # NUM_BATCHES x M x B x C, every member alike
      a = a_NxC.reshape(NUM_BATCHES, size.batch_size, -1)
      return jax.device_put(np.repeat(a[:, None], members, axis=1), batches)
    self._x, self._y = stacked(data.x_NxF), stacked(data.y_NxT)
    self._weights = jax.device_put(
        [np.repeat(np.asarray(w)[None], members, axis=0)
         for w, _ in _init_mlp(size)], per_member)

    def member(weights, x_BxF, g_BxT):
      def forward(weights):
        h = x_BxF
        for w in weights:
          h = h @ w
        return h
      return jax.vjp(forward, weights)[1](g_BxT)[0]

    def call(weights, x, y):
      def body(i, weights):
        grads = jax.vmap(member)(weights, x[i % NUM_BATCHES],
                                 y[i % NUM_BATCHES])
        return [w - 1e-9 * g for w, g in zip(weights, grads)]
      return jax.lax.fori_loop(0, steps_per_call, body, weights)
    self._call = jax.jit(call, donate_argnums=0)
    self.run(steps_per_call)

  @staticmethod
  def flops_per_member_step(size: Size) -> float:
    """Multiply-adds x 2 of a step: every layer's forward and weight
    gradient dots, and the input gradient of all but the first."""
    dims = list(zip(size.layer_sizes[:-1], size.layer_sizes[1:]))
    macs = 2 * sum(a * b for a, b in dims) + sum(a * b for a, b in dims[1:])
    return 2.0 * macs * size.batch_size

  def run(self, num_steps: int) -> float:
    calls = -(-num_steps // self._k)
    start = time.perf_counter()
    for _ in range(calls):
      self._weights = self._call(self._weights, self._x, self._y)
    jax.block_until_ready(self._weights)
    return (time.perf_counter() - start) * num_steps / (calls * self._k)


# ---------------------------------------------------------------------------
# Matmul peak.


def _matmul_peaks(have_torch: bool) -> dict[str, float]:
  """GFLOP/s of one square matmul, best of five, per library and dtype."""
  n = MATMUL_N
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
# Time to the first step, each in a fresh process.


def _first_step_child(spec: dict[str, str]) -> None:
  """One start-up: train_and_evaluate until its first step has finished."""
  entered = time.perf_counter()
  size = SIZES[spec['size']]
  splits = make_data(size).splits(eval_rows=size.batch_size)
  config = _meshfit_config(size, dtype='float32', num_train_steps=10,
                           checkpoint_every_seconds=None,
                           cache_dir=spec['cache_dir'])
  workdir = tempfile.mkdtemp()
  times = []
  try:
    loop.train_and_evaluate(
        config, workdir, splits=splits,
        on_call=call_timer(times, wait_at=(_first_call(config, size),),
                           stop_after=1))
  except _StopTraining:
    pass
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  print(json.dumps({'in_process_s': times[0] - entered,
                    'first_step_unix': time.time() - (time.perf_counter()
                                                      - times[0])}))


def _time_first_step(size: str, cache_dir: str) -> dict[str, float]:
  launched = time.time()
  result = subprocess.run(
      [sys.executable, os.path.abspath(__file__),
       f'--first_step_child={json.dumps({"size": size, "cache_dir": cache_dir})}'],
      capture_output=True, text=True, check=False)
  if result.returncode:
    raise RuntimeError(f'first-step child failed:\n{result.stderr[-3000:]}')
  child = json.loads(result.stdout.strip().splitlines()[-1])
  return {'in_process_s': child['in_process_s'],
          'process_s': child['first_step_unix'] - launched}


def first_step_section(size: str, repeats: int, workroot: str) -> dict:
  """Cache off, cold (empty) and warm (the same dir again), interleaved."""
  results = {'off': [], 'cold': [], 'warm': []}
  for r in range(repeats):
    cache_dir = os.path.join(workroot, f'first_step_cache_{r}')
    results['off'].append(_time_first_step(size, ''))
    results['cold'].append(_time_first_step(size, cache_dir))
    results['warm'].append(_time_first_step(size, cache_dir))
  return results


# ---------------------------------------------------------------------------
# The logged gradient norm, both ways steps.global_norm can compute it.


def norm_section(size_names: Sequence[str], repeats: int,
                 seconds: float) -> dict[str, dict[str, list[float]]]:
  """Seconds per jitted norm of each size's parameters: one reduction over
  their concatenation against one per leaf, interleaved; best of rounds."""
  ways = {'one reduction': jax.jit(steps.concatenated_norm),
          'per leaf': jax.jit(optax.tree.norm)}
  out = {}
  for name in size_names:
    size = SIZES[name]
    leaves = [jnp.ones(shape, jnp.float32)
              for a, b in zip(size.layer_sizes[:-1], size.layer_sizes[1:])
              for shape in ((a, b), (b,))]
    times = {way: [] for way in ways}
    calls = {}
    for way, fn in ways.items():  # compile, then calls of ~`seconds` / 4
      fn(leaves).block_until_ready()
      start = time.perf_counter()
      fn(leaves).block_until_ready()
      calls[way] = max(1, int(seconds / 4 / (time.perf_counter() - start)))
    for _ in range(repeats):
      for way, fn in ways.items():
        start = time.perf_counter()
        for _ in range(calls[way]):
          result = fn(leaves)
        result.block_until_ready()
        times[way].append((time.perf_counter() - start) / calls[way])
    out[name] = times
  return out


def norm_report(results: dict[str, dict[str, list[float]]]) -> str:
  rows = []
  for name, times in results.items():
    elements = SIZES[name].num_params
    best = {way: 1e6 * min(t) for way, t in times.items()}
    used = ('one reduction' if steps.takes_one_reduction(elements, False)
            else 'per leaf')
    rows.append([name, f'{elements:,}', f'{best["one reduction"]:,.1f}',
                 f'{best["per leaf"]:,.1f}', used])
  rounds = len(next(iter(results.values()))['per leaf'])
  return (f'\n### Gradient norm (best of {rounds}; '
          'meshfit takes one reduction up to '
          f'{steps.ONE_REDUCTION_MAX_ELEMENTS:,} parameters)\n\n'
          + markdown_table(['size', 'parameters', 'one reduction (us)',
                            'per leaf (us)', 'meshfit uses'], rows))


# ---------------------------------------------------------------------------
# Many members in one program (issue 14).


def member_variants(size: Size, data: Data, members: Sequence[int]
                    ) -> dict[int, dict[str, Variant]]:
  """For each ensemble size: meshfit's train calls ('calls'), the same with
  SGD ('sgd': what Adam's update adds), its input pipeline alone and the
  matmuls alone, all in calls of the length meshfit's loop picks for that
  many members."""
  config = _meshfit_config(size, dtype='float32', num_train_steps=None,
                           checkpoint_every_seconds=None, cache_dir='')
  v = {}
  for m in members:
    k, devices = _steps_per_call(config, size, m), _member_devices(m)
    v[m] = {'calls': MeshfitCalls(size, data, k, m, devices=devices),
            'sgd': MeshfitCalls(size, data, k, m, 'sgd', devices),
            'pipeline': Pipeline(size, data, m, devices),
            'matmuls': MemberMatmuls(size, data, k, m, devices)}
  return v


def members_section(size_name: str, members: Sequence[int], repeats: int,
                    peaks: dict[str, list[float]], have_torch: bool,
                    seconds: float | None) -> dict[str, Any]:
  """Every variant of `member_variants` once per round, interleaved."""
  size = SIZES[size_name]
  variants = member_variants(size, make_data(size), members)
  flat = [v for parts in variants.values() for v in parts.values()]
  try:
    rates, counts = run_rounds(flat, FLAGS.steps or size.default_steps,
                               repeats, peaks, have_torch, seconds)
  finally:
    for v in flat:
      v.close()
  by_members = {}
  for m, parts in variants.items():
    by_members[str(m)] = {
        'steps_per_call': parts['calls'].steps_per_call,
        'devices': len(_member_devices(m)),
        'variants': {part: v.name for part, v in parts.items()},
        # CPU / wall of the fastest run (the round the rate comes from).
        'cores': min(parts['calls'].runs)[1]}
  return {'size': size_name, 'repeats': repeats, 'rates': rates,
          'counts': counts, 'members': by_members}


def members_report(res: dict[str, Any], peak_f32: float) -> str:
  """The ensembles' speed beside one model's, then where a step goes."""
  size, rates, counts = SIZES[res['size']], res['rates'], res['counts']
  best = {name: max(r) for name, r in rates.items()}
  one = res['members'].get('1')
  one_rate = best[one['variants']['calls']] if one else None
  rows, parts = [], []
  for m, info in res['members'].items():
    names, k = info['variants'], int(m)
    rate = best[names['calls']]
    gflops = rate * k * size.flops_per_step / 1e9
    rows.append([m, str(info['devices']), f'{info["steps_per_call"]:,}',
                 f'{counts[names["calls"]]:,}', _num(rate),
                 _num(statistics.median(rates[names['calls']])),
                 f'{rate * k * size.batch_size:,.0f}',
                 _fmt(None if one_rate is None else rate * k / one_rate),
                 _num(gflops), f'{100 * gflops / peak_f32:.1f}%',
                 f'{info["cores"]:.2f}'])
    step_us = 1e6 / rate
    matmul_us = 1e6 / best[names['matmuls']]
    adam_us = step_us - 1e6 / best[names['sgd']]
    pipeline_us = 1e6 / best[names['pipeline']]
    rest_us = step_us - matmul_us - adam_us - pipeline_us
    matmul_gflops = (k * MemberMatmuls.flops_per_member_step(size)
                     / matmul_us / 1e3)

    def share(us):
      return f'{us:,.0f} ({100 * us / step_us:.0f}%)'
    parts.append([m, f'{step_us:,.0f}', f'{step_us / k:,.1f}',
                  share(matmul_us), share(adam_us), share(pipeline_us),
                  share(rest_us), _num(matmul_gflops),
                  f'{100 * matmul_gflops / peak_f32:.1f}%'])
  rounds = len(next(iter(rates.values())))
  return '\n'.join([
      f'\n### Many members in one program ({res["size"]}: '
      f'{" -> ".join(map(str, size.layer_sizes))}, batch '
      f'{size.batch_size} per member, {size.num_params:,} params per member; '
      f'best of {rounds} rounds)\n',
      'meshfit\'s jitted train calls and TrainFeed for an ensemble of M '
      'members in calls of the length its loop picks; model-examples/s is '
      'M x batch x steps/s; cores busy is process CPU time / wall time.\n',
      markdown_table(['members', 'devices', 'steps/call', 'steps', 'steps/s',
                      'median', 'model-examples/s', 'x 1 member', 'GFLOP/s',
                      'of peak', 'cores busy'], rows),
      '\nWhere a step goes (us per step of all M members, each part timed '
      'alone in calls of the same length: the matmuls alone, Adam\'s update '
      'as the difference from SGD\'s, the input pipeline alone; rest: '
      'activations, loss, bias gradients, gradient norms, metrics):\n',
      markdown_table(['members', 'step (us)', 'per member (us)', 'matmuls',
                      'Adam over SGD', 'input pipeline', 'rest',
                      'matmul GFLOP/s', 'of peak'], parts)])


# ---------------------------------------------------------------------------
# Rounds and tables.


def make_variants(size: Size, data: Data, sections: Sequence[str],
                  num_steps: int, workroot: str, cache_dir: str,
                  have_torch: bool) -> list[Variant]:
  """Every variant of `size` that the chosen sections need.

  The checkpoint comparison runs size.checkpoint_steps steps (both of its
  variants), a window of ~10 s.
  """
  v = []
  if {'main', 'precision', 'checkpoint', 'breakdown'} & set(sections):
    v.append(Meshfit(size, data, workroot, cache_dir))
    v.append(MinimalJit(size, data))
  if {'main', 'precision'} & set(sections) and have_torch:
    v.append(Torch(size, data))
  if 'main' in sections:
    v.append(Pmap(size, data))
    if have_torch:
      # Immune to the spinning of OpenMP threads on a shared machine.
      v.append(Torch(size, data, threads=1))
  if 'precision' in sections:
    v.append(Meshfit(size, data, workroot, cache_dir, dtype='bfloat16'))
    v.append(MinimalJit(size, data, dtype='bfloat16'))
    v.append(MinimalJit(size, data, dtype='bfloat16',
                        low_precision_grads=True))
    if have_torch:
      v.append(Torch(size, data, dtype='bfloat16'))
  if 'checkpoint' in sections:
    for every in (0.0, CHECKPOINT_SECONDS):
      v.append(Meshfit(size, data, workroot, cache_dir,
                       checkpoint_every_seconds=every,
                       steps=size.checkpoint_steps))
  if 'pipeline' in sections:
    v.append(Pipeline(size, data))
  if 'breakdown' in sections and size.breakdown:
    v.append(MeshfitCalls(size, data, steps_per_call=1))
    config = _meshfit_config(size, dtype='float32', num_train_steps=None,
                             checkpoint_every_seconds=None, cache_dir='')
    v.append(MeshfitCalls(size, data, _steps_per_call(config, size)))
  return v


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
               seconds: float | None) -> tuple[dict[str, list[float]],
                                               dict[str, int]]:
  """steps/s of each variant per round; the start rotates every round.

  Returns:
    steps/s per variant and round, and the steps each variant ran per round.
  """
  # A few steps at least, whatever they take: one step is all noise.
  counts = {v.name: getattr(v, 'steps', None) or num_steps
            if v.fixed_steps or seconds is None
            else _calibrate(v, num_steps * v.max_steps_factor, seconds,
                            min_steps=min(num_steps, 3))
            for v in variants}
  rates = {v.name: [] for v in variants}
  for r in range(repeats):
    for name, gflops in _matmul_peaks(have_torch).items():
      peaks.setdefault(name, []).append(gflops)
    order = list(variants[r % len(variants):]) + list(
        variants[:r % len(variants)])
    for v in order:
      rates[v.name].append(counts[v.name] / v.run(counts[v.name]))
  return rates, counts


def _ratio(rates: dict[str, list[float]], a: str, b: str) -> float | None:
  """best(a) / best(b): each variant's least disturbed round."""
  if a not in rates or b not in rates:
    return None
  return max(rates[a]) / max(rates[b])


def _fmt(x: float | None, spec: str = '.2f', suffix: str = 'x') -> str:
  return '-' if x is None else f'{x:{spec}}{suffix}'


def _num(x: float) -> str:
  """Three significant digits or more: 12,345 / 123 / 12.3 / 1.23."""
  return f'{x:,.0f}' if x >= 100 else f'{x:.3g}'


def report(results: dict[str, Any]) -> str:
  """Markdown tables of everything measured."""
  out = []
  peaks = {k: max(v) for k, v in results['peaks'].items()}
  peak_f32 = max(v for k, v in peaks.items() if 'f32' in k and 'bf16' not in k)
  peak_bf16 = max(v for k, v in peaks.items() if 'bf16' in k)
  out.append(f'Matmul peak ({MATMUL_N}^3, best of every round):\n')
  out.append(markdown_table(['matmul', 'GFLOP/s'],
                            [[k, f'{v:.0f}'] for k, v in peaks.items()]))

  for size_name, res in results['sizes'].items():
    size, rates, counts = SIZES[size_name], res['rates'], res['counts']
    out.append(f'\n### {size_name}: {" -> ".join(map(str, size.layer_sizes))}'
               f', batch {size.batch_size}, {size.num_params:,} params, '
               f'{res["repeats"]} rounds\n')
    rows = []
    for name, r in rates.items():
      if name.startswith('mf:') or 'pipeline' in name:
        continue
      best = max(r)
      gflops = best * size.flops_per_step / 1e9
      peak = peak_bf16 if 'bfloat16' in name else peak_f32
      rows.append([name, f'{counts[name]:,}', _num(best),
                   _num(statistics.median(r)),
                   f'{best * size.batch_size:,.0f}', _num(gflops),
                   f'{100 * gflops / peak:.1f}%',
                   _fmt(_ratio(rates, name, 'jit')),
                   _fmt(_ratio(rates, name, 'pmap')),
                   _fmt(_ratio(rates, name, 'torch')),
                   _fmt(_ratio(rates, name, 'torch, 1 thread'))])
    out.append(markdown_table(
        ['variant', 'steps', 'steps/s', 'median', 'examples/s', 'GFLOP/s',
         'of peak', 'x jit', 'x pmap', 'x torch', 'x torch 1t'], rows))

    extra = []
    for name in ('meshfit', 'jit', 'torch'):
      for bf16 in [n for n in rates if n.startswith(f'{name} bfloat16')
                   or n.startswith(f'proto: {name} bfloat16')]:
        extra.append([f'{bf16} / {name}', _fmt(_ratio(rates, bf16, name))])
    base = f'meshfit no ckpt, {size.checkpoint_steps:,} steps'
    ckpt = (f'meshfit ckpt every {CHECKPOINT_SECONDS:g} s, '
            f'{size.checkpoint_steps:,} steps')
    if ckpt in rates:
      ratio = _ratio(rates, ckpt, base)
      window = size.checkpoint_steps / max(rates[ckpt])  # seconds
      saves = res.get('checkpoints') or [0]
      per_save = (window - size.checkpoint_steps / max(rates[base])) / max(
          statistics.median(saves), 1)
      default = default_checkpoint_seconds()
      extra.append([f'{ckpt} / {base} (cost {100 * (1 - ratio):.1f}%; '
                    f'{min(saves)} to {max(saves)} checkpoints in its '
                    f'{window:.1f} s, every one due written)', _fmt(ratio)])
      extra.append([f'one save costs training {1e3 * per_save:.0f} ms; at '
                    f'the default checkpoint_every_seconds={default:g}: cost',
                    f'{100 * per_save / default:.2f}%'])
    pipe = 'input pipeline alone'
    if pipe in rates:
      rows_s = max(rates[pipe]) * size.batch_size
      extra.append([f'input pipeline alone: {rows_s:,.0f} rows/s; / rows/s '
                    'meshfit consumes', _fmt(_ratio(rates, pipe, 'meshfit'))])
    if extra:
      out.append('\n' + markdown_table(['ratio', 'value'], extra))

    ladder = [n for n in rates if n.startswith('mf:')]
    if ladder:
      rows = []
      previous = None
      for name in ['jit'] + ladder + ['meshfit']:
        best = max(rates[name])
        us = 1e6 / best
        delta = '' if previous is None else f'{us - previous:+.0f}'
        rows.append([name, f'{best:,.0f}', f'{us:,.0f}', delta,
                     _fmt(_ratio(rates, name, 'jit')),
                     _fmt(_ratio(rates, name, 'meshfit'))])
        previous = us
      out.append('\nWhere the time goes (meshfit\'s jitted calls and '
                 'TrainFeed alone, then its whole loop):\n')
      out.append(markdown_table(['variant', 'steps/s', 'us/step', '+us',
                                 'x jit', 'x meshfit'], rows))

  if 'norm' in results:
    out.append(norm_report(results['norm']))
  if 'members' in results:
    out.append(members_report(results['members'], peak_f32))
  if 'first_step' in results:
    fs = results['first_step']
    out.append(f'\n### Time to first step ({fs["size"]}, fresh process; '
               f'best of {len(fs["runs"]["cold"])})\n')
    rows = []
    med = {k: {m: min(r[m] for r in runs)
               for m in ('in_process_s', 'process_s')}
           for k, runs in fs['runs'].items()}
    labels = {'off': 'cache off', 'cold': 'cache cold (empty dir)',
              'warm': 'cache warm (restart)'}
    for k, m in med.items():
      rows.append([labels[k], f'{m["in_process_s"]:.2f}',
                   f'{m["process_s"]:.2f}'])
    out.append(markdown_table(['start', 'train_and_evaluate -> first step (s)',
                               'process launch -> first step (s)'], rows))
    out.append('\n' + markdown_table(['ratio', 'in process', 'from launch'], [[
        'cold / warm',
        _fmt(med['cold']['in_process_s'] / med['warm']['in_process_s']),
        _fmt(med['cold']['process_s'] / med['warm']['process_s'])]]))
  return '\n'.join(out)


def default_checkpoint_seconds() -> float:
  return default.get_config().checkpoint_every_seconds


def _machine() -> str:
  cpu = platform.processor() or platform.machine()
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      cpu = next(line.split(':', 1)[1].strip() for line in f
                 if line.startswith('model name'))
  except (OSError, StopIteration):
    pass
  try:
    import torch  # noqa: PLC0415
    torch_version = torch.__version__
    torch_version += f' ({torch.get_num_threads()} threads)'
  except ImportError:
    torch_version = 'absent'
  return (f'{cpu}, {os.cpu_count()} cores; jax {jax.__version__} on '
          f'{jax.device_count()} {jax.devices()[0].platform} device(s); '
          f'torch {torch_version}')


def main(argv: Sequence[str]) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)
  if FLAGS.first_step_child:
    _first_step_child(json.loads(FLAGS.first_step_child))
    return
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
  print(_machine(), flush=True)
  load_before = os.getloadavg()[0]
  workroot = tempfile.mkdtemp(prefix='meshfit_speed_')
  cache_dir = os.path.join(workroot, 'jax_cache')
  results = {'machine': _machine(), 'command': ' '.join(sys.argv),
             'peaks': {}, 'sizes': {}}
  try:
    for size_name in FLAGS.sizes:
      size = SIZES[size_name]
      num_steps = FLAGS.steps or size.default_steps
      print(f'{size_name}: setting up...', flush=True)
      variants = make_variants(size, make_data(size), FLAGS.sections,
                               num_steps, workroot, cache_dir, have_torch)
      if not variants:  # e.g. --sections=first_step alone
        continue
      try:
        rates, counts = run_rounds(
            variants, num_steps, FLAGS.repeats, results['peaks'], have_torch,
            None if FLAGS.steps else FLAGS.seconds)
      finally:
        for v in variants:
          v.close()
      results['sizes'][size_name] = {'steps': num_steps, 'counts': counts,
                                     'repeats': FLAGS.repeats, 'rates': rates}
      for v in variants:
        if getattr(v, 'checkpoints', None):
          results['sizes'][size_name]['checkpoints'] = v.checkpoints
      print(f'{size_name}: done', flush=True)
    if 'members' in FLAGS.sections:
      print(f'{FLAGS.members_size}: members {", ".join(FLAGS.members)}...',
            flush=True)
      results['members'] = members_section(
          FLAGS.members_size, [int(m) for m in FLAGS.members], FLAGS.repeats,
          results['peaks'], have_torch,
          None if FLAGS.steps else FLAGS.seconds)
    if 'norm' in FLAGS.sections:
      print('gradient norm...', flush=True)
      results['norm'] = norm_section(FLAGS.sizes, FLAGS.repeats,
                                     FLAGS.seconds)
    if 'first_step' in FLAGS.sections:
      print('time to first step...', flush=True)
      results['first_step'] = {
          'size': FLAGS.first_step_size,
          'runs': first_step_section(FLAGS.first_step_size, FLAGS.repeats,
                                     workroot)}
    if not results['peaks']:
      results['peaks'] = {k: [v] for k, v in _matmul_peaks(have_torch).items()}
  finally:
    shutil.rmtree(workroot, ignore_errors=True)
  results['load_average'] = [load_before, os.getloadavg()[0]]
  print()
  print(f'{results["machine"]}\n1-minute load average {load_before:.1f} '
        f'before, {os.getloadavg()[0]:.1f} after (other processes share the '
        'cores: compare ratios, not absolute rates).\n')
  print(report(results))
  if FLAGS.json:
    with open(FLAGS.json, 'w', encoding='utf-8') as f:
      json.dump(results, f, indent=1)


if __name__ == '__main__':
  app.run(main)
