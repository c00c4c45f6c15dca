"""autosp: plan and compile sequence-parallel long-context training for DeepSpeed.

The public API. Importing ``autosp`` is cheap (no torch); :func:`compile` imports torch on first use.

- :func:`plan` searches the best plan for a :class:`PlanRequest` (a model, context length and cluster;
  numpy + optuna only).
- :func:`load_plan` reads a plan JSON written by ``autosp-plan --plan-out``.
- :func:`compile` turns an unmodified causal LM into a sequence-parallel DeepSpeed training engine: what runs is a
  plan (a plan file, a Plan or a hand-made :class:`Candidate`), how it runs a :class:`CompileOptions`
  (:class:`OptimizerOptions` its AdamW and learning-rate schedule).
"""

from autosp.errors import AutospError, InfeasibleError, UsageError

__all__ = ["__version__", "AutospError", "Candidate", "CompileOptions", "InfeasibleError", "OptimizerOptions",
           "PlanRequest", "UsageError", "compile", "load_plan", "plan"]


def plan(model, ctx=None, hw=None, **options):
    """Search the best plan. ``plan(PlanRequest(...), cache=...)``, or the keyword form ``plan(model, ctx, hw,
    objective=..., ...)`` whose arguments are the request's fields (see ``autosp-plan --help``) and the run
    options of :class:`autosp.planner.api.RunOptions`. Returns a Plan. Like ``autosp-plan``, it answers a request
    asked before from the plan cache (``$AUTOSP_CACHE``, else the default file); ``cache=False`` searches afresh,
    ``cache=PATH_OR_URL`` picks another cache."""
    from dataclasses import fields

    from autosp.planner.api import RunOptions, plan_for
    from autosp.planner.request import PlanRequest

    options.setdefault("cache", True)
    run = {f.name: options.pop(f.name) for f in fields(RunOptions) if f.name in options}
    if isinstance(model, PlanRequest):
        if ctx is not None or hw is not None or options:
            raise UsageError("give a PlanRequest (and run options such as cache=), or model, ctx and hw, not both")
        return plan_for(model, **run)
    return plan_for(PlanRequest(model=model, ctx=ctx, hw=hw, **options), **run)


def __getattr__(name):  # the classes, without importing the planner or the compiler at ``import autosp``
    if name == "__version__":  # read from the distribution's metadata on first use (importlib.metadata is slow)
        from autosp.version import __version__

        return __version__
    if name == "PlanRequest":
        from autosp.planner.request import PlanRequest

        return PlanRequest
    if name == "OptimizerOptions":  # CompileOptions(optim=OptimizerOptions(lr=..., schedule="cosine", ...))
        from autosp.compiler.training.schedule import OptimizerOptions

        return OptimizerOptions
    if name == "CompileOptions":  # autosp.compile(model, plan, options=CompileOptions(dtype="bf16", ...))
        from autosp.compiler.options import CompileOptions

        return CompileOptions
    if name == "Candidate":  # autosp.compile(model, plan=Candidate(sp=2, zero_stage=3)): a hand-made plan
        from autosp.contract.specs import Candidate

        return Candidate
    raise AttributeError(f"module 'autosp' has no attribute {name!r}")


def load_plan(path):
    """Read and validate a plan JSON file."""
    from autosp.contract.plan import load_plan as _load_plan

    return _load_plan(path)


def compile(model, plan=None, *, sp_size=None, options=None, **old_keywords):  # noqa: A001 - mirrors torch.compile
    """Compile ``model`` for sequence-parallel training; returns an engine (call, backward, step).

    ``plan``: what runs, a plan file, a Plan or a :class:`Candidate` (every knob is one of its fields); or
    ``sp_size=N`` alone for ``Candidate(sp=N, dp=processes / N)``. ``options``: how it runs, a
    :class:`CompileOptions` (optimizer, :class:`OptimizerOptions`, dtype, backend, ds_config, ...). The knobs and
    options this function once took as keywords are refused in one line that names the call to write."""
    if old_keywords:
        from autosp.compiler.options import old_keywords_message

        raise UsageError(old_keywords_message(old_keywords, plan, sp_size))
    from autosp.compiler.api import compile_model

    return compile_model(model, plan, sp_size=sp_size, options=options)
