"""Devices and processes: the mesh and partition rules (sharding), joining
a multi-host job (distributed), XLA flags, the persistent compilation
cache, and fetching device values without stalling (in_flight).

Imports nothing of meshfit but errors: every other sub-package builds on it.
"""
