"""The workdir's lasting state: Orbax checkpoints and their retention
(checkpointer), the one-trainer lock (workdir_lock), and a saved model's
column plan, layout and state read back for eval, predict and export
(reading).

May import parallel, config, data and model.
"""
