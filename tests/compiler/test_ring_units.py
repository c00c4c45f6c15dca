"""2-D sequence parallelism (Ulysses x Ring) in one process: the blockwise attention layer against plain SDPA,
the zigzag layout and sharding, the passes on captured Dynamo graphs, and plan resolution.
(tests/compiler/test_compiler_ring.py runs ring attention on gloo against one process on the full sequence.)"""

from __future__ import annotations

import itertools
import operator

import pytest
import torch
import torch.nn.functional as F

from autosp.compiler import ops  # noqa: F401  (registers torch.ops.autosp_ops.*)
from autosp.compiler.api import hand_made_candidate, resolve_candidate
from autosp.compiler.attention import (
    attention_pieces,
    block_backward,
    block_forward,
    merge_partials,
    rank_spans,
    ring_spans,
    span_index,
)
from autosp.compiler.attention.layout import flat_ranges, pad_multiple, unflatten_ranges
from autosp.compiler.context import SPContext
from autosp.compiler.inputs import shard_batch
from autosp.compiler.passes import attention_pass, check_pass, mask_pass, position_pass
from autosp.compiler.passes.attention import RING
from autosp.compiler.passes.common import SDPA, is_call
from autosp.compiler.testing import capture_graph
from autosp.contract.specs import Candidate, ModelSpec
from autosp.errors import UsageError

A2A = torch.ops.autosp_ops.all_to_all.default


def _causal_pairs(q_spans, k_spans) -> torch.Tensor:
    """The (query row, key row) pairs causal attention allows, as a boolean matrix (tests only: tiny sizes)."""
    q, k = span_index(q_spans), span_index(k_spans)
    return k[None, :] <= q[:, None]


def _covered(pieces, n, m) -> torch.Tensor:
    count = torch.zeros(n, m, dtype=torch.int64)
    for p in pieces:
        block = torch.ones(p.q_stop - p.q_start, p.k_stop - p.k_start, dtype=torch.int64)
        if p.causal:
            assert p.q_stop - p.q_start == p.k_stop - p.k_start
            block = block.tril()
        count[p.q, p.k] += block
    return count


LAYOUTS = {
    "zigzag_r4": ring_spans(32, 4),
    "zigzag_u2_r2_shards": [rank_spans(24, 2, 2, r) for r in range(4)],
    "contiguous": [[(0, 5)], [(5, 13)], [(13, 24)]],
    "interleaved": [[(3, 9), (15, 24)], [(0, 3), (9, 15)]],
    "overlapping_ranges": [[(0, 10)], [(5, 15)], [(2, 12), (14, 20)]],  # not a partition: exercises every split
}


# --- pieces -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_pieces_cover_exactly_the_causal_pairs_once(layout):
    blocks = LAYOUTS[layout]
    for q_spans, k_spans in itertools.product(blocks, blocks):
        pieces = attention_pieces(q_spans, k_spans)
        n, m = len(span_index(q_spans)), len(span_index(k_spans))
        assert torch.equal(_covered(pieces, n, m), _causal_pairs(q_spans, k_spans).long()), (q_spans, k_spans)


def test_zigzag_ring_steps_are_balanced_single_calls():
    for ring in (2, 3, 4):
        blocks = ring_spans(8 * ring, ring)  # chunks of 4 tokens
        work = []
        for r in range(ring):
            own = attention_pieces(blocks[r], blocks[r])
            # the two diagonals and one full piece; the last position's chunks touch: one causal square
            assert [p.causal for p in own] == ([True] if r == ring - 1 else [True, False, True])
            total = sum(p.pairs for p in own)
            for step in range(1, ring):
                pieces = attention_pieces(blocks[r], blocks[(r - step) % ring])
                assert len(pieces) == 1 and not pieces[0].causal  # one SDPA call per ring step
                assert pieces[0].pairs == 4 * 8  # half the block pair: c x 2c
                total += pieces[0].pairs
            work.append(total)
        assert len(set(work)) == 1, work  # every ring position does the same attention work


