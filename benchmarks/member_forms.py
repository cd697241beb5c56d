"""Two forms of an ensemble's members, timed on whatever device JAX finds.

    python benchmarks/member_forms.py [--members=1,8,32,128] [--hidden=64]
        [--batch=256] [--seconds=1]

`independent`: every member its own weights (meshfit's members today: the
member axis is a batch of matrix products). `shared`: every member the same
weights, scaled in and out by its own rank-1 adapters and biases
(BatchEnsemble, Wen et al. 2020; the form TabM builds on), so that the
members' matrix products are one wide product. Each member trains on its own
batch of `--batch` rows in both (meshfit cross-fits: a member must not see
the rows it is validated on). An MLP of two hidden layers of `--hidden`
units on `--hidden` inputs, plain gradient steps, 20 in one jitted call.

Prints model-examples/s (members x batch x steps/s) and that over one
independent model's: issue 31's question, whether 32 members cost about what
one model costs.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from bench_common import markdown_table

flags.DEFINE_list('members', ['1', '8', '32', '128'], 'Ensemble sizes.')
flags.DEFINE_integer('hidden', 64, 'Inputs and units of each hidden layer.')
flags.DEFINE_integer('batch', 256, 'Rows per member per step.')
flags.DEFINE_float('seconds', 1.0, 'Timed seconds per measurement.')
FLAGS = flags.FLAGS

STEPS_PER_CALL = 20


def _init(members: int, shared: bool, widths: list[int]) -> list[dict]:
  key, layers = jax.random.PRNGKey(0), []
  for fan_in, fan_out in zip(widths[:-1], widths[1:]):
    key, sub = jax.random.split(key)
    if shared:
      layers.append({
          'w': jax.random.normal(sub, (fan_in, fan_out)) / np.sqrt(fan_in),
          'r': jnp.ones((members, 1, fan_in)),
          's': jnp.ones((members, 1, fan_out)),
          'b': jnp.zeros((members, 1, fan_out))})
    else:
      layers.append({
          'w': jax.random.normal(sub, (members, fan_in, fan_out))
               / np.sqrt(fan_in),
          'b': jnp.zeros((members, 1, fan_out))})
  return layers


def _forward(layers: list[dict], x_MxBxI: jax.Array,
             shared: bool) -> jax.Array:
  h, members = x_MxBxI, x_MxBxI.shape[0]
  for i, layer in enumerate(layers):
    if shared:  # one (M*B) x I by I x O product for all members
      wide = (h * layer['r']).reshape(-1, h.shape[-1]) @ layer['w']
      h = wide.reshape(members, -1, wide.shape[-1]) * layer['s'] + layer['b']
    else:
      h = jnp.einsum('mbi,mio->mbo', h, layer['w']) + layer['b']
    if i < len(layers) - 1:
      h = jax.nn.relu(h)
  return h


def _steps(shared: bool):
  def loss(layers, x, y):
    return jnp.mean((_forward(layers, x, shared) - y)**2)

  @jax.jit
  def run(layers, x, y):
    def step(layers, _):
      grads = jax.grad(loss)(layers, x, y)
      return jax.tree.map(lambda p, g: p - 1e-3 * g, layers, grads), None
    return jax.lax.scan(step, layers, None, length=STEPS_PER_CALL)[0]
  return run


def _model_examples_per_second(members: int, shared: bool) -> float:
  widths = [FLAGS.hidden] * 3 + [1]
  layers = _init(members, shared, widths)
  x = jax.random.normal(jax.random.PRNGKey(1),
                        (members, FLAGS.batch, FLAGS.hidden))
  y = jnp.sum(x, axis=-1, keepdims=True)
  run = _steps(shared)
  layers = jax.block_until_ready(run(layers, x, y))  # compiled, warm
  steps, start = 0, time.perf_counter()
  while time.perf_counter() - start < FLAGS.seconds:
    layers = run(layers, x, y)
    steps += STEPS_PER_CALL
  jax.block_until_ready(layers)
  return steps / (time.perf_counter() - start) * members * FLAGS.batch


def main(argv: list[str]) -> None:
  del argv
  device = jax.devices()[0]
  print(f'{device.device_kind} ({device.platform}), hidden {FLAGS.hidden}, '
        f'batch {FLAGS.batch} per member')
  rates = {int(m): [_model_examples_per_second(int(m), shared)
                    for shared in (False, True)] for m in FLAGS.members}
  one = rates.get(1, [None])[0]  # one independent model's

  def vs_one(rate: float) -> str:
    return f'{rate / one:.2f}x' if one else ''
  print(markdown_table(
      ['members', 'independent, model-examples/s', 'shared + adapters',
       'independent / one model', 'shared / one model',
       'shared / independent'],
      [[m, f'{a / 1e6:.2f}M', f'{b / 1e6:.2f}M', vs_one(a), vs_one(b),
        f'{b / a:.2f}x'] for m, (a, b) in rates.items()]))


if __name__ == '__main__':
  app.run(main)
