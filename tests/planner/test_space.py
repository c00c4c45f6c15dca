import hashlib
import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from autosp.contract.specs import AcceleratorSpec, Candidate, HardwareSpec, ModelSpec, Workload
from autosp.planner.search import space as space_mod
from autosp.planner.search.space import (MIN_TILE_TOKENS, SPACE_VERSION, build_space, canonical, invalid_reason, layout_reason,
                                  local_tokens, padded_length, padding, ring_choices, sp_reason)

# Llama-3.1-8B's shape (32 query heads, 8 KV heads) and a small odd-headed model.
LLAMA = ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256)
ODD = ModelSpec("odd", 4, 768, 24, 6, 32, 2048, 32000)
TWELVE = ModelSpec("twelve", 2, 768, 12, 6, 64, 2048, 32000)
ACC = AcceleratorSpec("gpu", 1e15, 80 * 2**30, 3e12)


def cluster(per_node=8, nodes=1):
    return HardwareSpec("test", ACC, per_node, nodes, 4e11, 3e-6, 5e10, 1e-5)


def test_query_and_kv_head_rules():
    """The head rules bind the Ulysses degree (ring = 1: all of sp)."""
    hw = cluster(per_node=16)
    assert layout_reason(LLAMA, hw, 8) is None            # 8 KV heads sharded 1 per rank
    assert layout_reason(LLAMA, hw, 16) is None           # 16 % 8 == 0: each KV head replicated twice
    assert "query heads" in layout_reason(ODD, cluster(per_node=16), 16)
    hw12 = cluster(per_node=12)
    assert "KV heads" in layout_reason(ODD, hw12, 4)      # 6 % 4 and 4 % 6 both nonzero
    assert layout_reason(ODD, hw12, 6) is None and layout_reason(ODD, hw12, 12) is None
    assert layout_reason(ODD, hw12, 3) is None


def test_ring_takes_sp_past_the_head_rules():
    """U = sp / ring carries the head rules; the ring has none, so sp above the head count is a layout."""
    hw = cluster(per_node=16)
    # ODD: 24 heads, 6 KV heads. sp=16: U=16 breaks the query heads, U=8 and U=4 the KV heads; U=2 (ring 8)
    # and U=1 (pure ring) work
    assert ring_choices(ODD, hw, 16) == (8, 16)
    assert sp_reason(ODD, hw, 16) is None
    assert "ulysses=8 (sp=16 / ring=2)" in layout_reason(ODD, hw, 16, ring=2)
    assert "ring=3 does not divide sp=16" in layout_reason(ODD, hw, 16, ring=3)
    hw12 = cluster(per_node=12)
    assert ring_choices(ODD, hw12, 4) == (2, 4)          # U=4 breaks the KV heads, U=2 and U=1 do not
    # Llama-3.1-8B's 32 heads stop Ulysses at 32; on 128 GPUs a ring reaches sp=128, U from 4 (128/32) down
    big = cluster(per_node=8, nodes=16)
    assert ring_choices(LLAMA, big, 128) == (4, 8, 16, 32, 64, 128)
    assert "query heads" in layout_reason(LLAMA, big, 128, ring=1)
    assert 128 in build_space(LLAMA, big, Workload(1 << 20)).sp
    # a Ulysses group never straddles a node boundary part-way: 12 GPUs a node, U = 8 would
    assert "straddle" in layout_reason(LLAMA, cluster(per_node=12, nodes=2), 24, ring=3)


def test_sp_spans_nodes_by_default_unless_forbidden():
    hw = cluster(per_node=8, nodes=4)
    assert sp_reason(LLAMA, hw, 16) is None
    assert "--no-cross-node-sp" in sp_reason(LLAMA, hw, 16, allow_cross_node_sp=False)
    assert "does not divide the world" in sp_reason(LLAMA, hw, 3)
    assert build_space(LLAMA, hw, Workload(8192)).sp == (1, 2, 4, 8, 16, 32)
    forbidden = build_space(LLAMA, hw, Workload(8192), allow_cross_node_sp=False)
    assert forbidden.sp == (1, 2, 4, 8) and max(c.sp for c in forbidden.candidates()) == 8


