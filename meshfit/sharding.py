"""Where the mesh is built and where partition specs come from.

Models name their dimensions with logical axes (`models/mlp.py`); this module
alone maps them to the two mesh axes:

  batch -> 'data'    examples are split over data-parallel devices
  mlp   -> 'model'   hidden features are split over model-parallel devices
  vocab -> 'model'   a category table's rows (when they divide evenly)
  embed, out, feature, bin -> ()   kept whole (replicated)

With several processes (hosts), 'model' stays within each host and 'data'
spans the hosts: see `multiprocess_device_grid`.
"""

import collections
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from meshfit.errors import UsageError
from models import embeddings, mlp

DATA = 'data'
MODEL = 'model'
AXES = (DATA, MODEL)

LOGICAL_RULES: dict[str, str | None] = {
    'batch': DATA,
    mlp.HIDDEN_AXIS: MODEL,
    embeddings.VOCAB_AXIS: MODEL,
    mlp.EMBED_AXIS: None,
    mlp.OUT_AXIS: None,
    embeddings.FEATURE_AXIS: None,
    embeddings.BIN_AXIS: None,
}


def mesh_shape(data: int, model: int, num_devices: int) -> tuple[int, int]:
  """Resolves a `-1` in the configured (data, model) shape and checks it.

  Args:
    data: size of the data axis, or -1 for "all remaining devices".
    model: size of the model axis, or -1.
    num_devices: devices in the job (all hosts).

  Returns:
    The (data, model) shape, whose product is `num_devices`.

  Raises:
    UsageError: the shape cannot tile the devices.
  """
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


def multiprocess_device_grid(shape: tuple[int, int],
                             devices: Sequence[jax.Device]) -> np.ndarray:
  """Arranges the devices of several processes as a (data, model) grid.

  The hybrid (ICI x DCN) layout of TPU pods: each process's devices form a
  (data / processes, model) block laid out for the host's own interconnect,
  and the blocks are stacked along 'data' in process order. So 'model' (an
  all-reduce every layer) never crosses the slower network between hosts,
  and each process holds one contiguous block of every batch's rows.

  Args:
    shape: the (data, model) mesh shape, over all of `devices`.
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
  devices_per_process = next(iter(per_process.values()))
  model = shape[1]
  return mesh_utils.create_hybrid_device_mesh(
      (devices_per_process // model, model), (len(per_process), 1),
      devices, process_is_granule=True)


def make_mesh(data: int, model: int,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Builds the (data, model) mesh over `devices` (default: all devices).

  Axes are Auto so that XLA's sharding propagation places the activations
  and inserts the collectives implied by the parameter specs. Devices of
  several processes get the hybrid layout of `multiprocess_device_grid`.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(data, model, len(devices))
  axis_types = (jax.sharding.AxisType.Auto,) * 2
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
  """Examples over 'data', features whole: how every batch array is laid out."""
  return NamedSharding(mesh, P(DATA))


def chunk_sharding(mesh: Mesh) -> NamedSharding:
  """A call's K batches (K x B x ...): each batch laid out as batch_sharding."""
  return NamedSharding(mesh, P(None, DATA))


def replicated(mesh: Mesh) -> NamedSharding:
  """A global array held whole by every device (steps, RNG, statistics)."""
  return NamedSharding(mesh, P())
