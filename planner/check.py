"""``autosp-plan check`` and ``autosp-plan select``: plans in CI (docs/ci.md).

``check FILE``: is a committed plan (or the DeepSpeed config ``--ds-config`` wrote) still good for the
current model, hardware and autosp? It re-prices the plan's knobs with the current cost model on the
current model and hardware and answers, with one exit code:

- **0 pass**: valid, fits in memory, within ``--tolerance`` (default 5%) of the best plan a search
  finds now, produced by this search space and cost model for this model, hardware and workload;
- **3 infeasible**: the knobs are invalid here (e.g. sp no longer divides the GPUs or the heads) or
  the plan no longer fits in memory;
- **4 stale**: still feasible, but the best plan now is more than the tolerance better, or the plan
  came from another search space / cost model / autosp version (its recorded prediction no longer
  holds: ``--ignore-versions`` reports that without failing), or was made for another model, hardware
  or workload than the one checked. The report says what changed and prints the command to re-plan;
  ``--best-out`` writes the best plan found now;
- **2** bad input (unreadable file, unknown model...), **1** internal error.

``select --candidates FILES``: re-price every candidate plan (plan JSONs or DeepSpeed configs) on the
target (flags, else the first file's model, hardware and workload) and pick the fastest one that is
valid and fits; ``--plan-out``/``--ds-config`` write it re-priced. Exit 0 (selected), 3 (none
fits), 4 (with ``--tolerance``: the selected one is beyond it of the best plan a search finds now), 2.

Both print a report, or with ``--json`` one JSON object (``status``, ``exit_code``, ``reasons``,
``changes``, the figures) for CI. Neither imports torch (a ``--model`` that needs tracing aside).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass, field, fields, replace

from autosp.cost_models.specs import Candidate, Workload
from autosp.errors import AutospError, InfeasibleError, UsageError

PASS, INFEASIBLE, STALE = 0, 3, 4
CHECK_EXIT_CODES = {
    0: "pass: valid, fits, within the tolerance of the best plan now, same space/cost model/target",
    1: "internal error (a bug: please report it)",
    2: "usage error: bad arguments or unreadable input",
    3: "infeasible: the plan's knobs are invalid here or it does not fit in memory",
    4: "stale: feasible, but beyond the tolerance of the best plan now, or made by another search space / "
       "cost model / autosp version, or for another model / hardware / workload",
}
SELECT_EXIT_CODES = {
    0: "selected a valid candidate that fits (within --tolerance of the best plan now, if given)",
    1: "internal error (a bug: please report it)",
    2: "usage error: bad arguments or unreadable input",
    3: "no candidate is valid and fits",
    4: "with --tolerance: the selected candidate is beyond it of the best plan found now",
}
STATUS = {PASS: "pass", INFEASIBLE: "infeasible", STALE: "stale"}
PREDICTION_DRIFT = 0.005
"""A re-priced plan whose step time, throughput or peak memory moved by more than this fraction no
longer has the prediction it records."""


# -- reading what was committed -------------------------------------------------------------------

@dataclass
class Artifact:
    path: str
    kind: str  # "plan" | "deepspeed-config"
    candidate: Candidate
    workload: Workload
    objective: str
    model_name: str
    model_fingerprint: str | None
    hardware_name: str
    hardware_fingerprint: str | None
    versions: dict
    model: object = None      # ModelSpec (plans only)
    hardware: object = None   # HardwareSpec (plans only)
    estimate: object = None   # Estimate (plans only)
    search: dict = field(default_factory=dict)


def _read_json(path: str) -> dict:
    from autosp.planner.plan import read_json

    data = read_json(path)
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a JSON object")
    return data


def load_artifact(path: str) -> Artifact:
    data = _read_json(path)
    if "schema_version" in data and "candidate" in data:
        from autosp.planner.plan import plan_from_dict

        try:
            plan = plan_from_dict(data)
        except UsageError as err:
            raise UsageError(f"{path}: {err}") from None
        s = plan.search
        return Artifact(path=path, kind="plan", candidate=plan.candidate, workload=plan.workload,
                        objective=plan.objective, model_name=plan.model.name,
                        model_fingerprint=plan.model.fingerprint(), hardware_name=plan.hardware.name,
                        hardware_fingerprint=plan.hardware.fingerprint(),
                        versions={"autosp": plan.autosp_version, "space": s.get("space_version"),
                                  "cost_model": s.get("cost_model_version")},
                        model=plan.model, hardware=plan.hardware, estimate=plan.estimate, search=dict(s))
    if isinstance(data.get("autosp"), dict) and "train_micro_batch_size_per_gpu" in data:
        return _ds_artifact(path, data)
    raise UsageError(f"{path} is neither an autosp plan (autosp-plan --plan-out) nor a DeepSpeed config written "
                     "by autosp-plan --ds-config (it has no 'autosp' section)")


def _ds_artifact(path: str, data: dict) -> Artifact:
    a = data["autosp"]
    zero = data.get("zero_optimization") or {}
    try:
        offload = a.get("offload_optimizer",
                        (zero.get("offload_optimizer") or {}).get("device", "none") not in ("none", None))
        cand = Candidate(sp=int(a["sp"]), dp=int(a["dp"]), zero_stage=int(zero.get("stage", 0)),
                         micro_batch=int(data["train_micro_batch_size_per_gpu"]),
                         grad_accum=int(data.get("gradient_accumulation_steps", 1)),
                         checkpointing=a["checkpointing"], mlp_chunks=int(a["mlp_chunks"]),
                         loss_chunks=int(a["loss_chunks"]), offload_activations=bool(a["offload_activations"]),
                         overlap=a["overlap"], offload_optimizer=bool(offload))
        dtype = a.get("dtype") or ("bf16" if (data.get("bf16") or {}).get("enabled") else "fp32")
        if "global_batch" in a:
            global_batch = a["global_batch"]
        else:  # configs written before it was recorded: a fixed batch only when it accumulates
            global_batch = a["sequences_per_step"] if cand.grad_accum > 1 else None
        workload = Workload(seq_len=int(a["seq_len"]), global_batch=global_batch, dtype=dtype)
    except KeyError as missing:
        raise UsageError(f"{path}: the DeepSpeed config's autosp section lacks {missing}") from None
    except (TypeError, ValueError) as bad:
        raise UsageError(f"{path}: invalid autosp section: {bad}") from None
    world = cand.sp * cand.dp
    if data.get("train_batch_size") not in (None, cand.micro_batch * cand.grad_accum * world):
        raise UsageError(f"{path}: train_batch_size {data['train_batch_size']} is not micro-batch x grad accum x "
                         f"dp x sp = {cand.micro_batch * cand.grad_accum * world}; the config was edited by hand")
    return Artifact(path=path, kind="deepspeed-config", candidate=cand, workload=workload,
                    objective=a.get("objective", "throughput"), model_name=a.get("model", "?"),
                    model_fingerprint=a.get("model_fingerprint"), hardware_name=a.get("hardware", "?"),
                    hardware_fingerprint=a.get("hardware_fingerprint"),
                    versions={"autosp": a.get("autosp_version"), "space": a.get("space_version"),
                              "cost_model": a.get("cost_model_version")},
                    search={"allow_cross_node_sp": a.get("allow_cross_node_sp")})


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
    from autosp.planner.units import parse_count, parse_ctx

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
        from autosp.planner.models import resolve_model

        try:
            model = resolve_model(art.model_name)
        except UsageError:
            raise UsageError(f"{art.path}: model {art.model_name!r} is not a preset; give --model") from None
        profile, model_arg, model_shown = None, art.model_name, art.model_name
    if args.hw:
        hardware, hw_shown = _resolve_hardware(args.hw, args.nodes), args.hw
    elif art.hardware is not None:
        hardware = _resolve_hardware(art.hardware, args.nodes)  # checked: a hand-edited plan may hold zeros
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


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def parse_tolerance(text) -> float:
    raw = str(text).strip()
    try:
        value = float(raw[:-1] if raw.endswith("%") else raw)
    except ValueError:
        raise UsageError(f"--tolerance must be a percentage such as 5% (or 5), got {text!r}") from None
    if not 0 <= value < 100:
        raise UsageError(f"--tolerance must be between 0% and 100%, got {text!r}")
    return value / 100


def replan_command(t: Target, out_path: str) -> str:
    parts = ["autosp-plan", "--model", str(t.model_shown if isinstance(t.model_arg, str) else t.model.name)]
    if t.objective == "max-ctx":
        parts += ["--objective", "max-ctx"]
    else:
        parts += ["--ctx", str(t.workload.seq_len)]
    parts += ["--hw", t.hw_shown]
    if t.nodes_arg:
        parts += ["--nodes", str(t.nodes_arg)]
    if t.workload.global_batch is not None:
        parts += ["--global-batch", str(t.workload.global_batch)]
    if t.workload.dtype != "bf16":
        parts += ["--dtype", t.workload.dtype]
    if t.allow_cross_node_sp:
        parts.append("--allow-cross-node-sp")
    parts += ["--plan-out", out_path]
    return shlex.join(parts)


def _now_dict(reason, est) -> dict:
    if est is None:
        return {"valid": False, "invalid_reason": reason, "fits": False}
    return {"valid": True, "invalid_reason": None, "fits": bool(est.fits), "memory_bytes": est.memory.total,
            "capacity_bytes": est.capacity_bytes, "step_time_s": est.time.step,
            "tokens_per_second": est.tokens_per_second, "mfu": est.mfu}


def run_check(args) -> dict:
    from autosp.planner.units import format_tokens

    tol = parse_tolerance(args.tolerance)
    art = load_artifact(args.file)
    t = resolve_target(art, args)
    cand = art.candidate
    reasons, changes, notes = [], [], []
    status = PASS

    changed_target = target_changes(art, t)
    changes += changed_target
    vchanges, now_versions = version_changes(art)
    changes += vchanges

    reason, est = price(t, cand)
    where = f"{t.model.name} at {format_tokens(t.workload.seq_len)} tokens on {t.hardware.name}"
    if reason:
        status = INFEASIBLE
        reasons.append(f"invalid on {where}: {reason}")
    elif not est.fits:
        status = INFEASIBLE
        from autosp.planner.shortfall import memory_shortfall

        reasons.append(f"does not fit on {where}: {memory_shortfall(est)}")

    drift = []  # the same knobs on the same target priced differently: the cost model changed under the plan
    if est is not None and art.estimate is not None and not changed_target:
        old = art.estimate
        for label, a, b in (("step time", old.time.step, est.time.step),
                            ("tokens/s", old.tokens_per_second, est.tokens_per_second),
                            ("peak memory", old.memory.total, est.memory.total)):
            if a and abs(b / a - 1) > PREDICTION_DRIFT:
                drift.append(f"{label} {a:,.4g} -> {b:,.4g} ({100 * (b / a - 1):+.1f}%)")
        if drift:
            changes.append("prediction: " + ", ".join(drift))

    best, gap = None, None
    if status == PASS or status == STALE:
        try:
            best = best_now(t, args, art)
        except InfeasibleError as err:  # the committed plan fits, so the search should too; say so if not
            notes.append(f"the search found nothing that fits ({err})")
        if best is not None:
            if t.objective == "max-ctx":
                gap = 1 - t.workload.seq_len / best.workload.seq_len if best.workload.seq_len else 0.0
                better = f"the longest context now is {best.workload.seq_len:,} tokens ({best.candidate.short()})"
            else:
                gap = 1 - est.tokens_per_second / best.estimate.tokens_per_second
                better = (f"the best plan now ({best.candidate.short()}) is {_pct(gap / (1 - gap) if gap < 1 else 1)} "
                          f"faster: {best.estimate.tokens_per_second:,.0f} vs {est.tokens_per_second:,.0f} tokens/s")
            if gap > tol:
                status = STALE
                reasons.append(f"{better}, beyond the {_pct(tol)} tolerance")
            elif gap < 0:
                notes.append(f"the committed plan beats the best the search found now by {_pct(-gap)}")
        if changed_target:
            status = STALE
            reasons.append("made for another target: " + "; ".join(c.split(" (")[0] for c in changed_target))
        if vchanges or drift:
            what = "; ".join(vchanges + (["prediction: " + ", ".join(drift)] if drift else []))
            if args.ignore_versions:
                notes.append(f"ignored (--ignore-versions): {what}")
            else:
                status = STALE
                reasons.append(f"produced by another version: {what}")

    if best is not None and args.best_out:
        from autosp.planner.plan import save_plan

        save_plan(best, args.best_out)
    result = {
        "status": STATUS[status], "exit_code": status, "file": art.path, "kind": art.kind,
        "target": {"model": t.model.name, "model_fingerprint": t.model.fingerprint(), "hardware": t.hardware.name,
                   "hardware_fingerprint": t.hardware.fingerprint(), "workload": asdict(t.workload),
                   "objective": t.objective},
        "candidate": asdict(cand), "short": cand.short(),
        "now": _now_dict(reason, est),
        "committed": None if art.estimate is None else {
            "memory_bytes": art.estimate.memory.total, "step_time_s": art.estimate.time.step,
            "tokens_per_second": art.estimate.tokens_per_second},
        "best": None if best is None else {
            "candidate": asdict(best.candidate), "short": best.candidate.short(),
            "tokens_per_second": best.estimate.tokens_per_second, "seq_len": best.workload.seq_len,
            "search": {k: best.search.get(k) for k in ("strategy", "trials", "seed", "cache", "space_version")}},
        "gap": gap, "tolerance": tol,
        "versions": {"committed": art.versions, "now": {k: now_versions[k] for k in ("autosp", "space", "cost_model")}},
        "changes": changes, "reasons": reasons, "notes": notes,
        "replan": replan_command(t, art.path if art.kind == "plan" else "plan.json"),
        "best_out": args.best_out if best is not None and args.best_out else None,
    }
    return result


def _gib_or_host(nbytes: float, fmt: str = ",.1f") -> str:
    """GiB, or what an infinite total means (offloads beyond host memory; the reasons say how much)."""
    from autosp.planner.units import GIB

    return f"{nbytes / GIB:{fmt}} GiB" if nbytes != float("inf") else "host memory short"


def _json_safe(value):
    """``--json`` output that strict parsers (jq) read: infinite or NaN figures become null."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def render_check(r: dict) -> str:
    from autosp.planner.units import GIB

    t = r["target"]
    lines = [f"autosp-plan check {r['file']}: {r['status'].upper()} (exit {r['exit_code']})",
             f"  {'plan':<10}{r['short']}  ({r['kind']})",
             f"  {'target':<10}{t['model']} at {t['workload']['seq_len']:,} tokens on {t['hardware']} "
             f"({t['workload']['dtype']}, objective {t['objective']})"]
    now = r["now"]
    if not now["valid"]:
        lines.append(f"  {'valid':<10}no: {now['invalid_reason']}")
    else:
        if now["memory_bytes"] == float("inf"):
            lines.append(f"  {'memory':<10}DOES NOT FIT: its offloads need more host memory than the node has (why: below)")
        else:
            lines.append(f"  {'memory':<10}{now['memory_bytes'] / GIB:,.1f} GiB of {now['capacity_bytes'] / GIB:,.1f} GiB "
                         f"usable per GPU: {'fits' if now['fits'] else 'DOES NOT FIT'}")
        speed = f"{now['tokens_per_second']:,.0f} tokens/s predicted now"
        if r["committed"]:
            speed += f" (committed: {r['committed']['tokens_per_second']:,.0f})"
        if r["best"] and t["objective"] == "max-ctx":
            speed += (f"; longest context found now {r['best']['seq_len']:,} tokens ({r['best']['short']}), "
                      f"committed {t['workload']['seq_len']:,}")
        elif r["best"]:
            speed += f"; best found now {r['best']['tokens_per_second']:,.0f} ({r['best']['short']})"
        lines.append(f"  {'speed':<10}{speed}")
        if r["gap"] is not None:
            lines.append(f"  {'gap':<10}{100 * r['gap']:.2f}% behind the best (tolerance {100 * r['tolerance']:.1f}%)")
    for label, items in (("changed", r["changes"]), ("why", r["reasons"]), ("note", r["notes"])):
        for i, item in enumerate(items):
            lines.append(f"  {label if i == 0 else '':<10}{item}")
    if r["exit_code"] != PASS:
        lines.append(f"  {'re-plan':<10}{r['replan']}")
    if r.get("best_out"):
        lines.append(f"  {'wrote':<10}{r['best_out']} (the best plan found now)")
    return "\n".join(lines) + "\n"