def test_padding_is_valid_and_measured():
    assert padded_length(200_003, 8) == 200_008 and local_tokens(200_003, 8) == 25_001
    pad, frac = padding(200_003, 8)
    assert pad == 5 and frac == pytest.approx(5 / 200_008)
    hw = cluster()
    assert invalid_reason(LLAMA, hw, Workload(200_003), Candidate(sp=8)) is None


def test_candidate_rules_return_one_line_reasons():
    hw, wl = cluster(), Workload(64)
    assert "world size" in invalid_reason(LLAMA, hw, wl, Candidate(sp=4, dp=1))
    assert "mlp_chunks" in invalid_reason(LLAMA, hw, wl, Candidate(sp=8, mlp_chunks=2))   # 8 tokens per rank
    assert "loss_chunks" in invalid_reason(LLAMA, hw, wl, Candidate(sp=8, loss_chunks=2))
    long = Workload(8 * 16 * MIN_TILE_TOKENS)                  # 16 tiles of 1024 tokens per rank
    assert invalid_reason(LLAMA, hw, long, Candidate(sp=8, loss_chunks=16, mlp_chunks=16)) is None
    assert "smaller than 1024" in invalid_reason(LLAMA, hw, long, Candidate(sp=8, loss_chunks=32))
    assert "all-to-all" in invalid_reason(LLAMA, hw, wl, Candidate(sp=1, dp=8, overlap="kv_async"))
    odd_hw = cluster(per_node=12)
    assert "head_pipeline" in invalid_reason(TWELVE, odd_hw, Workload(4096), Candidate(sp=12, overlap="head_pipeline"))
    assert invalid_reason(ODD, odd_hw, Workload(4096), Candidate(sp=12, overlap="head_pipeline")) is None
    assert "needs --global-batch" in invalid_reason(LLAMA, hw, wl, Candidate(sp=8, grad_accum=2))
    gb = Workload(4096, global_batch=6)
    assert "does not divide by dp" in invalid_reason(LLAMA, hw, gb, Candidate(sp=2, dp=4, grad_accum=1))
    gb = Workload(4096, global_batch=8)
    assert invalid_reason(LLAMA, hw, gb, Candidate(sp=2, dp=4, micro_batch=1, grad_accum=2)) is None
    assert "not the global batch" in invalid_reason(LLAMA, hw, gb, Candidate(sp=2, dp=4, micro_batch=1, grad_accum=1))
    assert "micro_batch" in invalid_reason(LLAMA, hw, Workload(4096, global_batch=12),
                                           Candidate(sp=2, dp=4, micro_batch=2, grad_accum=1))
    for reason in (invalid_reason(LLAMA, hw, wl, Candidate(sp=8, mlp_chunks=16)),
                   sp_reason(LLAMA, cluster(8, 2), 16, allow_cross_node_sp=False)):
        assert "\n" not in reason


