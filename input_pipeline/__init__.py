"""Reading data: TFDS builders, users' CSV and Parquet files, example order.

This package knows nothing of meshes or the JAX runtime (`meshfit/data/feeding.py`
places batches on devices), and its errors are its own `DataError`.
Importing it imports neither TensorFlow nor TFDS: they are imported when a
dataset has to be prepared or a split parsed for the first time (tables.py).
"""