# --- blockwise kernels and merge ---------------------------------------------------------------------------
def _gather(t, spans):
    return t[:, :, span_index(spans)]


@pytest.mark.parametrize("layout,n_heads,n_kv", [("zigzag_r4", 4, 1), ("zigzag_u2_r2_shards", 4, 2),
                                                 ("contiguous", 2, 2), ("interleaved", 6, 3)])
def test_blockwise_forward_and_backward_equal_sdpa(layout, n_heads, n_kv):
    blocks = LAYOUTS[layout]
    seq = max(b for spans in blocks for _, b in spans)
    torch.manual_seed(0)
    q = torch.randn(2, n_heads, seq, 8, requires_grad=True)
    k = torch.randn(2, n_kv, seq, 8, requires_grad=True)
    v = torch.randn(2, n_kv, seq, 8, requires_grad=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=0.3)
    grad_out = torch.randn_like(ref)
    ref.backward(grad_out)
    out = torch.zeros_like(ref)
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    with torch.no_grad():
        merged = {}
        for i, q_spans in enumerate(blocks):
            acc = None
            for k_spans in reversed(blocks):  # any order: the merge is order-free
                acc = block_forward(_gather(q, q_spans), _gather(k, k_spans), _gather(v, k_spans), q_spans, k_spans,
                                    0.3, into=acc)
            merged[i] = acc
            out[:, :, span_index(q_spans)] = acc[0]
        for (i, q_spans), k_spans in itertools.product(enumerate(blocks), blocks):
            gq, gk, gv = block_backward(_gather(grad_out, q_spans), _gather(q, q_spans), _gather(k, k_spans),
                                        _gather(v, k_spans), merged[i][0], merged[i][1], q_spans, k_spans, 0.3)
            dq[:, :, span_index(q_spans)] += gq
            dk[:, :, span_index(k_spans)] += gk
            dv[:, :, span_index(k_spans)] += gv
    # every token is a query of one block here; as keys, 'overlapping_ranges' would count tokens twice
    for got, want in ((out, ref), (dq, q.grad), (dk, k.grad), (dv, v.grad)):
        assert (got - want).norm() / want.norm() < 1e-6


def test_merge_is_order_free_and_keeps_rows_that_saw_nothing():
    torch.manual_seed(1)
    parts = [(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5)) for _ in range(3)]
    parts[1][1][..., 2] = float("-inf")  # row 2 saw no key in part 1
    a = merge_partials(*merge_partials(*parts[0], *parts[1]), *parts[2])
    b = merge_partials(*parts[2], *merge_partials(*parts[1], *parts[0]))
    assert torch.allclose(a[0], b[0], atol=1e-6) and torch.allclose(a[1], b[1], atol=1e-6)
    nothing = (torch.zeros(1, 2, 5, 4), torch.full((1, 2, 5), float("-inf")))
    out, lse = merge_partials(*nothing, *nothing)
    assert torch.isneginf(lse).all() and not out.isnan().any() and (out == 0).all()
    out, lse = merge_partials(*nothing, *parts[0])
    assert torch.equal(out, parts[0][0]) and torch.equal(lse, parts[0][1])


# --- layout and sharding -----------------------------------------------------------------------------------
def test_zigzag_layout_is_torch_head_tail_and_partitions_the_sequence():
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import _HeadTailLoadBalancer

    for ring in (2, 3, 4):
        seq = 4 * ring * 3
        order = torch.cat([span_index(spans) for spans in ring_spans(seq, ring)])
        assert torch.equal(order, _HeadTailLoadBalancer(seq, ring, "cpu")._generate_indices()[0].long())
    for ulysses, ring in ((1, 4), (2, 2), (4, 1), (3, 2)):
        seq = pad_multiple(ulysses, ring) * 2
        held = torch.cat([span_index(rank_spans(seq, ulysses, ring, r)) for r in range(ulysses * ring)])
        assert sorted(held.tolist()) == list(range(seq))
        # the ranks of one ring position hold its block, in order (what the Ulysses all-to-all gathers)
        for r in range(ring):
            block = torch.cat([span_index(rank_spans(seq, ulysses, ring, r * ulysses + u)) for u in range(ulysses)])
            assert torch.equal(block, span_index(ring_spans(seq, ring)[r]))
    assert unflatten_ranges(flat_ranges(24, 3), 3) == ring_spans(24, 3)


