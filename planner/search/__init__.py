"""The search: the space of candidates, the evaluator that scores them with the cost model, and the strategies
that walk the space (Optuna, fast, exhaustive, exhaustive priced in bulk). Importing this package imports no
optuna and no numpy."""
