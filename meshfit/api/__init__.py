"""The library: `fit` a table, `load` a run, and a `Model` to predict,
evaluate, export, plot and save, from a notebook or a script.

It sits above the others (train.py is its client): each call does what a
train.py mode does, through the same functions, with the same workdir.
Library calls raise (UsageError, DataError, ...) and never exit.

Importing it sets up the process as train.py does before JAX starts: XLA's
flags, storage's environment, TensorFlow's C++ logs quiet.
"""

from meshfit.parallel import process

process.prepare()  # before JAX, TensorFlow, Orbax and etils are imported

from meshfit.api.fitting import fit, load  # noqa: E402
from meshfit.api.model import Model  # noqa: E402

__all__ = ['Model', 'fit', 'load']
