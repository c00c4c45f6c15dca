"""``autosp-plan sweep``: many planning requests in one call, one row each.

The requests are the product models x clusters x contexts (or models x clusters with ``max-ctx``), each a
:class:`~autosp.planner.request.PlanRequest` answered by :func:`~autosp.planner.api.plan_for`, so a sweep's
row is exactly the plan ``autosp-plan`` prints for that request (the plan cache answers repeats). Sweeps use
the quick search by default (``search="fast"``, :mod:`autosp.planner.search.fast`). Every model and cluster is
resolved before the first plan, so a typo fails in a second; a request that does not fit is a row (status
``no fit``), and so is one whose pins cannot hold on that cluster (status ``invalid``).
"""

from __future__ import annotations

import time
from dataclasses import replace

from autosp.errors import InfeasibleError, UsageError
from autosp.planner.request import PlanRequest

COLUMNS = ("model", "hardware", "gpus", "accelerator", "objective", "ctx_asked", "status", "ctx", "tokens_per_second",
           "tokens_per_second_per_gpu", "mfu", "step_time_s", "memory_gib", "capacity_gib", "plan", "search",
           "evaluations", "cache", "wall_s", "message")
"""The fields of a row (the CSV header, the JSON keys)."""


def split_list(values, flag: str) -> list[str]:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]`` (a flag given several times, or comma-separated); no empties."""
    out = []
    for value in values or ():
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                raise UsageError(f"{flag} has an empty item in {value!r}; separate values with commas")
            if part not in out:
                out.append(part)
    return out


def requests(base: PlanRequest, models, hardware, contexts) -> list[PlanRequest]:
    """The sweep's requests: ``base`` with every (model, hardware, context) combination (``contexts`` may be
    ``[None]`` for max-ctx without a floor)."""
    return [replace(base, model=m, hw=h, ctx=c) for m in models for h in hardware for c in contexts]


def check_inputs(models, hardware, nodes=None) -> None:
    """Resolve each model and cluster once, before any search (a bad one is a UsageError now)."""
    from autosp.planner.profiles import resolve_model_and_profile
    from autosp.planner.request import resolve_hardware

    for m in models:
        resolve_model_and_profile(m)
    for h in hardware:
        resolve_hardware(h, nodes)


def _row(request: PlanRequest, plan=None, status: str = "ok", message: str = "", wall: float = 0.0) -> dict:
    from autosp.planner.request import resolve_hardware

    values = dict.fromkeys(COLUMNS)
    hw = plan.hardware if plan is not None else resolve_hardware(request.hw, request.nodes)
    values.update(model=request.model_label(), hardware=request.hardware_label(), gpus=hw.world_size,
                  accelerator=hw.accelerator.name, objective=request.objective, ctx_asked=request.ctx, status=status,
                  message=message, wall_s=round(wall, 4))
    if plan is not None:
        e, c = plan.estimate, plan.candidate
        values.update(ctx=plan.workload.seq_len, tokens_per_second=round(e.tokens_per_second, 1),
                      tokens_per_second_per_gpu=round(e.tokens_per_second / max(1, c.sp * c.dp), 1),
                      mfu=round(e.mfu, 4), step_time_s=round(e.time.step, 4),
                      memory_gib=round(e.memory.total / 2**30, 2), capacity_gib=round(e.capacity_bytes / 2**30, 2),
                      plan=c.short(), search=plan.search.get("strategy"),
                      evaluations=plan.search.get("evaluations"), cache=plan.search.get("cache"))
    return values


def plan_one(request: PlanRequest, cache) -> dict:
    """One request's row (a plan, or why there is none)."""
    from autosp.planner.api import plan_for

    started = time.perf_counter()
    try:
        plan = plan_for(request, cache=cache, diagnose=False)
    except InfeasibleError as err:
        return _row(request, status="no fit", message=str(err), wall=time.perf_counter() - started)
    except UsageError as err:  # e.g. a pin that cannot hold on this cluster
        return _row(request, status="invalid", message=str(err), wall=time.perf_counter() - started)
    return _row(request, plan, wall=time.perf_counter() - started)


def run(reqs: list[PlanRequest], cache=None, jobs: int = 1) -> list[dict]:
    """The rows of ``reqs``, in their order; a progress bar on a terminal. ``jobs`` > 1 plans in that many
    forked processes (each with its own connection to the plan cache)."""
    from autosp.planner.search.evaluator import progress_bar

    bar = progress_bar(len(reqs), "sweep")
    rows: list = [None] * len(reqs)
    jobs = min(jobs, len(reqs))
    try:
        if jobs <= 1:
            for i, r in enumerate(reqs):
                rows[i] = plan_one(r, cache)
                bar.update()
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            import autosp.planner.api  # noqa: F401  imported once here: the forked workers inherit it
            import autosp.planner.search.fast_bulk  # noqa: F401

            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
                futures = {pool.submit(plan_one, r, cache): i for i, r in enumerate(reqs)}
                for future in as_completed(futures):
                    rows[futures[future]] = future.result()
                    bar.update()
    finally:
        bar.close()
    return rows


__all__ = ["COLUMNS", "check_inputs", "plan_one", "requests", "run", "split_list"]
