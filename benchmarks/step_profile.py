"""Where a training step's time goes: a run's profile, op by op and by part.

Profile a window of a run's steps, with XLA writing the compiled train call
beside it, then read both:

    XLA_FLAGS='--xla_dump_to=DUMP --xla_dump_hlo_as_text
        --xla_dump_hlo_module_re=.*train_call.* --xla_dump_hlo_pass_re=NOTHING' \\
      python train.py --config=configs/csv.py --workdir=W ... \\
        --config.profile_start_step=291 --config.profile_num_steps=290 \\
        --config.early_stopping_evals=0 --config.num_train_steps=600
    python benchmarks/step_profile.py --run_dir=W --hlo_dump=DUMP --profiled_steps=290

Every op the trace times (on every thread) is summed; the compiled program
names each op's part of the model by the named scopes of models/mlp.py and
meshfit/model/steps.py (`number_embedding`, `hidden_0`, `optimizer`, ...;
an op of a part's gradient is that part's). The first table is the time by
part, the second the most costly ops with their shapes. Times are op time
summed over threads, so a step's op time exceeds its wall time where XLA
runs ops side by side.
"""

import collections
import dataclasses
import glob
import os
import re

from absl import app, flags

from bench_common import markdown_table

# Names no other benchmark defines: the tests import this module beside
# them (uci.py's --workdir).
flags.DEFINE_string('run_dir', None, 'A workdir whose profile/ holds a '
                    'trace (config.profile_start_step).', required=True)
flags.DEFINE_string('hlo_dump', None, "XLA's --xla_dump_to folder of the "
                    'same run: names each op part of the model.')
flags.DEFINE_integer('profiled_steps', 1,
                     'Steps the trace holds (times per step).')
flags.DEFINE_integer('top_ops', 15, 'Ops in the second table.')
FLAGS = flags.FLAGS

# The named scopes a step's ops are grouped by, in the order printed.
PARTS = ('batch', 'number_embedding', 'category_embedding', 'hidden_0',
         'hidden_1', 'hidden_2', 'hidden_3', 'head', 'loss', 'optimizer')
# The train call's program, and its ops whose spans hold other ops.
MODULE = 'jit_train_call'
CONTAINERS = re.compile(r'^(while|call|conditional)(\.\d+)?$')

@dataclasses.dataclass
class Op:
  """One compiled op: its output shape and the op_name XLA recorded."""
  shape: str = ''
  op_name: str = ''

  @property
  def part(self) -> str:
    """The model part the op belongs to, from the innermost named scope in
    its op_name ('other' if none)."""
    # A scope shows as a path component or inside a transform's parentheses
    # ('vmap(transpose(jvp(hidden_0)))/dot_general').
    found = [(m.start(), p) for p in PARTS
             for m in re.finditer(rf'(?<![\w]){p}(?![\w])', self.op_name)]
    return max(found)[1] if found else 'other'


def read_ops(hlo_text: str) -> dict[str, Op]:
  """Each instruction of a compiled module's text: name -> Op."""
  ops = {}
  for line in hlo_text.splitlines():
    match = re.match(r'\s*(?:ROOT )?%?([\w.\-]+) = (\S+)', line)
    if match:
      op_name = re.search(r'op_name="([^"]*)"', line)
      ops[match[1]] = Op(re.sub(r'\{[^}]*\}$', '', match[2]),
                         op_name[1] if op_name else '')
  return ops


def train_call_ops(dump_dir: str) -> dict[str, Op]:
  """The ops of the newest train call compiled into `dump_dir`."""
  # (XLA:CPU names the file cpu_after_optimizations.txt; a program loaded
  # from the compilation cache, after_optimizations.txt.)
  files = sorted(glob.glob(os.path.join(
      dump_dir, '*jit_train_call*after_optimizations.txt')))
  if not files:
    raise app.UsageError(f'no compiled train call in {dump_dir}: run with '
                         'XLA_FLAGS as the docstring says')
  with open(files[-1], encoding='utf-8') as f:
    return read_ops(f.read())


def op_times(workdir: str) -> tuple[dict[str, float], dict[str, int]]:
  """Milliseconds and events of every op of the train call in the run's
  trace, summed over its threads."""
  # TensorFlow (a TFDS dependency) carries the trace's protobuf.
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: PLC0415
  paths = glob.glob(os.path.join(workdir, 'profile', '**', '*.xplane.pb'),
                    recursive=True)
  if not paths:
    raise app.UsageError(f'no trace in {workdir}/profile: run with '
                         '--config.profile_start_step')
  space = xplane_pb2.XSpace()
  with open(sorted(paths)[-1], 'rb') as f:
    space.ParseFromString(f.read())
  ms, events = collections.Counter(), collections.Counter()
  for plane in space.planes:
    names = {k: v.name for k, v in plane.event_metadata.items()}
    stats = {k: v.name for k, v in plane.stat_metadata.items()}
    module = next((k for k, v in stats.items() if v == 'hlo_module'), None)
    for line in plane.lines:
      for event in line.events:
        name = names.get(event.metadata_id, '')
        in_module = any(
            s.metadata_id == module and stats.get(s.ref_value) == MODULE
            for s in event.stats)
        if in_module and not CONTAINERS.match(name):
          ms[name] += event.duration_ps / 1e9
          events[name] += 1
  return ms, events


def part_rows(ms: dict[str, float], ops: dict[str, Op], steps: int
              ) -> list[list[object]]:
  """Time per part: ms per step and share of the op time."""
  by_part = collections.Counter()
  for name, t in ms.items():
    by_part[ops.get(name, Op()).part] += t
  total = sum(by_part.values())
  order = [p for p in (*PARTS, 'other') if by_part[p]]
  return [[part, f'{by_part[part] / steps:.3f}',
           f'{100 * by_part[part] / total:.0f}%'] for part in order] + [
               ['all', f'{total / steps:.3f}', '100%']]


def op_rows(ms: dict[str, float], events: dict[str, int],
            ops: dict[str, Op], steps: int, top: int) -> list[list[object]]:
  """The `top` most costly ops."""
  total = sum(ms.values())
  return [[name, events[name], f'{t / steps:.3f}', f'{100 * t / total:.1f}%',
           ops.get(name, Op()).part, ops.get(name, Op()).shape]
          for name, t in sorted(ms.items(), key=lambda kv: -kv[1])[:top]]


def main(argv: list[str]) -> None:
  del argv
  ms, events = op_times(FLAGS.run_dir)
  ops = train_call_ops(FLAGS.hlo_dump) if FLAGS.hlo_dump else {}
  print(f'{FLAGS.run_dir}: op time per step over {FLAGS.profiled_steps} steps')
  print(markdown_table(['part', 'ms per step', 'share'],
                       part_rows(ms, ops, FLAGS.profiled_steps)))
  print()
  print(markdown_table(['op', 'events', 'ms per step', 'share', 'part',
                        'shape'],
                       op_rows(ms, events, ops, FLAGS.profiled_steps,
                               FLAGS.top_ops)))


if __name__ == '__main__':
  app.run(main)
