"""What a training run needs around an :class:`~autosp.compiler.runtime.SPEngine` (``autosp-train``): one module
per concern -- the loop itself, the schedule, evaluation, step logging, checkpoints, export and signals.
``autosp-train`` (:mod:`autosp.compiler.train_cli`) calls them through a few hooks, and the Python API through the
engine's methods."""
