"""Re-pricing a committed plan: the target it is checked against (a
:class:`~autosp.planner.request.PlanRequest` made of the plan's own model, hardware and workload, or what the
user overrides), what changed since it was made, its knobs priced by the current cost model, and the best
plan a search finds now (:mod:`autosp.planner.check` turns these into a verdict)."""

from __future__ import annotations

import os
from dataclasses import fields, replace

from autosp.contract.specs import Candidate
from autosp.errors import UsageError
from autosp.planner.artifacts import Artifact
from autosp.planner.request import PlanRequest, ResolvedRequest, resolve, resolve_hardware


TARGET_FIELDS = ("model", "hw", "nodes", "ctx", "global_batch", "dtype", "allow_cross_node_sp", "search", "trials",
                 "seed")
"""The request fields a check or a selection may override (the rest comes from the committed plan)."""


def target_request(art: Artifact, overrides: dict | None = None, search_from_plan: bool = True) -> PlanRequest:
    """The request ``art`` is checked against: what it was made for (its model, hardware, workload, objective
    and, with ``search_from_plan``, its search settings), with ``overrides`` (fields of
    :class:`~autosp.planner.request.PlanRequest` named in :data:`TARGET_FIELDS`; ``global_batch=None``
    asks for one micro-batch per replica) in their place."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(TARGET_FIELDS))
    if unknown:
        raise UsageError(f"cannot override {', '.join(unknown)} of a committed plan (only {', '.join(TARGET_FIELDS)})")
    model = overrides.get("model")
    if model is None and art.model is not None:
        if str(art.search.get("model_profile", "")).startswith("graph"):
            model = _traced_model_arg(art)
        else:
            model = art.model
    elif model is None:
        from autosp.cost_models.catalog.models import resolve_model

        try:
            resolve_model(art.model_name)
        except UsageError:
            raise UsageError(f"{art.path}: model {art.model_name!r} is not a preset; give --model") from None
        model = art.model_name
    hw = overrides.get("hw") or art.hardware
    if hw is None:
        try:
            resolve_hardware(art.hardware_name)
        except UsageError:
            raise UsageError(f"{art.path}: hardware {art.hardware_name!r} is not in the catalog; give --hw") from None
        hw = art.hardware_name
    s = art.search if search_from_plan else {}
    asked = s.get("requested_search") or s.get("strategy")  # plans before requested_search record the strategy run
    search = overrides.get("search") or (asked if asked in ("optuna", "exhaustive", "fast") else "optuna")
    trials = overrides.get("trials") or (s.get("trials") if search == "optuna" and s.get("trials") else None)
    seed = overrides["seed"] if overrides.get("seed") is not None else s.get("seed") or 0
    return PlanRequest(model=model, hw=hw, nodes=overrides.get("nodes"),
                       ctx=overrides.get("ctx") or art.workload.seq_len, objective=art.objective,
                       global_batch=overrides["global_batch"] if "global_batch" in overrides
                       else art.workload.global_batch,
                       dtype=overrides.get("dtype") or art.workload.dtype,
                       allow_cross_node_sp=bool(overrides["allow_cross_node_sp"]
                                                if overrides.get("allow_cross_node_sp") is not None
                                                else art.search.get("allow_cross_node_sp")),
                       search=search, trials=trials, seed=seed,
                       fix=art.search.get("fixed") or (),  # a plan made with --fix is checked against the same pins
                       doc_lens=art.workload.doc_lens or None,
                       compile_backend=getattr(art.workload, "compile_backend", "inductor"))


GRAPH_SOURCE = "graph profile "
"""How the ModelSpec of a graph-profiled model names its origin: ``graph profile <fingerprint> of <config path or
package.module:function>`` (:mod:`autosp.planner.profiles`)."""


def _traced_model_arg(art: Artifact) -> str:
    """The config.json (or entry point) a graph-profiled plan was made from, as its ModelSpec records it; a
    UsageError asking for --model when the record is missing or the file is gone."""
    source = str(getattr(art.model, "source", "") or "")
    arg = source.split(" of ", 1)[1] if source.startswith(GRAPH_SOURCE) and " of " in source else ""
    if arg and (":" in arg and not arg.endswith(".json") or os.path.exists(arg)):
        return arg
    where = f" ({arg} no longer exists)" if arg else ""
    raise UsageError(f"{art.path} was priced with the graph profile of its model{where}; give --model (the "
                     "config.json or package.module:function it was planned from)")


def invalid_here(t: ResolvedRequest, cand: Candidate) -> str | None:
    """Why ``cand`` cannot run on the target ``t`` (its dp or sp against the GPUs, a rule of the search space),
    or None: the one validation of a plan file's knobs that ``check``, ``select`` and ``explain`` share."""
    from autosp.planner.search.space import build_space

    if cand.sp * cand.dp != t.hardware.world_size:
        return (f"sp x dp = {cand.sp} x {cand.dp} = {cand.sp * cand.dp} GPUs, the hardware has "
                f"{t.hardware.world_size}")
    space = build_space(t.model, t.hardware, t.workload, allow_cross_node_sp=t.request.allow_cross_node_sp,
                        profile=t.profile)
    return space.reason(cand)


def resolve_target(art: Artifact, overrides: dict | None = None, search_from_plan: bool = True) -> ResolvedRequest:
    """:func:`target_request`, resolved to the specs the cost model prices (a plan's own ModelSpec and
    HardwareSpec are used as they are)."""
    return resolve(target_request(art, overrides, search_from_plan))


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


def target_changes(art: Artifact, t: ResolvedRequest) -> list[str]:
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

def price(t: ResolvedRequest, cand: Candidate):
    """(invalid reason or None, Estimate or None) of ``cand`` on the target."""
    from autosp.planner.search.evaluator import Evaluator
    from autosp.planner.search.space import build_space

    reason = invalid_here(t, cand)
    if reason:
        return reason, None
    space = build_space(t.model, t.hardware, t.workload, allow_cross_node_sp=t.request.allow_cross_node_sp,
                        profile=t.profile)
    return None, Evaluator(space)(cand)


def best_now(t: ResolvedRequest, cache=True):
    """The plan a search finds now for the target's request (the plan cache answers repeated CI runs)."""
    from autosp.planner.api import plan_for

    request = t.request if t.request.objective != "max-ctx" else replace(t.request, ctx=None)
    return plan_for(request, cache=cache)


__all__ = ["GRAPH_SOURCE", "TARGET_FIELDS", "best_now", "invalid_here", "price", "resolve_target", "target_request",
           "target_changes", "version_changes"]
