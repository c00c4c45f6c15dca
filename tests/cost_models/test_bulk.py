"""The bulk cost model (cost_models/bulk.py) against the scalar one on every candidate of several spaces, and the
bulk exhaustive search (planner/search/bulk_search.py) against the scalar exhaustive search."""

from __future__ import annotations

import pytest

from autosp.cost_models.estimate import estimate
from autosp.planner.search.bulk_search import row_candidate, bulk_throughput, space_groups
from autosp.planner.search.evaluator import Evaluator
from autosp.planner.search.exhaustive import exhaustive_throughput
from autosp.planner.explain import explain_runner_ups
from autosp.planner.request import PlanRequest, resolve
from autosp.planner.search.space import build_space

REL = 1e-12

SPACES = [  # each feature of the cost model in at least one space
    dict(model="mistral-7b", ctx="8k", hw="h100x2"),                               # small, Ulysses, GQA
    dict(model="llama-3.2-1b", ctx="32k", hw="a100-80gx8", dtype="fp32"),          # fp32, tied embeddings
    dict(model="mistral-7b-v0.1", ctx="64k", hw="h100x2"),                         # sliding window
    dict(model="llama-3.1-8b", ctx="1M", hw="h100x1"),                             # chunks, parameter offload
    dict(model="llama-3.2-1b", ctx="128k", hw="h100x4", mean_doc_len="8k", global_batch=8),  # documents, grad accum
    dict(model="qwen2.5-0.5b", ctx="64k", hw="h100x16", global_batch=32),          # two nodes, cross-node SP, ring
    dict(model="qwen2.5-7b", ctx="500k", hw="h200x8", fix=["zero_stage=3", "micro_batch=1"]),  # rings, pins
    # mixtures of experts: the ep axis (expert states, dispatch all-to-alls, the busiest rank's margin)
    dict(model="qwen3-30b-a3b", ctx="32k", hw="h100x2", fix=["micro_batch=1", "overlap=none"]),
    dict(model="mixtral-8x7b", ctx="128k", hw="h100x16",  # two nodes: the expert-data-parallel group spans them
         fix=["zero_stage=3", "micro_batch=1", "checkpointing=full", "overlap=none", "offload_param=false"]),
    dict(model="gemma-2-9b", ctx="16k", hw="h100x2", fix=["micro_batch=1"]),      # soft-capping's kernel factors
    # gpt-oss: biased experts, the clamped SwiGLU's rebuilt tensors, sinks, alternating windows
    dict(model="gpt-oss-20b", ctx="32k", hw="h100x2", fix=["micro_batch=1", "overlap=none"]),
]


def _space(spec: dict):
    request = PlanRequest(**spec)
    r = resolve(request)
    return build_space(r.model, r.hardware, r.workload, profile=r.profile, fixed=request.fix)


@pytest.mark.parametrize("spec", SPACES, ids=lambda s: f"{s['model']}-{s['ctx']}-{s['hw']}")
def test_bulk_estimate_equals_the_scalar_estimate_on_every_candidate(spec):
    from autosp.cost_models import bulk

    space = _space(spec)
    seen = 0
    for base, rows in space_groups(space):
        out = bulk.estimate_group(space.model, space.hardware, space.workload, base, rows, space.profile)
        for i in range(len(out.step)):
            cand = row_candidate(space, base, rows, i)
            ref = estimate(space.model, space.hardware, space.workload, cand, space.profile)
            for got, want, what in ((out.step[i], ref.time.step, "step time"), (out.memory[i], ref.memory.total, "memory"),
                                    (out.tokens_per_second[i], ref.tokens_per_second, "tokens/s")):
                assert got == want or abs(got - want) <= REL * max(abs(got), abs(want)), (cand.short(), what, got, want)
            assert bool(out.fits[i]) == ref.fits, cand.short()
            seen += 1
    assert seen == space.size() > 0  # the bulk enumeration is the space's, candidate for candidate
    assert len(set(space.candidates())) == seen


@pytest.mark.parametrize("spec", SPACES, ids=lambda s: f"{s['model']}-{s['ctx']}-{s['hw']}")
def test_no_point_trains_faster_than_its_compute_ceiling_at_its_own_or_any_larger_micro_batch(spec):
    """bulk.Bulk.ceiling, which the quick search bounds cells by (planner/search/fast_bulk.py, Cells.cap): at least
    the row's tokens/s, and above the tokens/s of the same point at every larger micro-batch and any overlap
    schedule, where that point fits (a point that fits there fits here too)."""
    from autosp.cost_models import bulk

    space = _space(spec)
    by_point: dict = {}  # the knobs but micro-batch, grad_accum and overlap -> [(micro, tokens/s, ceiling, fits)]
    for base, rows in space_groups(space):
        out = bulk.estimate_group(space.model, space.hardware, space.workload, base, rows, space.profile)
        assert (out.ceiling >= out.tokens_per_second).all()
        for i in range(len(out.step)):
            cand = row_candidate(space, base, rows, i)
            key = tuple(sorted((k, v) for k, v in cand.__dict__.items()
                               if k not in ("micro_batch", "grad_accum", "overlap")))
            by_point.setdefault(key, []).append((cand.micro_batch, float(out.tokens_per_second[i]),
                                                 float(out.ceiling[i]), bool(out.fits[i])))
    compared = 0
    for points in by_point.values():
        for micro, tps, _, fits in points:
            if not fits:
                continue
            for smaller, _, ceiling, fits_there in points:
                if smaller <= micro:
                    assert fits_there
                    assert tps <= ceiling * (1 + REL), (micro, smaller, tps, ceiling)
                    compared += smaller < micro
    fitting_above_one = any(fits and micro > 1 for points in by_point.values() for micro, _, _, fits in points)
    assert compared > 0 or not fitting_above_one  # (at 1M tokens on one H100 nothing fits above micro-batch 1)


@pytest.mark.parametrize("spec", SPACES[:3] + SPACES[4:5], ids=lambda s: f"{s['model']}-{s['ctx']}-{s['hw']}")
def test_bulk_exhaustive_search_gives_the_scalar_exhaustive_plan_and_runner_ups(spec):
    space = _space(spec)
    scalar = exhaustive_throughput(space, Evaluator(space))
    fast_evaluator = Evaluator(space)
    fast = bulk_throughput(space, fast_evaluator)
    assert fast.evaluations == space.size()
    assert fast_evaluator.calls < space.size() / 10  # only what the plan shows goes back to the scalar model
    assert fast.best[0] == scalar.best[0]
    ups = [(u.candidate, u.lost_because) for u in explain_runner_ups(fast, fast_evaluator, "throughput", 3)]
    assert ups == [(u.candidate, u.lost_because) for u in explain_runner_ups(scalar, Evaluator(space), "throughput", 3)]


def test_the_default_search_scores_a_space_whole_in_bulk_unless_asked_for_trials():
    from autosp.planner.api import plan_for

    plan = plan_for(PlanRequest(model="llama-3.2-1b", ctx="32k", hw="a100-80gx8"))
    assert plan.search["strategy"] == "exhaustive" and "bulk" in plan.search["sampler"]
    assert plan.search["evaluations"] == plan.search["space_size"]
    sampled = plan_for(PlanRequest(model="llama-3.2-1b", ctx="32k", hw="a100-80gx8", trials=20))
    assert sampled.search["strategy"] == "optuna"
    assert sampled.estimate.tokens_per_second <= plan.estimate.tokens_per_second * (1 + 1e-12)
