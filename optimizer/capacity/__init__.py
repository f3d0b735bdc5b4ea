"""Capacity planning: goodput, time to train, cost and energy of plans (``formulas``, ``annotate``),
suggested GPU counts (``suggest``), the objectives (``plans``) and sweeps (``sweep``)."""
