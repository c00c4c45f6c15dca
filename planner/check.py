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

import glob
import os
import shlex
from dataclasses import asdict, replace

from autosp.errors import InfeasibleError, UsageError
from autosp.planner.artifacts import load_artifact
from autosp.planner.reprice import best_now, price, resolve_target, target_changes, version_changes
from autosp.planner.request import ResolvedRequest

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


def replan_command(t: ResolvedRequest, out_path: str) -> str:
    r = t.request
    parts = ["autosp-plan", "--model", r.model_label()]
    if r.objective == "max-ctx":
        parts += ["--objective", "max-ctx"]
    else:
        parts += ["--ctx", str(t.workload.seq_len)]
    parts += ["--hw", r.hardware_label()]
    if r.nodes:
        parts += ["--nodes", str(r.nodes)]
    if t.workload.global_batch is not None:
        parts += ["--global-batch", str(t.workload.global_batch)]
    if t.workload.dtype != "bf16":
        parts += ["--dtype", t.workload.dtype]
    if t.workload.compile_backend != "inductor":
        parts += ["--compile-backend", t.workload.compile_backend]
    if not r.allow_cross_node_sp:
        parts.append("--no-cross-node-sp")
    parts += ["--plan-out", out_path]
    return shlex.join(parts)


def _now_dict(reason, est) -> dict:
    if est is None:
        return {"valid": False, "invalid_reason": reason, "fits": False}
    return {"valid": True, "invalid_reason": None, "fits": bool(est.fits), "memory_bytes": est.memory.total,
            "capacity_bytes": est.capacity_bytes, "step_time_s": est.time.step,
            "tokens_per_second": est.tokens_per_second, "mfu": est.mfu}


def check(path: str, *, tolerance="5%", ignore_versions: bool = False, best_out: str | None = None, cache=True,
          **target) -> dict:
    """Is the committed plan (or DeepSpeed config) at ``path`` still good? The verdict as a dict (what
    ``autosp-plan check --json`` prints; ``exit_code`` 0 pass, 3 infeasible, 4 stale).

    ``target``: fields of :class:`~autosp.planner.request.PlanRequest` to check against instead of what the
    plan was made for (:data:`autosp.planner.reprice.TARGET_FIELDS`: model, hw, nodes, ctx, global_batch,
    dtype, allow_cross_node_sp, and the search for the best plan now: search, trials, seed).
    ``tolerance``: how far behind the best plan found now still passes, a percentage (``"5%"`` or 5). ``ignore_versions``: a plan from another search space / cost
    model / autosp version passes if it is still within tolerance. ``best_out``: write the best plan found
    now there. ``cache``: the plan cache for that search (as :func:`autosp.planner.api.plan_for`).
    """
    from autosp.units import format_tokens

    tol = parse_tolerance(tolerance)
    art = load_artifact(path)
    t = resolve_target(art, target)
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

    drift = [] if changed_target else _drift(art.estimate, est)
    if drift:
        changes.append("prediction: " + ", ".join(drift))

    best, gap = None, None
    if status == PASS or status == STALE:
        status, best, gap = _against_now(t, cache, est, tol, status, reasons, notes)
        if changed_target:
            status = STALE
            reasons.append("made for another target: " + "; ".join(c.split(" (")[0] for c in changed_target))
        if vchanges or drift:
            what = "; ".join(vchanges + (["prediction: " + ", ".join(drift)] if drift else []))
            if ignore_versions:
                notes.append(f"ignored (--ignore-versions): {what}")
            else:
                status = STALE
                reasons.append(f"produced by another version: {what}")

    if best is not None and best_out:
        from autosp.contract.plan import save_plan

        save_plan(best, best_out)
    return _verdict(status, art, t, reason, est, best, gap, tol, now_versions, changes, reasons, notes, best_out)


def _drift(old, est) -> list:
    """The same knobs on the same target priced differently: the cost model changed under the plan."""
    drift = []
    if est is not None and old is not None:
        for label, a, b in (("step time", old.time.step, est.time.step),
                            ("tokens/s", old.tokens_per_second, est.tokens_per_second),
                            ("peak memory", old.memory.total, est.memory.total)):
            if a and abs(b / a - 1) > PREDICTION_DRIFT:
                drift.append(f"{label} {a:,.4g} -> {b:,.4g} ({100 * (b / a - 1):+.1f}%)")
    return drift


