"""What a run shows: scalars to the console, TensorBoard and metrics.jsonl
(writers), the console's progress display (progress) and which log records
reach it (log_filter), and the figures (plots).

Imports nothing of meshfit: its files go through storage.
"""
