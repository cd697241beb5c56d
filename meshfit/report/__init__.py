"""What a run shows: scalars to the console, TensorBoard and metrics.jsonl
(writers) and the figures (plots).

Imports nothing of meshfit but errors and files.
"""
