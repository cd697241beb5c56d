"""The order of a table held in memory, made where the table is.

Each member's epoch is a keyed bijection of its training rows, computed for
any stream position from (seed, member, epoch, position) alone, so a
resident table's batches are made on the devices inside the training call
and nothing per step crosses from the host. The bijection is a Feistel
network over [0, a * b), a = ceil(sqrt(n)), b = ceil(n / a), with modular
addition in alternating radices (as format-preserving encryption does), and
cycle-walked into [0, n): at most one value in b (about one in sqrt(n)) needs
a second walk, so there is no sort and almost no waiting on stragglers.

One definition runs on numpy and on jax.numpy with the same uint32
arithmetic, so the host computes the very rows the devices do: a table in
memory but too large to copy to every device is streamed in this order too,
and the tests check the device's order against the host's. Tables larger
than memory keep input_pipeline/order.py's block order, which reads disk in
blocks.
"""

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from meshfit.input_pipeline.order import Blocks
from meshfit.parallel import sharding

# Feistel rounds (even: the device loops over pairs of them): enough that
# every output bit depends on every input bit several times over; each
# costs a hash and a remainder per entry.
ROUNDS = 6
_MASK32 = 0xFFFFFFFF


def _fmix32(xp: Any, h):
  """murmur3's finaliser: a bijective hash of uint32s (numpy or jax)."""
  h = h ^ (h >> 16)
  h = h * xp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * xp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _fmix32_int(h: int) -> int:
  """`_fmix32` of one Python int."""
  h &= _MASK32
  h ^= h >> 16
  h = (h * 0x85EBCA6B) & _MASK32
  h ^= h >> 13
  h = (h * 0xC2B2AE35) & _MASK32
  return h ^ (h >> 16)


def member_key(seed: int, member: int) -> int:
  """A member's uint32 key, from every bit of the seed."""
  key = _fmix32_int(member + 0x3C6EF372)
  seed &= (1 << 64) - 1
  for part in (seed >> 32, seed & _MASK32):
    key = _fmix32_int(key ^ _fmix32_int(part + 0x9E3779B9))
  return key


