"""A run's data on the mesh: its splits loaded or prepared (splits), batches
fed to the devices in the one data order (feeding), and the feature
statistics and input layout the model is built for (features).

May import parallel and config, input_pipeline (which knows nothing of
meshes) and models (the input shape a model reads).
"""