# -- select -----------------------------------------------------------------------------------------

def _expand(patterns: list[str]) -> list[str]:
    files = []
    for pattern in patterns:
        if os.path.isdir(pattern):
            found = sorted(glob.glob(os.path.join(pattern, "*.json")))
        elif glob.has_magic(pattern):
            found = sorted(glob.glob(pattern))
        else:
            found = [pattern]
        if not found:
            raise UsageError(f"--candidates {pattern}: no files match")
        files += [f for f in found if f not in files]
    return files


def run_select(args) -> dict:
    from autosp.planner.api import lost_because
    from autosp.planner.evaluator import rank_key

    files = _expand(args.candidates)
    arts = [load_artifact(f) for f in files]
    t = resolve_target(arts[0], args)
    if t.objective == "max-ctx":
        t = replace(t, objective="throughput")  # candidates compete on tokens/s at the target context
    rows, priced = [], []
    for art in arts:
        reason, est = price(t, art.candidate)
        other = target_changes(art, t)
        vchanges, _ = version_changes(art)
        row = {"file": art.path, "kind": art.kind, "candidate": asdict(art.candidate), "short": art.candidate.short(),
               **_now_dict(reason, est), "made_for_another_target": other, "version_changes": vchanges}
        rows.append(row)
        if est is not None:
            priced.append((art, est, row))
    fitting = sorted((p for p in priced if p[1].fits), key=lambda p: rank_key(p[0].candidate, p[1]))
    status, reasons, best, gap = PASS, [], None, None
    chosen = fitting[0] if fitting else None
    tol = parse_tolerance(args.tolerance) if args.tolerance is not None else None
    if chosen is None:
        status = INFEASIBLE
        reasons.append(f"none of the {len(arts)} candidates is valid and fits {t.model.name} at "
                       f"{t.workload.seq_len:,} tokens on {t.hardware.name}")
    else:
        for art, est, row in fitting:
            row["rank"] = fitting.index((art, est, row)) + 1
        if tol is not None:
            best = best_now(t, args, None)
            gap = 1 - chosen[1].tokens_per_second / best.estimate.tokens_per_second
            if gap > tol:
                status = STALE
                reasons.append(f"the best plan now ({best.candidate.short()}) is {_pct(gap / (1 - gap))} faster than "
                               f"the selected {chosen[0].path}, beyond the {_pct(tol)} tolerance")
    written = []
    if chosen is not None and (args.plan_out or args.ds_config):
        from autosp.planner.plan import Plan, RunnerUp, write_outputs
        from autosp.planner.space import SPACE_VERSION
        from autosp.planner.versions import code_version, cost_model_version

        art, est, _ = chosen
        runner_ups = tuple(RunnerUp(a.candidate, e, f"{a.path}: " + lost_because(a.candidate, e, art.candidate, est,
                                                                                  t.workload.seq_len))
                           for a, e, _ in fitting[1:4])
        plan = Plan(model=t.model, hardware=t.hardware, workload=t.workload, candidate=art.candidate, estimate=est,
                    objective="throughput", runner_ups=runner_ups,
                    search={"strategy": "select", "selected_from": art.path, "candidates": files,
                            "trials": None, "evaluations": len(priced), "space_size": len(arts),
                            "space_version": SPACE_VERSION, "cost_model_version": cost_model_version(),
                            "code_version": code_version(), "seed": None,
                            "allow_cross_node_sp": t.allow_cross_node_sp, "cache": "off",
                            **({"model_profile": f"graph {t.profile.fingerprint}"} if t.profile is not None else {})})
        written += write_outputs(plan, args.plan_out, args.ds_config)
    return {"status": "selected" if status == PASS else STATUS[status], "exit_code": status,
            "selected": None if chosen is None else {"file": chosen[0].path, "candidate": asdict(chosen[0].candidate),
                                                      "short": chosen[0].candidate.short(),
                                                      "tokens_per_second": chosen[1].tokens_per_second,
                                                      "memory_bytes": chosen[1].memory.total},
            "target": {"model": t.model.name, "hardware": t.hardware.name, "workload": asdict(t.workload)},
            "candidates": rows, "best": None if best is None else {
                "short": best.candidate.short(), "tokens_per_second": best.estimate.tokens_per_second},
            "gap": gap, "tolerance": tol, "reasons": reasons, "written": written}


