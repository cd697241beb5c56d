"""Where the mesh is built and where partition specs come from.

Models name their dimensions with logical axes (`models/mlp.py`); this module
alone maps them to the three mesh axes:

  member -> 'members'  the models of an ensemble, spread over devices
  batch  -> 'data'     examples are split over data-parallel devices
  mlp    -> 'model'    hidden features are split over model-parallel devices
  vocab  -> 'model'    a category table's rows (when they divide evenly)
  embed, out, feature, bin -> ()   kept whole (replicated)

A member trains on its own devices with no collectives between members
(`mesh.members`, default 1: every device holds every member). With several
processes (hosts), 'model' stays within each host and 'members' and 'data'
span the hosts: see `multiprocess_device_grid`.
"""

import collections
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from meshfit.errors import UsageError
from meshfit.models import embeddings, mlp

MEMBERS = 'members'
DATA = 'data'
MODEL = 'model'
AXES = (MEMBERS, DATA, MODEL)
MEMBER_AXIS = 'member'  # the logical name of an ensemble's member dimension

LOGICAL_RULES: dict[str, str | None] = {
    MEMBER_AXIS: MEMBERS,
    'batch': DATA,
    mlp.HIDDEN_AXIS: MODEL,
    embeddings.VOCAB_AXIS: MODEL,
    mlp.EMBED_AXIS: None,
    mlp.OUT_AXIS: None,
    embeddings.FEATURE_AXIS: None,
    embeddings.BIN_AXIS: None,
}


