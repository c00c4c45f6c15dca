"""The planner with sequence-chunked layers: ``sequence_chunks`` and ``offload_chunks`` searched, their validity
and canonical rules, the longest context growing with them, and the report / DeepSpeed config carrying them."""

from dataclasses import replace

import pytest

from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.cost_models.catalog.models import resolve_model
from autosp.contract.specs import Candidate, Workload
from autosp.planner.api import plan_for
from autosp.planner.request import PlanRequest
from autosp.planner.ds_config import deepspeed_config
from autosp.planner.search.evaluator import Evaluator
from autosp.planner.cli.report import render
from autosp.planner.search.space import (MIN_SEQUENCE_CHUNK_TOKENS, SEQUENCE_CHUNKS, build_space, canonical, invalid_reason,
                                  make_candidate)

LLAMA = resolve_model("llama-3.1-8b")
H100X8 = resolve_hardware("h100x8")
H100 = resolve_hardware("h100")


def test_both_knobs_are_searched_at_long_contexts_and_only_there():
    long = build_space(LLAMA, H100X8, Workload(seq_len=8 * 64 * MIN_SEQUENCE_CHUNK_TOKENS))
    assert long.sequence_chunks == SEQUENCE_CHUNKS and long.offload_chunks == (False, True)
    assert "sequence_chunks" in long.KNOBS and "offload_chunks" in long.KNOBS
    short = build_space(LLAMA, H100X8, Workload(seq_len=16_384))   # even sp = 1 holds too few for 4 chunks of 8k
    assert short.sequence_chunks == (1,) and short.offload_chunks == (False,)
    # per layout: 32k tokens over sp = 8 leave 4k per rank, too few for chunks; sp = 1 may cut its 32k in 4
    per = build_space(LLAMA, H100X8, Workload(seq_len=32_768))
    assert per.per_layout_choices(8, 1)["sequence_chunks"] == (1,)
    assert per.per_layout_choices(1, 1)["sequence_chunks"] == (1, 4)
    # every chunk count leaves chunks of at least MIN_SEQUENCE_CHUNK_TOKENS of the tokens a rank holds
    mid = build_space(LLAMA, H100X8, Workload(seq_len=8 * 4 * MIN_SEQUENCE_CHUNK_TOKENS))
    assert mid.per_layout_choices(8, 1)["sequence_chunks"] == (1, 4)


def test_the_enumeration_is_canonical():
    space = build_space(LLAMA, H100X8, Workload(seq_len=8 * 64 * MIN_SEQUENCE_CHUNK_TOKENS))
    space = replace(space, sp=(8,), zero_stage=(3,), micro_batch=(1,), mlp_chunks=(1, 4), loss_chunks=(1, 16))
    cands = list(space.candidates())
    assert len(cands) == len(set(cands)) == space.size()
    assert {c.sequence_chunks for c in cands} == set(SEQUENCE_CHUNKS)
    assert any(c.offload_chunks for c in cands)
    assert not any(c.offload_chunks and c.sequence_chunks == 1 for c in cands)
    assert all(c.checkpointing in ("none", "full") and c.overlap != "head_pipeline"
               for c in cands if c.sequence_chunks > 1)
    assert any(c.checkpointing == "full" and c.offload_activations and c.offload_chunks for c in cands)
    assert all(canonical(c) == c for c in cands)


def test_invalid_combinations_are_refused_with_one_line():
    wl = Workload(seq_len=1_048_576)
    with pytest.raises(ValueError, match="offload_chunks moves the chunks of sequence-chunked layers"):
        Candidate(sp=8, offload_chunks=True)
    policy = Candidate(sp=8, zero_stage=3, checkpointing="sequence", sequence_chunks=4, offload_chunks=True)
    assert "use checkpointing 'none' or 'full'" in invalid_reason(LLAMA, H100X8, wl, policy)
    assert invalid_reason(LLAMA, H100X8, wl, replace(policy, checkpointing="full", offload_activations=True)) is None
    heads = Candidate(sp=8, zero_stage=3, sequence_chunks=4, overlap="head_pipeline")
    assert "one attention per layer" in invalid_reason(LLAMA, H100X8, wl, heads)
    tiny = Candidate(sp=8, zero_stage=3, sequence_chunks=64)   # 131k tokens per rank / 64 = 2k < 8k
    reason = invalid_reason(LLAMA, H100X8, wl, tiny)
    assert "sequence_chunks=64" in reason and "\n" not in reason
    # make_candidate turns a meaningless offload_chunks off instead of raising; with chunks selective and
    # sequence mean none (the chunked layer is kept whole), full stays
    c = make_candidate(8, None, sp=8, zero_stage=3, micro_batch=1, checkpointing="full", mlp_chunks=1,
                       loss_chunks=1, offload_activations=True, overlap="none", sequence_chunks=1, offload_chunks=True)
    assert (c.offload_chunks, c.offload_activations) == (False, True)
    c = make_candidate(8, None, sp=8, zero_stage=3, micro_batch=1, checkpointing="sequence", mlp_chunks=1,
                       loss_chunks=1, offload_activations=True, overlap="none", sequence_chunks=4, offload_chunks=True)
    assert (c.offload_chunks, c.offload_activations, c.checkpointing) == (True, False, "none")
    c = make_candidate(8, None, sp=8, zero_stage=3, micro_batch=1, checkpointing="full", mlp_chunks=1,
                       loss_chunks=1, offload_activations=True, overlap="none", sequence_chunks=4, offload_chunks=True)
    assert (c.offload_chunks, c.offload_activations, c.checkpointing) == (True, True, "full")


def test_max_ctx_grows_with_the_chunk_knobs(max_ctx_plan):
    """One H100: the chosen plan's longest context against the same plan without chunks (the ALST recipe's
    full checkpointing with activation offload, its MLP tiling) and with chunks but without their offload."""
    space = build_space(LLAMA, H100, Workload(seq_len=100_000))
    evaluator = Evaluator(space)
    best = max_ctx_plan.candidate
    on_device = evaluator.max_context(replace(best, offload_chunks=False))
    plain = evaluator.max_context(replace(best, sequence_chunks=1, offload_chunks=False, checkpointing="full",
                                          offload_activations=True, mlp_chunks=16))
    assert evaluator.max_context(best) == max_ctx_plan.workload.seq_len
    assert on_device < max_ctx_plan.workload.seq_len and plain < max_ctx_plan.workload.seq_len
    assert max_ctx_plan.workload.seq_len > 2 * plain


@pytest.fixture(scope="module")
def max_ctx_plan():
    return plan_for(PlanRequest(model="llama-3.1-8b", hw="h100", objective="max-ctx"), cache=False)


def test_max_ctx_plan_uses_chunks_and_reports_them(max_ctx_plan):
    plan = max_ctx_plan
    c = plan.candidate
    assert c.sequence_chunks > 1
    assert plan.workload.seq_len > 604_160            # the longest context before sequence chunks existed
    text = render(plan)
    assert f"{c.sequence_chunks} per layer" in text and "sequence chunks" in text
    assert "host memory" in text and plan.estimate.host_bytes > 0
    section = deepspeed_config(plan)["autosp"]
    assert section["sequence_chunks"] == c.sequence_chunks and section["offload_chunks"] == c.offload_chunks
    # the node's host memory bounds the plan (80% usable)
    assert plan.estimate.host_bytes <= 0.8 * plan.hardware.host_memory_bytes