def render_select(r: dict) -> str:
    from autosp.planner.units import GIB

    t = r["target"]
    width = max([len(row["short"]) for row in r["candidates"]] + [9]) + 2
    fw = min(36, max([len(row["file"]) for row in r["candidates"]] + [4]) + 2)
    lines = [f"autosp-plan select: {r['status'].upper()} (exit {r['exit_code']}) for {t['model']} at "
             f"{t['workload']['seq_len']:,} tokens on {t['hardware']}",
             f"  {'':2}{'file':<{fw}}{'candidate':<{width}}{'tokens/s':>10}{'memory':>11}  status"]
    chosen = (r["selected"] or {}).get("file")
    for row in r["candidates"]:
        if not row["valid"]:
            state, tps, mem = f"invalid: {row['invalid_reason']}", "-", "-"
        else:
            state = "fits" if row["fits"] else "does not fit"
            tps, mem = f"{row['tokens_per_second']:,.0f}", _gib_or_host(row["memory_bytes"], ".1f")
        if row["made_for_another_target"]:
            state += " (made for another target)"
        mark = "*" if row["file"] == chosen else " "
        lines.append(f"  {mark} {row['file'][-(fw - 2):]:<{fw}}{row['short']:<{width}}{tps:>10}{mem:>11}  {state}")
    if r["best"]:
        lines.append(f"  best found now: {r['best']['short']} {r['best']['tokens_per_second']:,.0f} tokens/s "
                     f"(selected is {100 * r['gap']:.2f}% behind, tolerance {100 * r['tolerance']:.1f}%)")
    for reason in r["reasons"]:
        lines.append(f"  why: {reason}")
    if r["written"]:
        lines.append(f"  wrote {', '.join(r['written'])}")
    return "\n".join(lines) + "\n"


