"""Flax NNX models. Modules only: no config objects, no mesh, no I/O."""