def mesh_shape(data: int, model: int, num_devices: int,
               members: int = 1) -> tuple[int, int]:
  """Resolves a `-1` in the configured (data, model) shape and checks it.

  Args:
    data: size of the data axis, or -1 for "all remaining devices".
    model: size of the model axis, or -1.
    num_devices: devices in the job (all hosts).
    members: size of the members axis (no -1); the others share the rest.

  Returns:
    The (data, model) shape, whose product is `num_devices / members`.

  Raises:
    UsageError: the shape cannot tile the devices.
  """
  if members < 1 or num_devices % members:
    raise UsageError(f'mesh.members={members} does not divide the '
                     f'{num_devices} devices; use a divisor of {num_devices}')
  num_devices //= members
  if data == -1 and model == -1:
    raise UsageError('mesh.data and mesh.model are both -1; set at least one '
                     'of them to a positive size')
  for name, size in (('mesh.data', data), ('mesh.model', model)):
    if size == 0 or size < -1:
      raise UsageError(f'{name}={size} must be a positive size or -1 '
                       '("all remaining devices")')
  known = max(data, 1) * max(model, 1)
  if num_devices % known:
    raise UsageError(
        f'mesh {data} x {model} does not divide the {num_devices} devices; '
        f'choose mesh.data x mesh.model = {num_devices} (or -1 for one axis)')
  shape = (num_devices // known if data == -1 else data,
           num_devices // known if model == -1 else model)
  if shape[0] * shape[1] != num_devices:
    raise UsageError(
        f'mesh {shape[0]} x {shape[1]} = {shape[0] * shape[1]} devices, but '
        f'there are {num_devices}; make mesh.data x mesh.model = {num_devices}'
        ' or set one of them to -1')
  return shape


def check_model_within_process(model: int, devices_per_process: int) -> None:
  """Raises UsageError unless the 'model' axis fits inside one process.

  Args:
    model: size of the mesh's 'model' axis.
    devices_per_process: devices of each process (host).
  """
  if devices_per_process % model:
    raise UsageError(
        f'mesh.model={model} does not divide the {devices_per_process} '
        "devices of each process: mesh axis 'model' must stay within a host "
        "(only 'data' spans hosts); use a mesh.model that divides "
        f'{devices_per_process}')


def multiprocess_device_grid(shape: tuple[int, int, int],
                             devices: Sequence[jax.Device]) -> np.ndarray:
  """Arranges the devices of several processes as a (members, data, model)
  grid.

  The hybrid (ICI x DCN) layout of TPU pods: each process's devices form a
  block laid out for the host's own interconnect, and the blocks are
  stacked along 'members' (as far as the processes divide it), then along
  'data', in process order. So 'model' (an all-reduce every layer) never
  crosses the slower network between hosts, members need no network at
  all, and each process holds one contiguous block of every batch's rows.

  Args:
    shape: the (members, data, model) mesh shape, over all of `devices`.
    devices: devices of every process, each with a `process_index`.

  Returns:
    An object array of devices of shape `shape`.

  Raises:
    UsageError: the processes hold different numbers of devices. (That
      'model' fits inside one process is `config.check_devices`'s to check.)
  """
  per_process = collections.Counter(d.process_index for d in devices)
  if len(set(per_process.values())) != 1:
    raise UsageError(
        f'processes hold different numbers of devices ({dict(per_process)}); '
        'give every process the same number of devices')
  members, data, model = shape
  processes = len(per_process)
  across_members = np.gcd(members, processes)
  across_data = processes // across_members
  return mesh_utils.create_hybrid_device_mesh(
      (members // across_members, data // across_data, model),
      (across_members, across_data, 1), devices, process_is_granule=True)


def make_mesh(data: int, model: int,
              devices: Sequence[jax.Device] | None = None,
              members: int = 1) -> Mesh:
  """Builds the (members, data, model) mesh over `devices` (default: all).

  Axes are Auto so that XLA's sharding propagation places the activations
  and inserts the collectives implied by the parameter specs. Devices of
  several processes get the hybrid layout of `multiprocess_device_grid`.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = (members, *mesh_shape(data, model, len(devices), members))
  axis_types = (jax.sharding.AxisType.Auto,) * 3
  if len({d.process_index for d in devices}) > 1:
    return Mesh(multiprocess_device_grid(shape, devices), AXES,
                axis_types=axis_types)
  if devices == jax.devices():
    return jax.make_mesh(shape, AXES, axis_types=axis_types)
  return Mesh(np.array(devices).reshape(shape), AXES, axis_types=axis_types)


def logical_to_mesh(logical: Sequence[str | None]) -> P:
  """Maps a tuple of logical axis names to a mesh PartitionSpec."""
  return P(*(None if name is None else LOGICAL_RULES[name] for name in logical))


def param_sharding(logical_specs, mesh: Mesh, shapes=None):
  """NamedShardings for a pytree of logical PartitionSpecs (from nnx).

  With `shapes` (a matching pytree of arrays or ShapeDtypeStructs), a
  dimension that does not divide evenly over its mesh axis is kept whole
  instead (the config's checks make that rare: a category table of an odd
  size on an odd model axis).
  """
  def place(spec, shape=None):
    axes = list(logical_to_mesh(spec))
    if shape is not None:
      axes = [a if a is None or d % mesh.shape[a] == 0 else None
              for a, d in zip(axes, shape.shape)]
    return NamedSharding(mesh, P(*axes))
  if shapes is None:
    return jax.tree.map(place, logical_specs,
                        is_leaf=lambda x: isinstance(x, P))
  return jax.tree.map(place, logical_specs, shapes,
                      is_leaf=lambda x: isinstance(x, P))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Examples over 'data', features whole: an evaluation batch (B x ...),
  which every member reads."""
  return NamedSharding(mesh, P(DATA))


def member_batch_sharding(mesh: Mesh) -> NamedSharding:
  """A training step's batches, one per member (M x B x ...): members over
  'members', each one's examples over 'data'."""
  return NamedSharding(mesh, P(MEMBERS, DATA))


def chunk_sharding(mesh: Mesh) -> NamedSharding:
  """A call's K steps of batches (K x M x B x ...): each step's laid out as
  member_batch_sharding."""
  return NamedSharding(mesh, P(None, MEMBERS, DATA))


def member_sharding(mesh: Mesh) -> NamedSharding:
  """One value per member (M x ...), on the members' devices."""
  return NamedSharding(mesh, P(MEMBERS))


def replicated(mesh: Mesh) -> NamedSharding:
  """A global array held whole by every device (steps, RNG, statistics)."""
  return NamedSharding(mesh, P())