# -- command line -----------------------------------------------------------------------------------

def _target_flags(p) -> None:
    g = p.add_argument_group("target (default: what the plan was made for)")
    g.add_argument("--model", metavar="M", help="preset, config.json or package.module:function to check against")
    g.add_argument("--hw", metavar="H", help="cluster to check against (catalog name or file)")
    g.add_argument("--nodes", metavar="K", help="number of nodes (overrides the hardware's)")
    g.add_argument("--ctx", metavar="C", help="context length to check at")
    g.add_argument("--global-batch", metavar="N", help="sequences per optimizer step ('none': one micro-batch per "
                                                       "replica)")
    g.add_argument("--dtype", choices=("bf16", "fp32"))
    g.add_argument("--allow-cross-node-sp", action="store_true")
    s = p.add_argument_group("the search for the best plan now")
    s.add_argument("--search", choices=("optuna", "exhaustive"), help="default: the plan's own, else optuna")
    s.add_argument("--trials", metavar="N", help="Optuna trials (default: the plan's)")
    s.add_argument("--seed", metavar="S", type=int, help="default: the plan's")
    c = s.add_mutually_exclusive_group()
    c.add_argument("--cache", metavar="PATH|URL", help="plan cache (default: as autosp-plan)")
    c.add_argument("--no-cache", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object (for CI) instead of the report")


def _codes(codes: dict) -> str:
    return "exit codes:\n" + "\n".join(f"  {c}  {m}" for c, m in sorted(codes.items()))


def build_check_parser():
    from autosp.planner.cli import _Parser

    p = _Parser(prog="autosp-plan check", formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Verify a committed plan (or the DeepSpeed config autosp-plan --ds-config wrote) "
                            "against the current model, hardware and autosp: still valid, still fits, within "
                            "--tolerance of the best plan found now, made by this search space and cost model?",
                epilog=_codes(CHECK_EXIT_CODES) + "\n\nexamples:\n  autosp-plan check plans/llama-200k.json\n"
                       "  autosp-plan check ds_config.json --tolerance 2% --json\n"
                       "  autosp-plan check plans/llama-200k.json --hw h200x8 --best-out new-plan.json\n")
    p.add_argument("file", metavar="PLAN_OR_DS_CONFIG")
    p.add_argument("--tolerance", default="5%", help="how far (tokens/s; context for max-ctx plans) behind the best "
                                                     "plan found now still passes (default 5%%)")
    p.add_argument("--ignore-versions", action="store_true",
                   help="a plan made by another search space / cost model / autosp version passes if it is still "
                        "feasible and within tolerance (the change is reported as a note)")
    p.add_argument("--best-out", metavar="PATH", help="write the best plan found now to PATH")
    _target_flags(p)
    p.format_help = _plain_help(p)
    return p


def build_select_parser():
    from autosp.planner.cli import _Parser

    p = _Parser(prog="autosp-plan select", formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Re-price candidate plans (plan JSONs or DeepSpeed configs from autosp-plan) on the "
                            "current model and hardware and pick the fastest one that is valid and fits.",
                epilog=_codes(SELECT_EXIT_CODES) + "\n\nexamples:\n"
                       "  autosp-plan select --candidates plans/*.json --plan-out plan.json --ds-config ds.json\n"
                       "  autosp-plan select --candidates plans/ --hw h100x16 --tolerance 5% --json\n")
    p.add_argument("--candidates", nargs="+", required=True, metavar="FILE",
                   help="plan/config files, directories (their *.json) or quoted glob patterns")
    p.add_argument("--tolerance", help="also search the best plan now and exit 4 if the selected one is more than "
                                       "this behind it (e.g. 5%%)")
    p.add_argument("--plan-out", metavar="PATH", help="write the selected plan, re-priced, to PATH")
    p.add_argument("--ds-config", metavar="PATH", help="write its DeepSpeed config to PATH")
    _target_flags(p)
    p.format_help = _plain_help(p)
    return p


def _plain_help(p):
    base = argparse.ArgumentParser.format_help

    return lambda: base(p)


def main(sub: str, argv: list[str]) -> int:
    if sub == "check":
        args = build_check_parser().parse_args(argv)
        if args.best_out is not None:
            from autosp.planner.cli import _check_output_path

            _check_output_path(args.best_out, "--best-out")
        result, render = run_check(args), render_check
    else:
        args = build_select_parser().parse_args(argv)
        from autosp.planner.cli import _check_output_path

        for path, flag in ((args.plan_out, "--plan-out"), (args.ds_config, "--ds-config")):
            if path is not None:
                _check_output_path(path, flag)
        result, render = run_select(args), render_select
    if args.json:
        sys.stdout.write(json.dumps(_json_safe(result), indent=2) + "\n")
    else:
        sys.stdout.write(render(result))
    return result["exit_code"]


__all__ = ["run_check", "run_select", "load_artifact", "CHECK_EXIT_CODES", "SELECT_EXIT_CODES", "AutospError"]
