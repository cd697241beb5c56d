"""A dense layer's three matmuls, every formulation, float32 beside bfloat16.

The large speed.py model (784 -> 2048 -> 2048 -> 2048 -> 10, batch 2048)
spends its step in matmuls: per layer the forward `z = x @ w` and, in the
backward pass, `dx = g @ w^T` and `dw = x^T @ g`. Each can be written several
ways (dot_general dimension numbers, a transpose that XLA folds into the dot
or one it must materialise, the transposed product), and XLA:CPU runs some of
them on a library kernel (YNNPACK) and others on its own dot after upcasting
bfloat16 operands to float32. For each formulation and each layer shape this
prints the rate in float32 and in bfloat16 with float32 accumulation
(`preferred_element_type`), and which kernel the compiled HLO calls.

Sections:
  formulations  the table above, in this process
  torch         PyTorch's matmuls at the same shapes (if torch is installed)
  step          the large model's Adam step beside its matmuls alone, float32
                and bfloat16 (models/low_precision.py's matmul): the bound that the
                rest of the step puts on the bfloat16 speed-up (Amdahl)
  flags         the 2048 layer's matmuls under XLA_FLAGS variants, each in
                fresh processes (flags are read once per process)
  isa           the cores' own multiply-add peak, float32 FMA against
                bfloat16 dot-product instructions (benchmarks/fma_peak.c,
                built with the system's C compiler; x86-64 with AVX512_BF16):
                what no bfloat16 matmul can beat

Every case runs once per round and the rounds interleave the cases (the start
rotates), so slow drifts in the load of other processes reach all of them;
each case is reported at its best round. Operands are passed in the compute
dtype: a rate includes the formulation's own transposes, not the casts.

    python benchmarks/matmul.py                  # ~6 minutes on 2 cores
    python benchmarks/matmul.py --sections=formulations --layers=2048x2048
"""

import dataclasses
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app, flags  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax import lax  # noqa: E402

from bench_common import markdown_table, mlp_loss  # noqa: E402
from models import low_precision  # noqa: E402

SECTIONS = ('formulations', 'torch', 'step', 'flags', 'isa')
BATCH = 2048
# The large model: its layer widths, and its layers as in x out.
WIDTHS = (784, 2048, 2048, 2048, 10)
LAYERS = ('784x2048', '2048x2048', '2048x10')

# XLA_FLAGS of the flags section; names are the table's columns.
FLAG_SETS = {
    'default': '',
    'YNNPACK dots off (XLA dot)':
        '--xla_cpu_experimental_ynn_fusion_type=-individual_dot',
    'XNNPACK dots': '--xla_cpu_experimental_ynn_fusion_type=-individual_dot '
                    '--xla_cpu_experimental_xnn_fusion_type=+dot',
    'oneDNN dot fusions':
        '--xla_cpu_experimental_ynn_fusion_type=-individual_dot '
        '--xla_cpu_use_onednn=true '
        '--xla_cpu_experimental_onednn_fusion_type=+dot',
    'oneDNN custom calls':
        '--xla_cpu_experimental_ynn_fusion_type=-individual_dot '
        '--xla_cpu_experimental_onednn_custom_call=true',
    'YNNPACK dot+eltwise fusions':
        '--xla_cpu_experimental_ynn_fusion_type=+dot,+eltwise',
    'xla_cpu_use_xnnpack=false': '--xla_cpu_use_xnnpack=false',
    'fast math': '--xla_cpu_enable_fast_math=true',
    'vector width 512': '--xla_cpu_prefer_vector_width=512',
    'max ISA AVX512 (no bf16)': '--xla_cpu_max_isa=AVX512',
}

FLAGS = flags.FLAGS
flags.DEFINE_list('sections', list(SECTIONS), f'Any of {", ".join(SECTIONS)}.')
flags.DEFINE_list('layers', list(LAYERS), 'Layer shapes (in x out) of the '
                  'formulations section.')
flags.DEFINE_integer('rounds', 5, 'Interleaved rounds; each case is reported '
                     'at its best.')
