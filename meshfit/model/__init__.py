"""What is learnt and how: the train state and its shardings (state), the
optimizer (optim), the jitted train, eval and predict steps (steps), a
run's set-up (setup), the model over a whole table (inference), metrics
sums (metrics), members' weights (selection), predictive distributions
(uncertainty) and ridge parts fitted in closed form (ridge_fit).

May import parallel, config, data and models.
"""
