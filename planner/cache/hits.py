"""A cache hit is a plan only if it still answers the request: :func:`cached_plan` re-parses the stored plan
and checks its model, hardware, objective, workload and search-space version against the request; a row
that fails is a miss, deleted, with one warning."""

from __future__ import annotations

import json
import time
from dataclasses import replace

from autosp.errors import UsageError
from autosp.planner.cache.schema import warn_once
from autosp.contract.plan import Plan, plan_from_dict


def _mismatch(plan: Plan, request: dict) -> str | None:
    """Why a cached plan does not answer ``request`` (a hand-edited or damaged row), or None."""
    if plan.model.fingerprint() != request.get("model"):
        return "its model differs from the request's"
    if plan.hardware.fingerprint() != request.get("hardware"):
        return "its hardware differs from the request's"
    if plan.objective != request.get("objective"):
        return "its objective differs from the request's"
    wanted = request.get("workload") or {}
    w = plan.workload
    if (w.dtype, w.global_batch, w.optimizer) != (wanted.get("dtype"), wanted.get("global_batch"),
                                                  wanted.get("optimizer")):
        return "its workload differs from the request's"
    if wanted.get("seq_len") is not None and (w.seq_len < wanted["seq_len"] if plan.objective == "max-ctx"
                                              else w.seq_len != wanted["seq_len"]):
        return "its context length differs from the request's"
    if plan.search.get("space_version") != request.get("space_version"):
        return "it comes from another search-space version"
    return None


def cached_plan(store, key: str, started: float, request: dict | None = None) -> Plan | None:
    """The cached plan for ``key``, checked to be a valid plan answering ``request``; anything else is a
    miss, deleted, with one warning."""
    text = store.get(key)
    if text is None:
        return None
    try:
        plan = plan_from_dict(json.loads(text))
        why = _mismatch(plan, request) if request is not None else None
    except (ValueError, UsageError) as err:
        why = f"its plan does not parse ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
    except Exception as err:  # noqa: BLE001 - a damaged row must never crash planning
        why = f"its plan does not parse ({type(err).__name__})"
    if why is not None:
        warn_once(f"plan cache {store.location}: ignored and deleted a cached plan because {why}; searching again")
        store.delete(key)  # a miss, and gone
        return None
    search = dict(plan.search, cache="hit", cache_location=store.location,
                  wall_time_s=round(time.perf_counter() - started, 4))
    return replace(plan, search=search)


__all__ = ["cached_plan"]
