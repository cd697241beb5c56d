"""The config a trained run is used with, by train.py's eval, predict and
export modes and by `Model` alike."""

from collections.abc import Iterable

import jax
import ml_collections

from meshfit import storage
from meshfit.checkpoints import workdir_lock
from meshfit.config import json_files


def run_config(workdir: str,
               given: ml_collections.ConfigDict | None = None,
               keys: Iterable[str] = (), keep_mesh: bool = False
               ) -> ml_collections.ConfigDict:
  """The config a trained run is used with (--mode=eval, predict, export
  and `Model`): the one saved in `workdir`, with evaluation keys from
  `given`, on this machine's devices.

  Args:
    workdir: the run's directory.
    given: a config whose `keys` override the saved one's (only evaluation
      keys may differ).
    keys: the dotted keys taken from `given`.
    keep_mesh: keep the saved mesh even where it does not tile this
      machine's devices (the user set one; its check says what is wrong).

  Raises:
    UsageError: no run in `workdir`, a workdir of an unknown state, or an
      override of a key that changes the model.
  """
  workdir_lock.check_workdir(workdir)
  config = json_files.load_json(storage.join(workdir, 'config.json'))
  if given is not None:
    config = json_files.merge_eval_overrides(config, given, keys)
  if not keep_mesh:
    config = json_files.fit_saved_mesh(config, jax.device_count(),
                                       jax.local_device_count())
  return config
