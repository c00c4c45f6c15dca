"""Re-pricing a committed plan: the target it is checked against (the plan's own model, hardware and
workload, or what the user overrides), what changed since it was made, its knobs priced by the current
cost model, and the best plan a search finds now (:mod:`autosp.planner.check` turns these into a verdict)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from autosp.cost_models.specs import Candidate, Workload
from autosp.errors import UsageError
from autosp.planner.artifacts import Artifact


# -- the target: what the plan is checked against -------------------------------------------------

@dataclass
class Target:
    model: object
    profile: object
    hardware: object
    workload: Workload
    objective: str
    model_arg: object  # what make_plan gets for the model (a --model string, or the ModelSpec)
    model_shown: str
    hw_shown: str
    allow_cross_node_sp: bool
    nodes_arg: str | None = None


def resolve_target(art: Artifact, args) -> Target:
    from autosp.planner.api import _resolve_hardware
    from autosp.units import parse_count, parse_ctx

    if args.model:
        from autosp.planner.profiles import resolve_model_and_profile

        model, profile = resolve_model_and_profile(args.model)
        model_arg, model_shown = args.model, args.model
    elif art.model is not None:
        if str(art.search.get("model_profile", "")).startswith("graph"):
            raise UsageError(f"{art.path} was priced with the graph profile of its model; give --model (the "
                             "config.json or package.module:function it was planned from)")
        model, profile, model_arg, model_shown = art.model, None, art.model, art.model.name
    else:
        from autosp.cost_models.catalog.models import resolve_model

        try:
            model = resolve_model(art.model_name)
        except UsageError:
            raise UsageError(f"{art.path}: model {art.model_name!r} is not a preset; give --model") from None
        profile, model_arg, model_shown = None, art.model_name, art.model_name
    if args.hw:
        hardware, hw_shown = _resolve_hardware(args.hw, args.nodes), args.hw
    elif art.hardware is not None:
        hardware = art.hardware if args.nodes is None else _resolve_hardware(art.hardware, args.nodes)
        hw_shown = art.hardware.name
    else:
        try:
            hardware = _resolve_hardware(art.hardware_name, args.nodes)
        except UsageError:
            raise UsageError(f"{art.path}: hardware {art.hardware_name!r} is not in the catalog; give --hw") from None
        hw_shown = art.hardware_name
    workload = art.workload
    if args.ctx:
        workload = replace(workload, seq_len=parse_ctx(args.ctx))
    if args.global_batch:
        workload = replace(workload, global_batch=None if args.global_batch == "none"
                           else parse_count(args.global_batch, "--global-batch"))
    if args.dtype:
        workload = replace(workload, dtype=args.dtype)
    cross = bool(args.allow_cross_node_sp or art.search.get("allow_cross_node_sp"))
    return Target(model=model, profile=profile, hardware=hardware, workload=workload, objective=art.objective,
                  model_arg=model_arg, model_shown=model_shown, hw_shown=hw_shown, allow_cross_node_sp=cross,
                  nodes_arg=args.nodes)


def _field_changes(old, new, prefix="") -> list[str]:
    out = []
    for f in fields(old):
        a, b = getattr(old, f.name), getattr(new, f.name)
        if hasattr(a, "__dataclass_fields__") and hasattr(b, "__dataclass_fields__"):
            out += _field_changes(a, b, prefix=f"{prefix}{f.name}.")
        elif a != b and f.name != "source":
            def show(v):
                return f"{v:,.4g}" if isinstance(v, float) else str(v)

            out.append(f"{prefix}{f.name} {show(a)} -> {show(b)}")
    return out


def target_changes(art: Artifact, t: Target) -> list[str]:
    """How the target differs from what the plan was made for (empty: the same)."""
    out = []
    if art.model_fingerprint != t.model.fingerprint():
        detail = _field_changes(art.model, t.model) if art.model is not None else []
        out.append(f"model: {art.model_name} -> {t.model.name}"
                   + (f" ({', '.join(detail[:6])})" if detail else
                      f" (fingerprint {art.model_fingerprint} -> {t.model.fingerprint()})"))
    if art.hardware_fingerprint != t.hardware.fingerprint():
        detail = _field_changes(art.hardware, t.hardware) if art.hardware is not None else []
        out.append(f"hardware: {art.hardware_name} -> {t.hardware.name}"
                   + (f" ({', '.join(detail[:6])})" if detail else
                      f" (fingerprint {art.hardware_fingerprint} -> {t.hardware.fingerprint()})"))
    if art.workload != t.workload:
        out.append("workload: " + ", ".join(_field_changes(art.workload, t.workload)))
    return out


def version_changes(art: Artifact) -> tuple[list[str], dict]:
    from autosp.planner.versions import stamps

    now = stamps()
    out = []
    for key, label in (("space", "search space"), ("cost_model", "cost model"), ("autosp", "autosp")):
        old = art.versions.get(key)
        if old is None:
            out.append(f"{label}: unknown (the {art.kind} predates version stamps) -> {now[key]}")
        elif old != now[key]:
            out.append(f"{label}: {old} -> {now[key]}")
    return out, now


# -- pricing ----------------------------------------------------------------------------------------

def price(t: Target, cand: Candidate):
    """(invalid reason or None, Estimate or None) of ``cand`` on the target."""
    from autosp.planner.evaluator import Evaluator
    from autosp.planner.space import build_space

    space = build_space(t.model, t.hardware, t.workload, allow_cross_node_sp=t.allow_cross_node_sp,
                        profile=t.profile)
    if cand.sp * cand.dp != t.hardware.world_size:
        return (f"sp x dp = {cand.sp} x {cand.dp} = {cand.sp * cand.dp} GPUs, the hardware has "
                f"{t.hardware.world_size}"), None
    reason = space.reason(cand)
    if reason:
        return reason, None
    return None, Evaluator(space)(cand)


def best_now(t: Target, args, art: Artifact | None):
    """The plan a search finds now for the target (the plan cache answers repeated CI runs)."""
    from autosp.planner.api import make_plan

    search = args.search or (art.search.get("strategy") if art and art.search.get("strategy") in
                             ("optuna", "exhaustive") else "optuna")
    trials = args.trials or (art.search.get("trials") if art and search == "optuna" and art.search.get("trials")
                             else None)
    seed = args.seed if args.seed is not None else (art.search.get("seed", 0) if art else 0)
    ctx = None if t.objective == "max-ctx" else t.workload.seq_len
    return make_plan(t.model_arg, ctx, t.hardware, objective=t.objective, global_batch=t.workload.global_batch,
                     dtype=t.workload.dtype, search=search, trials=trials, seed=seed,
                     cache=None if args.no_cache else (args.cache or True),
                     allow_cross_node_sp=t.allow_cross_node_sp)


__all__ = ["Target", "best_now", "price", "resolve_target", "target_changes", "version_changes"]
