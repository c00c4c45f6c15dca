"""Cost models: predict memory and time of a sequence-parallel training candidate without running it.

The analytic model (pure Python floats, no torch) is ``estimate(model, hw, workload, candidate)``;
``memory_only``, ``fits`` and ``max_seq_len`` are cheaper pieces for feasibility and max-context
searches. docs/cost_model.md derives every formula.
"""

from autosp.cost_models.estimate import estimate, fits, max_seq_len, memory_only

__all__ = ["estimate", "fits", "max_seq_len", "memory_only"]
