"""What is learnt and how: the train state and its shardings (state), the
optimizer (optim), the jitted train steps (steps), the model run forward:
members' outputs, predictions and the eval step (forward), a run's set-up
(setup), the model over a whole table (inference), metrics sums (metrics),
members' weights (selection), predictive distributions (uncertainty),
ridge parts fitted in closed form (ridge_fit) and each member's category
vocabulary counted on its own rows (vocabulary_fit).

May import parallel, config, data and models.
"""
