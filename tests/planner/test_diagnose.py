"""Infeasible requests (planner/diagnose.py): the leanest plan a message names and the cluster size its hint gives."""

from __future__ import annotations

from autosp.cost_models.estimate import memory_only
from autosp.planner.api import plan_for
from autosp.planner.diagnose import _lean_corner, _leanest, _least_memory, more_gpus_hint
from autosp.planner.request import PlanRequest, resolve
from autosp.planner.search.space import build_space


def test_the_more_gpus_hint_names_the_smallest_cluster_that_fits():
    """Llama-3.1-70B at 1M tokens on one H100: two fit (the plan says so), and the hint says two. It said four while
    the leanest plan came from the memory-lean corner, which misses leaner points (ring SP with sequence chunks,
    their offload and every state offload together)."""
    r = resolve(PlanRequest(model="llama-3.1-70b", hw="h100", ctx="1M"))
    space = build_space(r.model, r.hardware, r.workload, profile=r.profile)
    assert more_gpus_hint(space, r.workload.seq_len, True) == "about 2 GPUs would fit (--nodes 2)"
    assert plan_for(PlanRequest(model="llama-3.1-70b", ctx="1M", hw="h100", nodes=2)).estimate.fits
    # the whole space's least memory, below the corner's
    corner = [c for c in _lean_corner(space) if not space.reason(c)]
    _, est = _leanest(space, r.workload.seq_len)
    cornered = _least_memory(space, r.workload, corner)
    assert est.memory.total < memory_only(space.model, space.hardware, r.workload, cornered, space.profile).total
    assert not est.fits
