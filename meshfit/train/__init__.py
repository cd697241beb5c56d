"""The training loop (loop) and what it schedules: how many steps each
jitted call runs (call_plan), evaluations and the best step (evaluations,
validation), checkpoints (checkpoint_policy), a non-finite loss
(loss_watch), SIGTERM (preemption) and the profiler (profiling).

May import every sub-package but serve.
"""