def radices(n: int) -> tuple[int, int]:
  """(a, b): the Feistel network's two radices for a domain of n, a * b >=
  n and a * b - n < a."""
  a = max(1, math.isqrt(n - 1) + 1) if n > 1 else 1
  return a, max(1, -(-n // a))


def permute(xp: Any, i, n, a, b, key, epoch):
  """Entry `i` of the epoch's order: a bijection of [0, n) per (key, epoch).

  Every argument broadcasts against `i`; all are unsigned 32-bit or
  convertible to it, and `i` < n.
  """
  if xp is np:  # numpy warns of the wrap-around that hashing relies on
    with np.errstate(over='ignore'):
      return _permute(xp, i, n, a, b, key, epoch)
  return _permute(xp, i, n, a, b, key, epoch)


def _permute(xp: Any, i, n, a, b, key, epoch):
  u32 = xp.uint32
  i, n, a, b, key, epoch = (xp.asarray(v, dtype=u32)
                            for v in (i, n, a, b, key, epoch))
  epoch_key = _fmix32(xp, key ^ _fmix32(xp, epoch * u32(0x9E3779B9)
                                        + u32(0x7F4A7C15)))

  # One definition of the network for numpy and jax. On jax the program
  # holds one round pair, looped, and one walk (compiling the network is
  # most of what the order adds to a training program).
  def round_pair(r, halves):
    left, right = halves
    for size, k in ((a, 2 * r), (b, 2 * r + 1)):
      round_key = _fmix32(xp, epoch_key
                          + xp.asarray(k).astype(u32) * u32(0x632BE5AB))
      left, right = right, (left + _fmix32(xp, right ^ round_key) % size
                            ) % size
    return left, right

  def network(x):
    halves = (x // b, x % b)
    if xp is np:
      for r in range(ROUNDS // 2):
        halves = round_pair(r, halves)
    else:
      halves = jax.lax.fori_loop(0, ROUNDS // 2, round_pair, halves)
    left, right = halves
    return left * b + right

  # Every entry walks once, then those still outside [0, n) again.
  def walk(carry):
    x, outside = carry
    x = xp.where(outside, network(x), x)
    return x, x >= n

  carry = (i, xp.ones(i.shape, bool))
  if xp is np:
    while carry[1].any():
      carry = walk(carry)
  else:
    carry = jax.lax.while_loop(lambda carry: jnp.any(carry[1]), walk, carry)
  x, _ = carry
  return x


@dataclasses.dataclass(frozen=True)
class MemberRows:
  """What each member's order needs, one entry per member: its training
  rows as blocks of `block_rows[m]` rows (all full but possibly the last),
  their starts padded to one length, and its Feistel radices and key."""
  starts_MxS: np.ndarray  # int32
  num_rows_M: np.ndarray  # int32, n
  block_rows_M: np.ndarray  # int32
  a_M: np.ndarray  # int32
  b_M: np.ndarray  # int32
  key_M: np.ndarray  # uint32

  @classmethod
  def of(cls, member_blocks: Sequence[Blocks], seed: int,
         num_starts: int = 0) -> 'MemberRows':
    """Args:
      member_blocks: each member's training blocks, in table order.
      seed: the run's seed.
      num_starts: pads the starts to at least this length, so that tables
        of nearby lengths (a cross-validation's folds) give the training
        call arrays of one shape, and one compiled program.
    """
    num_starts = max(num_starts, *(len(blocks) for blocks in member_blocks))
    starts = np.zeros((len(member_blocks), num_starts), np.int32)
    block_rows, num_rows, a, b = [], [], [], []
    for m, blocks in enumerate(member_blocks):
      sizes = blocks.stop - blocks.start
      if not len(blocks) or (sizes[:-1] != sizes.max()).any():
        raise ValueError('training blocks must be of one size but the last')
      starts[m, :len(blocks)] = blocks.start
      block_rows.append(int(sizes.max()))
      num_rows.append(blocks.num_rows)
      a_m, b_m = radices(blocks.num_rows)
      a.append(a_m)
      b.append(b_m)
    if max(num_rows) + (1 << 24) >= 1 << 31:
      raise ValueError('a member trains on more rows than the device order '
                       'counts in 32 bits')
    return cls(starts, np.array(num_rows, np.int32),
               np.array(block_rows, np.int32), np.array(a, np.int32),
               np.array(b, np.int32),
               np.array([member_key(seed, m) for m in range(len(a))],
                        np.uint32))

  def arrays(self) -> dict[str, np.ndarray]:
    return dataclasses.asdict(self)

  def stream_at(self, position: int) -> dict[str, np.ndarray]:
    """Each member's epoch and offset into it at stream entry `position`
    (the host's part of a call: two int32s per member)."""
    n = self.num_rows_M.astype(np.int64)
    return {'epoch_M': (position // n).astype(np.int32),
            'offset_M': (position % n).astype(np.int32)}


def device_rows(chunk: dict, mesh: Mesh) -> jax.Array:
  """`host_rows` on the devices, inside a jitted call: each device computes
  only the entries it holds (K x its members x its share of the batch), so
  a cycle-walk waits on no other device.

  Args:
    chunk: `{'order': ..., 'epoch_M': ..., 'offset_M': ...}` as
      `meshfit.data.feeding.TrainFeed` hands it out; 'order' holds
      `MemberRows.arrays()` and `step_offset_K` (k * B) and `entry_B`
      (0..B-1), on the devices since the run began.
    mesh: the device mesh.

  Returns:
    int32 rows_KxMxB, sharded over 'members' and 'data'.
  """
  def local(order, epoch_M, offset_M):
    step_entry = (order['step_offset_K'][:, None, None]
                  + order['entry_B'][None, None, :])
    return _rows_at(jnp, order, epoch_M, offset_M, step_entry)

  member = P(sharding.MEMBERS)
  specs = {name: member for name in chunk['order']}
  specs.update(step_offset_K=P(), entry_B=P(sharding.DATA))
  return jax.shard_map(
      local, mesh=mesh, in_specs=(specs, member, member),
      out_specs=P(None, sharding.MEMBERS, sharding.DATA),
      check_vma=False)(chunk['order'], chunk['epoch_M'], chunk['offset_M'])


def host_rows(order: dict[str, np.ndarray], epoch_M: np.ndarray,
              offset_M: np.ndarray, num_batches: int, batch_size: int,
              entries: slice = slice(None)) -> np.ndarray:
  """`device_rows` on the host, for the batch entries `entries`: int32
  rows_KxMxE of the members given."""
  start, stop, _ = entries.indices(batch_size)
  k = np.arange(num_batches, dtype=np.int32)[:, None, None]
  j = np.arange(start, stop, dtype=np.int32)[None, None, :]
  return _rows_at(np, order, epoch_M, offset_M, k * batch_size + j)


def _rows_at(xp: Any, order: dict, epoch_M, offset_M, step_entry_KxME):
  """Rows at stream entries `offset + step_entry` of each member."""
  def per_member(v):
    return xp.asarray(v)[None, :, None]
  n = per_member(order['num_rows_M'])
  q = per_member(offset_M) + step_entry_KxME
  epoch = per_member(epoch_M) + q // n
  place = permute(xp, q % n, n, per_member(order['a_M']),
                  per_member(order['b_M']), per_member(order['key_M']),
                  epoch).astype(xp.int32)
  r = per_member(order['block_rows_M'])
  member_M = xp.arange(place.shape[1])[None, :, None]
  return xp.asarray(order['starts_MxS'])[member_M, place // r] + place % r