flags.DEFINE_integer('flag_rounds', 3, 'Fresh processes per flag set.')
flags.DEFINE_list('flag_sets', list(FLAG_SETS), 'Names of FLAG_SETS to run.')
flags.DEFINE_string('json', None, 'Also write every measurement here.')
flags.DEFINE_string('child', None, 'Internal: time the flags section\'s cases '
                    'in this process (JSON: rounds).')


def _dot(a: jax.Array, b: jax.Array, lhs_contract: int,
         rhs_contract: int) -> jax.Array:
  """A 2-D dot_general contracting one dimension of each, float32 out."""
  return lax.dot_general(a, b, (((lhs_contract,), (rhs_contract,)), ((), ())),
                         preferred_element_type=jnp.float32)


def _t_barrier(a_NxM: jax.Array) -> jax.Array:
  """a^T that XLA cannot fold into the dot: an optimization barrier."""
  return lax.optimization_barrier(a_NxM.T)


# a^T as models/low_precision.py writes it for the weight gradient: a split of the
# rows in two, a 3-D transpose and a merge, which XLA lays out row-major.
_t_split = low_precision.transposed_copy


def _batched_halves(x_BxI: jax.Array, g_BxO: jax.Array) -> jax.Array:
  """x^T @ g as a batched dot over two halves of the batch, then summed."""
  b = x_BxI.shape[0]
  x_2xHxI = x_BxI.reshape(2, b // 2, -1)
  g_2xHxO = g_BxO.reshape(2, b // 2, -1)
  dw_2xIxO = lax.dot_general(x_2xHxI, g_2xHxO, (((1,), (1,)), ((0,), (0,))),
                             preferred_element_type=jnp.float32)
  return dw_2xIxO.sum(0)


# Arrays a formulation may use: x_BxI, w_IxO, g_BxO (the cotangent of z),
# and xT_IxB, wT_OxI: the same values stored transposed (a bound: what the
# matmul costs when the operand needs no transpose at all).
Operands = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class Formulation:
  matmul: str
  name: str
  fn: Callable[[Operands], jax.Array]


FORWARD, DX, DW = 'z = x @ w', 'dx = g @ w^T', 'dw = x^T @ g'
FORMULATIONS = (
    Formulation(FORWARD, 'dot(x, w), contract (1, 0)',
                lambda o: _dot(o['x_BxI'], o['w_IxO'], 1, 0)),
    Formulation(FORWARD, 'w stored O x I: dot(x, wT), contract (1, 1)',
                lambda o: _dot(o['x_BxI'], o['wT_OxI'], 1, 1)),
    # With float32 operands: does XLA:CPU honour the bfloat16 algorithm?
    Formulation(FORWARD, 'dot(x, w), algorithm=BF16_BF16_F32',
                lambda o: lax.dot(
                    o['x_BxI'], o['w_IxO'],
                    precision=lax.DotAlgorithmPreset.BF16_BF16_F32,
                    preferred_element_type=jnp.float32)),
    Formulation(DX, 'dot(g, w), contract (1, 1) [jax.grad]',
                lambda o: _dot(o['g_BxO'], o['w_IxO'], 1, 1)),
    Formulation(DX, 'g @ w^T, w^T behind a barrier',
                lambda o: _dot(o['g_BxO'], _t_barrier(o['w_IxO']), 1, 0)),
    Formulation(DX, 'g @ w^T, w^T by split-transpose-merge',
                lambda o: _dot(o['g_BxO'], _t_split(o['w_IxO']), 1, 0)),
    Formulation(DX, '(w @ g^T)^T: dot(w, g), contract (1, 1), then .T',
                lambda o: _dot(o['w_IxO'], o['g_BxO'], 1, 1).T),
    Formulation(DX, 'w^T given: dot(g, wT), contract (1, 0) [bound]',
                lambda o: _dot(o['g_BxO'], o['wT_OxI'], 1, 0)),
    Formulation(DW, 'dot(x, g), contract (0, 0) [jax.grad]',
                lambda o: _dot(o['x_BxI'], o['g_BxO'], 0, 0)),
    Formulation(DW, 'x^T @ g, x^T by jnp.transpose (folded)',
                lambda o: _dot(jnp.transpose(o['x_BxI']), o['g_BxO'], 1, 0)),
    Formulation(DW, 'x^T @ g, x^T behind a barrier',
                lambda o: _dot(_t_barrier(o['x_BxI']), o['g_BxO'], 1, 0)),
    Formulation(DW, 'x^T @ g, x^T by split-transpose-merge',
                lambda o: _dot(_t_split(o['x_BxI']), o['g_BxO'], 1, 0)),
    Formulation(DW, '(g^T @ x)^T: dot(g, x), contract (0, 0), then .T',
                lambda o: _dot(o['g_BxO'], o['x_BxI'], 0, 0).T),
    Formulation(DW, '(g^T @ x)^T, g^T by split-transpose-merge',
                lambda o: _dot(_t_split(o['g_BxO']), o['x_BxI'], 1, 0).T),
    Formulation(DW, 'x^T, g^T both split: dot(xT, gT), contract (1, 1)',
                lambda o: _dot(_t_split(o['x_BxI']), _t_split(o['g_BxO']),
                               1, 1)),
    Formulation(DW, 'batched dot over two batch halves, summed',
                lambda o: _batched_halves(o['x_BxI'], o['g_BxO'])),
    Formulation(DW, 'x^T given: dot(xT, g), contract (1, 0) [bound]',
                lambda o: _dot(o['xT_IxB'], o['g_BxO'], 1, 0)),
)


def _operands(num_in: int, num_out: int, dtype: jnp.dtype) -> Operands:
  rng = np.random.default_rng(0)
  x = rng.standard_normal((BATCH, num_in), np.float32)
  w = rng.standard_normal((num_in, num_out), np.float32) / np.sqrt(num_in)
  g = rng.standard_normal((BATCH, num_out), np.float32)
  arrays = {'x_BxI': x, 'w_IxO': w, 'g_BxO': g,
            'xT_IxB': np.ascontiguousarray(x.T),
            'wT_OxI': np.ascontiguousarray(w.T)}
  return {k: jnp.asarray(v, dtype) for k, v in arrays.items()}


def kernels(hlo_text: str) -> str:
  """Which kernel runs each dot of a compiled module, and in which dtype.

  Args:
    hlo_text: `jax.jit(f).lower(...).compile().as_text()`.

  Returns:
    e.g. 'YNNPACK bf16' or 'XLA dot f32 (upcast)': one entry per dot, joined
    by ' + '. A dot in a fusion of kind __ynn_fusion runs YNNPACK (likewise
    XNNPACK, oneDNN); any other runs XLA's own dot (Eigen). "upcast": the
    module converts bfloat16 to float32 before a float32 dot.
  """
  dtypes, comp_of, kind_of_comp = {}, {}, {}
  comp = None
  for line in hlo_text.splitlines():
    header = re.match(r'(?:ENTRY )?%([\w.\-]+) \(', line)
    if header:
      comp = header.group(1)
      continue
    inst = re.match(r'\s*(?:ROOT )?%([\w.\-]+) = (\w+)\[', line)
    if not inst:
      continue
    dtypes[inst.group(1)] = inst.group(2)
    comp_of[inst.group(1)] = comp
    called = re.search(r'calls=%([\w.\-]+)', line)
    kind = re.search(r'"kind":"__(\w+?)_fusion"', line)
    if called and kind:
      kind_of_comp[called.group(1)] = kind.group(1)
  names = {'ynn': 'YNNPACK', 'xnn': 'XNNPACK', 'onednn': 'oneDNN'}
  out = []
  for line in hlo_text.splitlines():
    dot = re.match(r'\s*(?:ROOT )?%([\w.\-]+) = \w+\[.*? dot\(%([\w.\-]+), ',
                   line)
    if dot:
      kind = kind_of_comp.get(comp_of[dot.group(1)])
      dtype = dtypes.get(dot.group(2), '?')
      out.append(f'{names.get(kind, "XLA dot")} {dtype}')
    elif 'custom_call_target="__onednn$matmul' in line:
      out.append('oneDNN custom call')
  upcast = re.search(r'= f32\[[^\]]*\]\{[^}]*\} convert\(%[\w.\-]+\)',
                     hlo_text) and any(v == 'bf16' for v in dtypes.values())
  text = ' + '.join(out) or '?'
  return text + (' (upcast)' if upcast and 'f32' in text else '')


@dataclasses.dataclass
class Case:
  """One jitted matmul, its operands and its best time so far."""
  key: tuple[str, ...]
  fn: Callable[[], Any] | None  # None: it does not run
  flops: float
  kernel: str
  times: list[float] = dataclasses.field(default_factory=list)
  # Process CPU seconds (all threads) of the same calls: what the work
  # costs whoever else takes the cores meanwhile.
  cpu_times: list[float] = dataclasses.field(default_factory=list)

  def time_once(self, reps: int = 2) -> None:
    if self.fn is None:
      return
    best, best_cpu = float('inf'), float('inf')
    for _ in range(reps):
      start, start_cpu = time.perf_counter(), time.process_time()
      jax.block_until_ready(self.fn())
      best = min(best, time.perf_counter() - start)
      best_cpu = min(best_cpu, time.process_time() - start_cpu)
    self.times.append(best)
    self.cpu_times.append(best_cpu)

  @property
  def gflops(self) -> float:
    return self.flops / min(self.times) / 1e9 if self.times else float('nan')


def _case(key: tuple[str, ...], formulation: Formulation, operands: Operands,
          flops: float) -> Case:
  jitted = jax.jit(formulation.fn)
  kernel = kernels(jitted.lower(operands).compile().as_text())
  fn = lambda: jitted(operands)  # noqa: E731
  try:
    jax.block_until_ready(fn())
  except jax.errors.JaxRuntimeError as e:
    # XLA:CPU has compiled a dot that none of its kernels runs.
    return Case(key, None, flops, f'fails: {str(e).splitlines()[0][:60]}')
  return Case(key, fn, flops, kernel)


def run_rounds(cases: Sequence[Case], rounds: int) -> None:
  """Times every case once per round; the starting case rotates."""
  for r in range(rounds):
    start = r * len(cases) // rounds
    for case in list(cases[start:]) + list(cases[:start]):
      case.time_once()


def formulation_cases(layers: Sequence[str],
                      formulations: Sequence[Formulation] = FORMULATIONS
                      ) -> list[Case]:
  cases = []
  for layer in layers:
    num_in, num_out = map(int, layer.split('x'))
    flops = 2.0 * BATCH * num_in * num_out
    for dtype in ('float32', 'bfloat16'):
      operands = _operands(num_in, num_out, jnp.dtype(dtype))
      for f in formulations:
        cases.append(_case((layer, dtype, f.matmul, f.name), f, operands,
                           flops))
  return cases


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  return markdown_table(header, rows, text_columns=2)


def _rate(x: float, spec: str = '.0f', suffix: str = '') -> str:
  return '-' if np.isnan(x) else f'{x:{spec}}{suffix}'


def formulations_report(cases: Sequence[Case]) -> str:
  by_key = {c.key: c for c in cases}
  out = []
  for layer in dict.fromkeys(c.key[0] for c in cases):
    num_in, num_out = layer.split('x')
    out.append(f'\n#### Layer {num_in} -> {num_out}, batch {BATCH}\n')
    rows = []
    for f in FORMULATIONS:
      f32 = by_key[(layer, 'float32', f.matmul, f.name)]
      bf16 = by_key[(layer, 'bfloat16', f.matmul, f.name)]
      default_f32 = by_key[(layer, 'float32', f.matmul, next(
          g.name for g in FORMULATIONS if g.matmul == f.matmul))]
      rows.append([f.matmul, f.name, _rate(f32.gflops), _rate(bf16.gflops),
                   _rate(bf16.gflops / default_f32.gflops, '.2f', 'x'),
                   f32.kernel, bf16.kernel])
    out.append(_table(['matmul', 'formulation', 'f32 GFLOP/s',
                       'bf16 GFLOP/s', 'bf16 / f32 jax.grad form',
                       'f32 kernel', 'bf16 kernel'], rows))
  return '\n'.join(out)


# ---------------------------------------------------------------------------
# The large model's step against its matmuls alone.


def _plain_matmul(x_BxI: jax.Array, w_IxO: jax.Array) -> jax.Array:
  """x @ w in the operands' dtype, accumulated in float32."""
  return _dot(x_BxI, w_IxO, 1, 0)


def _matmul_bf16(x_BxI: jax.Array, w_IxO: jax.Array) -> jax.Array:
  return low_precision.low_precision_matmul(x_BxI, w_IxO, jnp.dtype(jnp.bfloat16))


def _step_matmuls(operands: Sequence[Operands], bf16: bool) -> list:
  """The 11 matmuls of a step, as the step writes them, on ready operands.

  float32: jax.grad's forms; bfloat16: models/low_precision.py's (the features get no
  gradient, so the first layer has no dx).
  """
  out = []
  for i, o in enumerate(operands):
    x, w, g = o['x_BxI'], o['w_IxO'], o['g_BxO']
    out.append(_dot(x, w, 1, 0))
    if i:
      out.append(_dot(g, w, 1, 1))
    out.append(_dot(low_precision.transposed_copy(x), g, 1, 0) if bf16
               else _dot(x, g, 0, 0))
  return out


def step_section(rounds: int) -> dict[str, float]:
  """Best seconds of the step's pieces, float32 and bfloat16."""
  tx = optax.adam(1e-3)
  keys = jax.random.split(jax.random.key(0), len(WIDTHS) - 1)
  params = [(jax.nn.initializers.lecun_normal()(k, (a, b)), jnp.zeros((b,)))
            for k, a, b in zip(keys, WIDTHS[:-1], WIDTHS[1:])]
  opt_state = tx.init(params)
  rng = np.random.default_rng(0)
  x_BxF = jnp.asarray(rng.standard_normal((BATCH, WIDTHS[0]), np.float32))
  y_BxT = jnp.asarray(rng.standard_normal((BATCH, WIDTHS[-1]), np.float32))

  def step(params, opt_state, matmul):
    grads = jax.grad(mlp_loss)(params, x_BxF, y_BxT, matmul)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  def adam(params, opt_state, grads):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  grads = jax.grad(mlp_loss)(params, x_BxF, y_BxT, _plain_matmul)
  cases = []
  for dtype, matmul in (('float32', _plain_matmul),
                        ('bfloat16', _matmul_bf16)):
    operands = [_operands(a, b, jnp.dtype(dtype))
                for a, b in zip(WIDTHS[:-1], WIDTHS[1:])]
    for name, fn, args in (
        ('step', functools.partial(step, matmul=matmul), (params, opt_state)),
        ('grad', jax.grad(functools.partial(mlp_loss, matmul=matmul)),
         (params, x_BxF, y_BxT)),
        ('matmuls', functools.partial(_step_matmuls,
                                      bf16=dtype == 'bfloat16'), (operands,)),
        ('square', _plain_matmul, (operands[1]['x_BxI'],
                                 operands[1]['w_IxO']))):
      jitted = jax.jit(fn)
      call = lambda jitted=jitted, args=args: jitted(*args)  # noqa: E731
      jax.block_until_ready(call())
      cases.append(Case((name, dtype), call, 1.0, ''))
  jitted_adam = jax.jit(adam)
  cases.append(Case(('adam', 'float32'),
                    lambda: jitted_adam(params, opt_state, grads), 1.0, ''))
  run_rounds(cases, rounds)
  return {' '.join(c.key): {'wall': min(c.times), 'cpu': min(c.cpu_times)}
          for c in cases}


def step_report(results: dict[str, dict[str, float]]) -> str:
  """Step, grad and matmul times; the bounds on bf16 / f32 (Amdahl).

  The bounds use CPU time, which other processes on the cores disturb far
  less than wall time: bfloat16 keeps the float32 step's non-matmul work
  (`rest`: Adam, activations, casts) and speeds up only its matmuls.
  """
  out = []
  for clock in ('wall', 'cpu'):
    t = {k: v[clock] for k, v in results.items()}
    rows = []
    for dtype in ('float32', 'bfloat16'):
      step, mm = t[f'step {dtype}'], t[f'matmuls {dtype}']
      rows.append([dtype, f'{1e3 * step:.0f}',
                   f'{1e3 * t[f"grad {dtype}"]:.0f}', f'{1e3 * mm:.0f}',
                   f'{1e3 * (step - mm):.0f}', f'{100 * mm / step:.0f}%',
                   f'{1e3 * t["adam float32"]:.0f}'])
    out.append(f'\n{clock} time (ms):\n\n' + _table(
        ['compute', 'Adam step', 'grad alone', 'its 11 matmuls alone', 'rest',
         'matmul share', 'Adam update alone'], rows))
  t = {k: v['cpu'] for k, v in results.items()}
  f32_step, f32_mm = t['step float32'], t['matmuls float32']
  f32_rest = max(f32_step - f32_mm, 0.0)
  peak_ratio = t['square float32'] / t['square bfloat16']
  out.append('\n' + _table(['bf16 / f32 steps per second (CPU time)',
                             'value'], [
      ['measured', f'{f32_step / t["step bfloat16"]:.2f}x'],
      ['bound: bf16 matmuls as measured, the rest as cheap as in f32',
       f'{f32_step / (t["matmuls bfloat16"] + f32_rest):.2f}x'],
      ['bound: bf16 matmuls at the 2048^3 rate ratio '
       f'({peak_ratio:.2f}x), the rest as in f32',
       f'{f32_step / (f32_mm / peak_ratio + f32_rest):.2f}x'],
      ['bound: the rest free (the matmuls\' own ratio)',
       f'{f32_mm / t["matmuls bfloat16"]:.2f}x']]))
  return '\n'.join(out)


# ---------------------------------------------------------------------------
# XLA_FLAGS, each set in fresh processes.

# The 2048 layer's cases timed under every flag set: column, dtype and
# formulation.
FLAG_CASES = (
    ('f32 z', 'float32', 'dot(x, w), contract (1, 0)'),
    ('bf16 z', 'bfloat16', 'dot(x, w), contract (1, 0)'),
    ('f32 dx', 'float32', 'dot(g, w), contract (1, 1) [jax.grad]'),
    ('bf16 dx', 'bfloat16', 'dot(g, w), contract (1, 1) [jax.grad]'),
    ('f32 dw', 'float32', 'dot(x, g), contract (0, 0) [jax.grad]'),
    ('bf16 dw', 'bfloat16', 'dot(x, g), contract (0, 0) [jax.grad]'),
    ('bf16 dw, x^T split', 'bfloat16',
     'x^T @ g, x^T by split-transpose-merge'),
)


def _child(spec: dict[str, Any]) -> None:
  """Times FLAG_CASES at the 2048 layer; prints one JSON line."""
  cases = []
  by_name = {f.name: f for f in FORMULATIONS}
  for _, dtype, name in FLAG_CASES:
    f = by_name[name]
    operands = _operands(2048, 2048, jnp.dtype(dtype))
    cases.append(_case((dtype, f.matmul, f.name), f, operands,
                       2.0 * BATCH * 2048 * 2048))
  run_rounds(cases, spec['rounds'])
  print(json.dumps([{'key': c.key, 'gflops': c.gflops, 'kernel': c.kernel}
                    for c in cases]))


def flags_section(names: Sequence[str], processes: int) -> dict[str, list]:
  """Per flag set: per process, the child's measurements.

  The flag sets take turns process by process, so drifts in the machine's
  load reach all of them.
  """
  results = {name: [] for name in names}
  for _ in range(processes):
    for name in names:
      env = dict(os.environ, XLA_FLAGS=FLAG_SETS[name])
      proc = subprocess.run(
          [sys.executable, os.path.abspath(__file__),
           f'--child={json.dumps({"rounds": 2})}'],
          capture_output=True, text=True, env=env, check=False)
      if proc.returncode:
        results[name].append({'error': proc.stderr.strip()[-300:]})
        continue
      results[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
  return results


def flags_report(results: dict[str, list]) -> str:
  rows = []
  for name, runs in results.items():
    ok = [r for r in runs if isinstance(r, list)]
    if not ok:
      rows.append([name, FLAG_SETS[name] or '(none)',
                   'error: ' + runs[0]['error'].splitlines()[-1][:80]])
      continue
    cells = []
    for i in range(len(FLAG_CASES)):
      best = max(r[i]['gflops'] for r in ok)
      cells.append(f'{best:.0f} {ok[0][i]["kernel"]}')
    rows.append([name, FLAG_SETS[name] or '(none)'] + cells)
  header = ['flag set', 'XLA_FLAGS'] + [c[0] for c in FLAG_CASES]
  return ('GFLOP/s (best process) and the kernel, at the 2048 -> 2048 '
          f'layer, batch {BATCH}; z, dx and dw as jax.grad writes them '
          'unless said:\n\n' + _table(header, rows))


# ---------------------------------------------------------------------------
# PyTorch at the same shapes.


def torch_section(layers: Sequence[str], rounds: int) -> list[Case] | None:
  """torch's forward, dx and dw (transposes are BLAS flags, no copies)."""
  try:
    import torch  # noqa: PLC0415
  except (ImportError, OSError):  # absent, or a broken install
    return None
  cases = []
  for layer in layers:
    num_in, num_out = map(int, layer.split('x'))
    flops = 2.0 * BATCH * num_in * num_out
    for dtype, tdtype in (('float32', torch.float32),
                          ('bfloat16', torch.bfloat16)):
      o = {k: torch.from_numpy(np.array(v, np.float32)).to(tdtype)
           for k, v in _operands(num_in, num_out, jnp.float32).items()}
      for matmul, fn in ((FORWARD, lambda o=o: o['x_BxI'] @ o['w_IxO']),
                         (DX, lambda o=o: o['g_BxO'] @ o['w_IxO'].T),
                         (DW, lambda o=o: o['x_BxI'].T @ o['g_BxO'])):
        fn()
        cases.append(Case((layer, dtype, matmul), fn, flops,
                          f'torch {torch.get_num_threads()} threads'))
  run_rounds(cases, rounds)
  return cases


def torch_report(cases: Sequence[Case], xla: Sequence[Case] | None) -> str:
  best_xla = {}
  for c in xla or ():
    k = c.key[:3]
    best_xla[k] = max(best_xla.get(k, 0.0), c.gflops)
  rows = []
  for c in cases:
    x = best_xla.get(c.key)
    rows.append([c.key[0], c.key[1], c.key[2], f'{c.gflops:.0f}',
                 '-' if x is None else f'{x:.0f}',
                 '-' if x is None else f'{x / c.gflops:.2f}x'])
  return _table(['layer', 'dtype', 'matmul', 'torch GFLOP/s',
                 'XLA best formulation GFLOP/s', 'XLA / torch'], rows)


def isa_section(rounds: int) -> dict[str, Any]:
  """fma_peak.c in one process per core at once: the cores' peaks.

  Returns:
    {'per_process': [{'f32_gflops', 'bf16_gflops'}...], 'f32_gflops',
    'bf16_gflops'} (sums over processes), or {'skipped': why}.
  """
  compiler = next((c for c in ('cc', 'gcc', 'clang') if shutil.which(c)),
                  None)
  if compiler is None:
    return {'skipped': 'no C compiler (cc, gcc or clang) on PATH'}
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      cpu_flags = set(next(line for line in f
                           if line.startswith('flags')).split())
  except (OSError, StopIteration):
    cpu_flags = set()
  if not {'avx512f', 'avx512_bf16'} <= cpu_flags:
    return {'skipped': 'the CPU lacks AVX-512 with AVX512_BF16 (or is not '
                       'x86-64 Linux)'}
  source = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        'fma_peak.c')
  with tempfile.TemporaryDirectory() as tmp:
    exe = os.path.join(tmp, 'fma_peak')
    subprocess.run([compiler, '-O2', source, '-o', exe], check=True,
                   capture_output=True)
    cores = len(os.sched_getaffinity(0))
    processes = [subprocess.Popen([exe, '50000000', str(rounds)],
                                  stdout=subprocess.PIPE, text=True)
                 for _ in range(cores)]
    per_process = [json.loads(p.communicate()[0]) for p in processes]
  return {'per_process': per_process,
          'f32_gflops': sum(p['f32_gflops'] for p in per_process),
          'bf16_gflops': sum(p['bf16_gflops'] for p in per_process)}


def isa_report(result: dict[str, Any]) -> str:
  if 'skipped' in result:
    return f'skipped: {result["skipped"]}'
  cores = f'{len(result["per_process"])} at once'
  rows = [[cores, 'sum', f'{result["f32_gflops"]:.0f}',
           f'{result["bf16_gflops"]:.0f}',
           f'{result["bf16_gflops"] / result["f32_gflops"]:.2f}x']]
  for i, p in enumerate(result['per_process']):
    rows.append([cores, f'process {i}', f'{p["f32_gflops"]:.0f}',
                 f'{p["bf16_gflops"]:.0f}',
                 f'{p["bf16_gflops"] / p["f32_gflops"]:.2f}x'])
  return _table(['cores', 'rate of', 'f32 FMA GFLOP/s', 'bf16 dot GFLOP/s',
                 'bf16 / f32'], rows)


def main(argv: Sequence[str]) -> None:
  del argv
  if FLAGS.child:
    _child(json.loads(FLAGS.child))
    return
  bad = (set(FLAGS.sections) - set(SECTIONS)
         or set(FLAGS.flag_sets) - set(FLAG_SETS))
  if bad:
    sys.exit(f'error: unknown {sorted(bad)}')
  print(f'jax {jax.__version__}, {os.cpu_count()} cores, load average '
        f'{os.getloadavg()[0]:.1f}', flush=True)
  results = {}
  xla_cases = None
  if 'formulations' in FLAGS.sections:
    xla_cases = formulation_cases(FLAGS.layers)
    run_rounds(xla_cases, FLAGS.rounds)
    results['formulations'] = [dataclasses.asdict(c) | {'fn': None}
                               for c in xla_cases]
    print(f'\n### Formulations (best of {FLAGS.rounds} interleaved rounds)')
    print(formulations_report(xla_cases), flush=True)
  if 'torch' in FLAGS.sections:
    torch_cases = torch_section(FLAGS.layers, FLAGS.rounds)
    if torch_cases is None:
      print('\nnote: torch is not installed; no PyTorch rows.')
    else:
      results['torch'] = [dataclasses.asdict(c) | {'fn': None}
                          for c in torch_cases]
      print(f'\n### PyTorch (best of {FLAGS.rounds} rounds)\n')
      print(torch_report(torch_cases, xla_cases), flush=True)
  if 'step' in FLAGS.sections:
    results['step'] = step_section(FLAGS.rounds)
    print(f'\n### The large model\'s step (best of {FLAGS.rounds} rounds)')
    print(step_report(results['step']), flush=True)
  if 'flags' in FLAGS.sections:
    results['flags'] = flags_section(FLAGS.flag_sets, FLAGS.flag_rounds)
    print(f'\n### XLA_FLAGS ({FLAGS.flag_rounds} processes each, '
          'interleaved)\n')
    print(flags_report(results['flags']))
  if 'isa' in FLAGS.sections:
    results['isa'] = isa_section(FLAGS.rounds)
    print('\n### Multiply-add instructions alone (benchmarks/fma_peak.c, best '
          f'of {FLAGS.rounds} rounds)\n')
    print(isa_report(results['isa']), flush=True)
  print(f'\nload average after: {os.getloadavg()[0]:.1f}')
  if FLAGS.json:
    with open(FLAGS.json, 'w', encoding='utf-8') as f:
      json.dump(results, f, indent=1, default=str)


if __name__ == '__main__':
  app.run(main)