def test_ring_sharding_shifts_labels_over_the_full_sequence_then_permutes_and_pads():
    ids = torch.arange(30).reshape(1, 30) + 100
    labels = ids.clone()
    labels[0, 20:] = -100
    shards = [shard_batch(ids, labels, sp=4, sp_rank=r, dp=1, dp_rank=0, ring=2, make_position_ids=True,
                          pad_token_id=0) for r in range(4)]
    total = shards[0].global_len
    assert total == 32 and all(s.local_len == 8 for s in shards)
    full_ids, full_labels, full_pos = (torch.full((1, total), -1, dtype=torch.long) for _ in range(3))
    for s in shards:
        index = span_index(s.spans)
        full_ids[:, index], full_labels[:, index], full_pos[:, index] = s.input_ids, s.labels, s.position_ids
    assert full_ids[0, :30].tolist() == ids[0].tolist() and full_ids[0, 30:].tolist() == [0, 0]
    expected = torch.cat([labels[0, 1:], torch.tensor([-100, -100, -100])])  # shifted over the whole sequence
    assert full_labels[0].tolist() == expected.tolist()
    assert full_pos[0].tolist() == list(range(32))
    assert [s.spans for s in shards] == [[(0, 8)], [(24, 32)], [(8, 16)], [(16, 24)]]
    assert all(s.n_valid == 19 for s in shards)


# --- passes on captured graphs ------------------------------------------------------------------------------
def ring_context(local_len, sp, ring, rank, **knobs):
    return SPContext(candidate=Candidate(sp=sp, ring=ring, **knobs), sp_rank=rank, sp_group="sp", world_group="world",
                     grad_world_size=sp, local_len=local_len, global_len=local_len * sp,
                     ulysses_group="ulysses" if ring < sp else None, ring_group="ring")


def test_position_pass_gives_each_row_its_zigzag_position():
    table = torch.randn(64, 8)

    def fn(x):
        pos = torch.arange(x.shape[1])
        return torch.cos(pos.float()) + F.embedding(pos, table).sum(-1)

    x = torch.randn(2, 8)
    gm, inputs = capture_graph(fn, x)
    ctx = ring_context(8, sp=4, ring=4, rank=1)  # ring position 1 of 4 over 32 tokens: [4, 8) and [24, 28)
    assert ctx.spans == [(4, 8), (24, 28)]
    position_pass(gm, inputs, ctx)
    gm.recompile()
    positions = span_index(ctx.spans).float()
    assert ctx.stats.positions_offset == 1
    assert torch.allclose(gm(*inputs)[0], torch.cos(positions) + table[positions.long()].sum(-1))


def _reference(n_heads=4, n_kv=2, seq=8):
    from autosp.compiler.models import Llama

    spec = ModelSpec(name="t", n_layers=1, hidden=32, n_heads=n_heads, n_kv_heads=n_kv, head_dim=8, ffn_hidden=64,
                     vocab=64)
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (1, seq))
    return capture_graph(Llama(spec), ids, ids.clone())


def _hf_llama(seq=8):
    import transformers

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa",
                                      use_cache=False)
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (1, seq))
    return capture_graph(transformers.LlamaForCausalLM(config), input_ids=ids, labels=ids.clone())


