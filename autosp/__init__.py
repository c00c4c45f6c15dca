"""autosp: plan and compile sequence-parallel long-context training for DeepSpeed.

The public API. Importing ``autosp`` is cheap (no torch); :func:`compile` imports torch on first use.

- :func:`plan` searches the best plan for a model, context length and cluster (numpy + optuna only).
- :func:`load_plan` reads a plan JSON written by ``autosp-plan --plan-out``.
- :func:`compile` turns an unmodified causal LM into a sequence-parallel DeepSpeed training engine.
"""

from autosp.errors import AutospError, InfeasibleError, UsageError
from autosp.version import __version__

__all__ = ["__version__", "AutospError", "InfeasibleError", "UsageError", "compile", "load_plan", "plan"]


def plan(model, ctx, hw, **options):
    """Search the best plan; see ``autosp-plan --help`` for the options. Returns a Plan."""
    from autosp.planner.api import make_plan

    return make_plan(model, ctx, hw, **options)


def load_plan(path):
    """Read and validate a plan JSON file."""
    from autosp.planner.plan import load_plan as _load_plan

    return _load_plan(path)


def compile(model, plan=None, sp_size=None, **options):  # noqa: A001 - mirrors torch.compile
    """Compile ``model`` for sequence-parallel training; returns an engine (call, backward, step)."""
    from autosp.compiler.api import compile_model

    return compile_model(model, plan=plan, sp_size=sp_size, **options)
