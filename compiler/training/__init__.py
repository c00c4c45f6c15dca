"""The training loop around an :class:`~autosp.compiler.runtime.SPEngine` (``autosp-train``): one module per
concern (the schedule, evaluation, step logging, the loop itself, checkpoints)."""
