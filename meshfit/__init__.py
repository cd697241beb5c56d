"""meshfit: MLP regressors trained, checkpointed and served on a JAX mesh.

The sub-packages, each owning one job, import each other in one direction
(a package imports only those before it; tests/test_imports.py holds them to
it, docs/design.md draws it):

  parallel     the mesh, sharding rules, jax.distributed, XLA flags, the
               compilation cache, fetching device values without waiting
  config       the run config: typed, checked, saved in the workdir, sized
  data         a run's splits, batches on the mesh, feature statistics
  model        train state, optimizer, jitted train steps, the model run
               forward and over a table, members, uncertainty, ridge parts
               and per-member vocabularies
  checkpoints  Orbax checkpoints, the workdir lock, reading a saved model
  report       scalar writers (console, TensorBoard, metrics.jsonl), plots
  train        the training loop and what it schedules
  serve        eval, predict and export of a saved model
  api          the library: fit, load and Model (train.py is its client)

`errors` sits below them all. Beneath them: `input_pipeline` (tables,
column plans, prepared copies), `models` (Flax modules), `configs`, and
`storage`, the one file layer every run file goes through (local or gs://):
meshfit.input_pipeline and so on, folders beside meshfit/ in a checkout and
inside it once installed.

`import meshfit` imports none of them (train.py sets the environment up
before JAX starts); `meshfit.fit`, `meshfit.load`, `meshfit.Model` and the
errors load the library on first use (`meshfit.Regressor`, the
scikit-learn estimator, scikit-learn too).
"""

import importlib
import os
from typing import Any

# A checkout keeps storage/, models/, ... beside meshfit/ (an installed one
# inside it): either way they are meshfit.storage, meshfit.models, ...
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if (not os.path.isdir(os.path.join(os.path.dirname(__file__), 'models'))
    and os.path.isfile(os.path.join(_ROOT, 'models', '__init__.py'))):
  __path__.append(_ROOT)  # noqa: F821  (a package's own __path__)

# Public name -> the module that defines it.
_EXPORTS = {
    'fit': 'meshfit.api', 'load': 'meshfit.api', 'Model': 'meshfit.api',
    'Regressor': 'meshfit.api.estimator',
    'UsageError': 'meshfit.errors',
    'DataError': 'meshfit.input_pipeline.errors',
    'StorageError': 'meshfit.storage.errors',
    'NonFiniteLossError': 'meshfit.train.loss_watch',
    'Preempted': 'meshfit.train.preemption',
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
  if name not in _EXPORTS:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_EXPORTS))