def _against_now(t, cache, est, tol: float, status: int, reasons: list, notes: list):
    """(status, the best plan a search finds now or None, how far the committed plan is behind it): STALE when
    beyond ``tol``. Appends to ``reasons`` and ``notes``."""
    gap = None
    try:
        best = best_now(t, cache)
    except InfeasibleError as err:  # the committed plan fits, so the search should too; say so if not
        notes.append(f"the search found nothing that fits ({err})")
        best = None
    if best is not None:
        if t.request.objective == "max-ctx":
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
    return status, best, gap


def _verdict(status, art, t, reason, est, best, gap, tol, now_versions, changes, reasons, notes, best_out) -> dict:
    """The verdict dict ``autosp-plan check --json`` prints."""
    cand = art.candidate
    return {
        "status": STATUS[status], "exit_code": status, "file": art.path, "kind": art.kind,
        "target": {"model": t.model.name, "model_fingerprint": t.model.fingerprint(), "hardware": t.hardware.name,
                   "hardware_fingerprint": t.hardware.fingerprint(), "workload": asdict(t.workload),
                   "objective": t.request.objective},
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
        "best_out": best_out if best is not None and best_out else None,
    }


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


def select(candidates, *, tolerance=None, plan_out: str | None = None, ds_config: str | None = None, cache=True,
           **target) -> dict:
    """Re-price every candidate plan (files, directories of ``*.json`` or glob patterns) on the target and
    pick the fastest that is valid and fits; the result as a dict (what ``autosp-plan select --json``
    prints; ``exit_code`` 0 selected, 3 none fits, 4 beyond ``tolerance`` of the best plan now).

    ``target``: as for :func:`check` (default: the first candidate's model, hardware and workload; the
    search for the best plan now, only with a ``tolerance``, is Optuna unless given). ``plan_out`` /
    ``ds_config``: write the selected plan, re-priced, and its DeepSpeed config.
    """
    from autosp.planner.search.evaluator import rank_key
    from autosp.planner.explain import lost_because

    files = _expand(list(candidates))
    arts = [load_artifact(f) for f in files]
    t = resolve_target(arts[0], target, search_from_plan=False)
    if t.request.objective == "max-ctx":  # candidates compete on tokens/s at the target context
        t = replace(t, request=replace(t.request, objective="throughput"))
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
    tol = parse_tolerance(tolerance) if tolerance is not None else None
    if chosen is None:
        status = INFEASIBLE
        reasons.append(f"none of the {len(arts)} candidates is valid and fits {t.model.name} at "
                       f"{t.workload.seq_len:,} tokens on {t.hardware.name}")
    else:
        for art, est, row in fitting:
            row["rank"] = fitting.index((art, est, row)) + 1
        if tol is not None:
            best = best_now(t, cache)
            gap = 1 - chosen[1].tokens_per_second / best.estimate.tokens_per_second
            if gap > tol:
                status = STALE
                reasons.append(f"the best plan now ({best.candidate.short()}) is {_pct(gap / (1 - gap))} faster than "
                               f"the selected {chosen[0].path}, beyond the {_pct(tol)} tolerance")
    written = []
    if chosen is not None and (plan_out or ds_config):
        from autosp.contract.plan import Plan, RunnerUp
        from autosp.planner.ds_config import write_outputs
        from autosp.planner.search.space import SPACE_VERSION
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
                            "allow_cross_node_sp": t.request.allow_cross_node_sp, "cache": "off",
                            **({"model_profile": f"graph {t.profile.fingerprint}"} if t.profile is not None else {})})
        written += write_outputs(plan, plan_out, ds_config)
    return {"status": "selected" if status == PASS else STATUS[status], "exit_code": status,
            "selected": None if chosen is None else {"file": chosen[0].path, "candidate": asdict(chosen[0].candidate),
                                                      "short": chosen[0].candidate.short(),
                                                      "tokens_per_second": chosen[1].tokens_per_second,
                                                      "memory_bytes": chosen[1].memory.total},
            "target": {"model": t.model.name, "hardware": t.hardware.name, "workload": asdict(t.workload)},
            "candidates": rows, "best": None if best is None else {
                "short": best.candidate.short(), "tokens_per_second": best.estimate.tokens_per_second},
            "gap": gap, "tolerance": tol, "reasons": reasons, "written": written}



__all__ = ["CHECK_EXIT_CODES", "SELECT_EXIT_CODES", "check", "parse_tolerance", "select"]
