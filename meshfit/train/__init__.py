"""The training loop (loop), where a run starts (resume: the newest
checkpoint it may resume, or a fresh state), and what the loop schedules:
how many steps each jitted call runs (call_plan), evaluations and the best
step (evaluations, validation), checkpoints (checkpoint_policy), a
non-finite loss (loss_watch), SIGTERM (preemption), the profiler
(profiling) and the train scalars' log line (train_log).

May import every sub-package but serve.
"""