@pytest.mark.slow
def test_pure_ring_replaces_attention_without_all_to_alls():
    gm, inputs = _hf_llama()
    ctx = ring_context(8, sp=4, ring=4, rank=2)
    for sp_pass in (mask_pass, position_pass, attention_pass, check_pass):
        sp_pass(gm, inputs, ctx)
    gm.graph.lint()
    from autosp.compiler.passes.common import shape

    rings = [n for n in gm.graph.nodes if is_call(n, {RING})]
    assert len(rings) == 2 and not any(is_call(n, SDPA) for n in gm.graph.nodes)
    assert not any(is_call(n, {A2A}) for n in gm.graph.nodes)
    for node in rings:
        q, k, v, scale, group, ranges = node.args
        assert group == "ring" and ranges == flat_ranges(32, 4)
        assert shape(q)[1] == 4 and shape(k)[1] == 2 and shape(v)[1] == 2  # repeat_kv peeled: 2 kv heads travel
    assert ctx.stats.masks_removed == 2 and ctx.stats.attention == 2


@pytest.mark.slow
@pytest.mark.parametrize("overlap", ["none", "kv_async", "head_pipeline"])
def test_ulysses_times_ring_wraps_ring_attention_in_all_to_alls(overlap):
    gm, inputs = _reference(n_heads=8, n_kv=2)
    ctx = ring_context(8, sp=4, ring=2, rank=3, overlap=overlap)
    for sp_pass in (position_pass, attention_pass, check_pass):
        sp_pass(gm, inputs, ctx)
    gm.graph.lint()
    rings = [n for n in gm.graph.nodes if is_call(n, {RING})]
    assert rings and not any(is_call(n, SDPA) for n in gm.graph.nodes)
    starts = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in (
        A2A, torch.ops.autosp_ops.all_to_all_start.default)]
    assert all(n.args[3] == "ulysses" for n in starts)  # the all-to-alls run over the Ulysses group
    from autosp.cost_models.step_time import HEAD_PIPELINE_CHUNKS

    # 8 heads / U 2 = 4 local heads; the head pipeline runs one ring per head group
    assert len(rings) == (min(HEAD_PIPELINE_CHUNKS, 4) if overlap == "head_pipeline" else 1)
    # SP rank 3 = Ulysses rank 1 of ring position 1, which holds chunks 1 and 2 of 4 ([8, 16), [16, 24)) of
    # the 32 tokens: its half is one span, so its positions are the arange + 16
    assert ctx.spans == [(16, 24)]
    assert [n.args[1] for n in gm.graph.nodes if n.op == "call_function" and n.target is operator.add
            and n.args[0].target is torch.arange] == [16]


@pytest.mark.slow
def test_head_counts_need_only_divide_by_the_ulysses_ranks():
    gm, inputs = _reference(n_heads=2, n_kv=1)
    attention_pass(gm, inputs, ring_context(8, sp=4, ring=2, rank=0))  # 2 heads, P=4 = U 2 x R 2: fine
    gm, inputs = _reference(n_heads=2, n_kv=1)
    with pytest.raises(UsageError, match="2 query heads do not divide over 4 Ulysses ranks"):
        attention_pass(gm, inputs, ring_context(8, sp=8, ring=2, rank=0))


def test_plan_resolution_with_a_ring():
    candidate = hand_made_candidate(4, 8, ring=2)
    assert (candidate.sp, candidate.ring, candidate.ulysses, candidate.dp) == (4, 2, 2, 2)
    candidate, _ = resolve_candidate(Candidate(sp=4, ring=4, checkpointing="full", mlp_chunks=2, zero_stage=3))
    assert candidate.ring == 4
    with pytest.raises(UsageError, match="ring .* must divide sp"):
        hand_made_candidate(4, 4, ring=3)
    with pytest.raises(UsageError, match="overlap=kv_async overlaps the Ulysses all-to-alls"):
        resolve_candidate(Candidate(sp=4, ring=4, overlap="kv_async"))
    resolve_candidate(Candidate(sp=4, ring=2, overlap="head_pipeline"))  # U = 2: there is something to overlap