@pytest.mark.parametrize("model,hw,wl,cross", [
    (LLAMA, cluster(), Workload(40), False),                       # tiny sequence: no tiling at all
    (ODD, cluster(per_node=12), Workload(24_000, global_batch=24), False),
    (LLAMA, cluster(4, 2), Workload(16_384, global_batch=8), True),  # tile limits differ per sp
])
def test_enumeration_equals_filtering_the_full_product(model, hw, wl, cross):
    space = build_space(model, hw, wl, allow_cross_node_sp=cross)
    # fewer choices than the real space (the brute force below is slow), same rules
    space = replace(space, zero_stage=(0, 1, 3), mlp_chunks=(1, 2, 16), loss_chunks=(1, 4, 32),
                    checkpointing=("none", "selective", "full"),
                    sequence_chunks=tuple(c for c in (1, 4) if c in space.sequence_chunks))
    fast = list(space.candidates())
    assert len(fast) == len(set(fast)) == space.size() > 0
    brute = set()
    knobs = space_mod.SearchSpace.KNOBS
    all_sp = [d for d in range(1, hw.world_size + 1) if hw.world_size % d == 0]
    choices = dict(space.choices(), sp=tuple(all_sp), ring=tuple(all_sp), micro_batch=space_mod.MICRO_BATCHES)
    for values in itertools.product(*(choices[k] for k in knobs)):
        knob = dict(zip(knobs, values))
        if knob["offload_activations"] and knob["checkpointing"] == "none":
            continue
        if knob["offload_optimizer"] and knob["zero_stage"] == 0:
            continue
        if knob["offload_param"] and not (knob["zero_stage"] == 3 and knob["offload_optimizer"]):
            continue  # canonical: parameter offload is searched at ZeRO-3 with optimizer offload
        dp = hw.world_size // knob["sp"]
        needed = (wl.global_batch or 1) // (dp * knob["micro_batch"]) or 1
        for ga in {1, 2, needed}:
            try:
                cand = Candidate(dp=dp, grad_accum=ga, **knob)
            except ValueError:
                continue
            if invalid_reason(model, hw, wl, cand, cross) is None:
                brute.add(cand)
    assert set(fast) == brute
    assert all(canonical(c) == c for c in fast)


def test_neighbours_change_one_knob():
    space = build_space(LLAMA, cluster(), Workload(131072))
    cand = Candidate(sp=8, zero_stage=2, checkpointing="full", mlp_chunks=4, loss_chunks=8, offload_optimizer=True)
    neighbours = list(space.neighbours(cand))
    assert neighbours and cand not in neighbours
    for other in neighbours:
        changed = [k for k in space.KNOBS if getattr(other, k) != getattr(cand, k)]
        assert 1 <= len(changed) <= 3  # sp moves with overlap/micro-batch; offloads may be canonicalised
        assert space.reason(other) is None


def test_zero3_tiles_the_loss_of_tied_models_too():
    # the compiler keeps the LM head gathered for a tiled loss under ZeRO-3, the shared matrix of a tied model too
    # (issue 22 item 4); the space offers the pair for both
    untied = list(build_space(LLAMA, cluster(), Workload(131072)).candidates())
    assert any(c.zero_stage == 3 and c.loss_chunks > 1 for c in untied)
    tied_model = replace(LLAMA, tied_embeddings=True)
    space = build_space(tied_model, cluster(), Workload(131072))
    cands = list(space.candidates())
    assert len(cands) == space.size() == len(untied)
    assert any(c.zero_stage == 3 and c.loss_chunks > 1 for c in cands)
    tiled = Candidate(sp=8, zero_stage=3, checkpointing="full", loss_chunks=8)
    assert space.reason(tiled) is None
    assert space.make_nearest(**{k: getattr(tiled, k) for k in space.KNOBS}) == tiled


def test_space_version_tracks_the_rules_source():
    from autosp.contract import rules

    sources = (Path(space_mod.__file__), Path(rules.__file__))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:10]
    assert SPACE_VERSION == f"{space_mod.SPACE_REVISION}-{digest}"


def test_canonical_form():
    assert canonical(Candidate(sp=1, overlap="kv_async")).overlap == "none"
    assert canonical(replace(Candidate(sp=8), checkpointing="full", offload_activations=True)).offload_activations
    space = build_space(LLAMA, cluster(), Workload(131072))
    knobs = dict(sp=8, zero_stage=0, micro_batch=1, checkpointing="none", mlp_chunks=1, loss_chunks=1,
                 offload_activations=True, overlap="none", offload_optimizer=True)
    made = space.make(**knobs)   # offloads that cannot apply are dropped, not errors
    assert not made.offload_optimizer and not made.offload_activations
    assert space.make(**dict(knobs, zero_stage=1)).offload_optimizer
    assert all(not (c.offload_optimizer and c.zero_stage == 0) for c in space.candidates())
    assert any(c.offload_optimizer for c in space.candidates())
