"""The cost model's ring-attention terms (2-D SP, sp = Ulysses x ring): shapes, volumes, links, overlap, block
efficiency and buffers, against hand-computed expectations (docs/cost_model.md, "Ring attention")."""

import math
from dataclasses import replace

import pytest

from autosp.cost_models import comm, estimate, flops, memory, ring
from autosp.cost_models.shapes import Shapes
from autosp.contract.specs import Candidate, Workload
from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.cost_models.catalog.models import list_models, resolve_model
from round_specs import GIB, ROUND, TINY

LLAMA = resolve_model("llama-3.1-8b")
ONE_NODE = replace(ROUND, devices_per_node=4, nodes=1)

HYBRID = Candidate(sp=4, ring=2, zero_stage=0, checkpointing="none")   # U = 2 Ulysses x R = 2 ring
W1K = Workload(seq_len=1024)


def test_shapes_follow_the_ulysses_degree_and_zigzag_padding():
    sh = Shapes(TINY, W1K, HYBRID)
    assert (sh.P, sh.U, sh.R) == (4, 2, 2)
    assert sh.s == 256                          # S / P tokens before the all-to-all
    assert sh.k_eff == 2 * 16 and sh.kv_copies == 1   # U = 2 divides the 2 KV heads: no copies
    assert sh.local_heads == 2                  # 4 heads / U
    # zigzag: 2R chunks whose pairs split over U ranks -> a multiple of lcm(sp, 2R): 4 for U2 x R2, 8 for a
    # pure ring of 4; pure Ulysses: of sp = 4
    assert Shapes(TINY, Workload(1001), HYBRID).S_pad == 1004
    assert Shapes(TINY, Workload(1001), Candidate(sp=4, ring=4)).S_pad == 1008
    assert Shapes(TINY, Workload(1001), Candidate(sp=4)).S_pad == 1004
    # Llama-3.1-8B, 8 KV heads: the replication follows U, not sp
    assert Shapes(LLAMA, W1K, Candidate(sp=64, ring=4)).kv_copies == 2        # U = 16
    assert Shapes(LLAMA, W1K, Candidate(sp=64, ring=8)).kv_copies == 1        # U = 8
    assert Shapes(LLAMA, W1K, Candidate(sp=64, ring=64)).k_eff == 8 * 128     # pure ring: own KV heads
    with pytest.raises(ValueError, match=r"Ulysses degree 64 \(sp=64 / ring=1\)|sp=64 does not divide"):
        Shapes(LLAMA, W1K, Candidate(sp=64))
    with pytest.raises(ValueError, match="Ulysses degree 3"):
        Shapes(TINY, W1K, Candidate(sp=6, ring=2))


def test_ring_volumes_per_layer():
    """A K/V block is the rank's S/R tokens x its KV heads, k and v: 2 s k' e bytes; the fp32 dK/dV
    accumulator 2 s k' x 4. Forward R-1 blocks, backward R-1 blocks and R accumulators."""
    sh = Shapes(TINY, W1K, HYBRID)
    assert ring.kv_block_bytes(sh) == 2 * 256 * 32 * 2 == 32_768
    assert ring.dkv_block_bytes(sh) == 2 * 256 * 32 * 4 == 65_536
    # at fixed S/P the block is independent of how the group splits (k' = n_kv d while U <= n_kv)
    for r in (2, 4, 8):
        other = Shapes(LLAMA, Workload(seq_len=8 * 4096), Candidate(sp=8, ring=r))
        assert ring.kv_block_bytes(other) == 2 * 4096 * 1024 * 2
    # no ring, no traffic
    plain = Shapes(TINY, W1K, Candidate(sp=4))
    assert ring.kv_block_bytes(plain) == ring.dkv_block_bytes(plain) == 0
    assert ring.layer_times(ROUND, Candidate(sp=4), plain, 1.0, 2.5) == (0.0, 0.0, 0.0, 0.0)


def test_ring_link_is_the_network_when_the_group_spans_nodes():
    sh = Shapes(TINY, W1K, HYBRID)
    assert ring.spans_nodes(ROUND, HYBRID) and not ring.spans_nodes(ONE_NODE, HYBRID)
    t_kv, t_dkv = ring.transfer_times(ROUND, HYBRID, sh)
    assert t_kv == pytest.approx(2e-5 + 32_768 / 1e9) and t_dkv == pytest.approx(2e-5 + 65_536 / 1e9)
    t_kv, t_dkv = ring.transfer_times(ONE_NODE, HYBRID, sh)
    assert t_kv == pytest.approx(1e-5 + 32_768 / 1e10) and t_dkv == pytest.approx(1e-5 + 65_536 / 1e10)
    # the Ulysses all-to-all runs over U = 2 ranks inside a node either way: half its buffer crosses NVLink
    t_q, t_k, _, _ = comm.ulysses_layer_times(ROUND, sh)
    assert t_q == pytest.approx(1e-5 + 256 * 64 * 2 / 2 / 1e10)
    assert t_k == pytest.approx(1e-5 + 256 * 32 * 2 / 2 / 1e10)
    assert comm.ulysses_bytes_per_layer(sh) == (2 * 64 + 2 * 32) * 256 * 2 / 2
    # a pure ring has no all-to-all and no all-to-all staging buffers
    pure = Shapes(TINY, W1K, Candidate(sp=4, ring=4))
    assert comm.ulysses_layer_times(ROUND, pure) == (0.0, 0.0, 0.0, 0.0)
    assert memory.a2a_buffer_bytes(pure) == 0 and memory.a2a_buffer_bytes(sh) == 2 * 256 * 64 * 2


def test_overlap_step_by_step():
    # forward: the block for step i+1 travels under step i; the first step is the rank's own block
    assert ring.exposed_forward(1.0, [0.5, 2.0, 2.0, 2.0]) == 0.5
    assert ring.exposed_forward(1.0, [3.0, 3.0]) == 0.0
    # backward: step 0 hides the next K/V (1.0 - 0.5); steps 1, 2 hide K/V + the previous dK/dV (3 - 2.5 each);
    # step 3 the previous dK/dV (2 - 1); the last dK/dV's hop home is exposed (2)
    assert ring.exposed_backward(1.0, 2.0, [0.5, 2.5, 2.5, 1.0]) == pytest.approx(0.5 + 0.5 + 0.5 + 1.0 + 2.0)
    # with plenty of compute only the final hop shows
    assert ring.exposed_backward(1.0, 2.0, [10.0] * 8) == 2.0


def test_block_efficiency_is_the_fitted_flash_attention_curve():
    assert ring.block_speeds(Shapes(TINY, W1K, Candidate(sp=4))) == (1.0, 1.0)
    sh = Shapes(TINY, W1K, HYBRID)   # S_pad 1024, R = 2: chunks of c = 256 tokens
    base = 1024 / (1024 + 534)
    diag = (512 / (512 + 534)) / base            # step 0: causal over the rank's own 2c tokens
    off = min(1.0, (256 / (256 + 194)) / base)   # other steps: unmasked c x c blocks
    assert ring.block_speeds(sh) == pytest.approx((diag, off))
    assert ring.compute_factor(sh) == pytest.approx((1 / diag + 1 / off) / 2)
    # long contexts run at the whole-sequence speed: 16M tokens over a ring of 64
    long = Shapes(LLAMA, Workload(16 * 2**20), Candidate(sp=64, ring=64))
    assert 1.0 <= ring.compute_factor(long) < 1.003
    # shorter blocks, slower kernels
    factors = [ring.compute_factor(Shapes(LLAMA, Workload(65_536), Candidate(sp=64, ring=r))) for r in (2, 8, 64)]
    assert factors[0] < factors[1] < factors[2]


def test_zigzag_balances_the_causal_work():
    """Every rank does 1/P of the causal work whatever the split (zigzag: ring rank r holds chunks r and
    2R-1-r, 2c^2 per step); check the chunk arithmetic the cost model relies on, then the FLOP count."""
    for R in (2, 3, 4, 8):
        work = []
        for r in range(R):
            mine = (r, 2 * R - 1 - r)
            work.append(sum(1.0 if j < i else 0.5 for i in mine for j in range(2 * R) if j <= i))
        assert max(work) == min(work) == pytest.approx((2 * R) ** 2 / 2 / R)
    w = Workload(seq_len=4096)
    counts = {flops.attention_flops_forward(Shapes(TINY, w, Candidate(sp=4, ring=r))) for r in (1, 2, 4)}
    assert counts == {2 * 4096 ** 2 * 64 * 2 / 4}


def test_hand_computed_hybrid_estimate():
    """tiny on two nodes of two: sp = 4 = U 2 x R 2, S = 1024, no checkpointing, ZeRO 0."""
    est = estimate(TINY, ROUND, W1K, HYBRID)
    sh = Shapes(TINY, W1K, HYBRID)
    L = 2
    # all-to-alls over U = 2 inside a node: 4 per pass, forward + backward
    t_q = 1e-5 + 256 * 64 * 2 / 2 / 1e10
    t_kv = 1e-5 + 256 * 32 * 2 / 2 / 1e10
    a2a = L * 2 * (2 * t_q + 2 * t_kv)
    # ring over the network: forward 1 K/V block, backward 1 K/V block + 2 dK/dV accumulators, per layer
    r_kv, r_dkv = 2e-5 + 32_768 / 1e9, 2e-5 + 65_536 / 1e9
    p2p = L * (r_kv + (r_kv + 2 * r_dkv))
    assert est.time.attention_comm == pytest.approx(a2a + p2p)
    # exposure: step compute from the layer's attention forward (2 S^2 q / P FLOPs at 0.5e12) at block speed
    diag, off = ring.block_speeds(sh)
    unit = 2 * 1024 ** 2 * 64 / 4 / 0.5e12 / 2          # half the layer's work per step, whole-sequence speed
    c0, c1 = unit / diag, unit / off
    ring_exposed = L * (max(0, r_kv - c0) + max(0, r_kv - 2.5 * c0) + max(0, r_dkv - 2.5 * c1) + r_dkv)
    zero_exposed = comm.zero_times(ROUND, HYBRID, TINY.n_params(), 2)[3]
    assert est.time.exposed_comm == pytest.approx(a2a + ring_exposed + zero_exposed)
    # the ring's backward buffers join the attention phase of the backward working set (fixed bytes per
    # local token): fp32 dQ 4q + two fp32 dK/dV 2 x 2k' x 4 + two K/V blocks 2 x 2k' x 2 = 1024 B
    assert ring.backward_extra_bytes(sh) == 4 * 64 + 2 * 2 * 32 * 4 + 2 * 2 * 32 * 2 == 1024
    plain_fixed = memory.layer_transient_phases(Shapes(TINY, W1K, Candidate(sp=2, dp=2)), "none", 1)[3]
    assert memory.layer_transient_phases(sh, "none", 1)[3] == plain_fixed + 1024
    # forward buffers: fp32 output 4q + fp32 LSE 4a + step output 2q + step LSE 4a + two K/V blocks 2 x 2k' x 2
    assert ring.forward_extra_bytes(sh) == 256 + 16 + 128 + 16 + 256
    # merges and copies through HBM, per local token and layer: forward R (8q + eq + 12a) + (R-1) 4k'e,
    # backward R (8q + eq + 16k' + 2k'e) + (R-1) 4k'e
    assert ring.pointwise_bytes(sh) == (2 * (512 + 128 + 48) + 256, 2 * (512 + 128 + 512 + 128) + 256)
    notes = " | ".join(est.notes)
    assert "ring of 2 spans 2 nodes" in notes and "hidden under blockwise attention" in notes


def test_the_ring_forward_never_sets_the_peak():
    """docs/cost_model.md prices the ring's forward buffers nowhere: its forward (or full recompute) holds the
    layer's n1, q, k, v, the incoming residual gradient and the forward buffers, always less than the attention
    backward phase with the ring's backward buffers. (The forward buffers alone can be the larger: Llama-70B's
    8 query heads per KV head make its fp32 output accumulator outweigh the fp32 dK/dV.)"""
    seen_larger_buffers = False
    for model in list_models():
        if model.linear_layers:
            continue  # a hybrid's Gated DeltaNet layers run no ring (cost_models/linear_attention.py)
        for sp, r in ((8, 2), (8, 8), (64, 8), (64, 64)):
            u = sp // r
            if model.n_heads % u or (u > 1 and model.n_kv_heads % u and u % model.n_kv_heads):
                continue
            sh = Shapes(model, W1K, Candidate(sp=sp, ring=r))
            _, _, attn_elems, attn_fixed = memory.layer_transient_phases(sh, "full", 1)
            backward = attn_elems * sh.e + attn_fixed
            forward = (2 * sh.h + sh.q + 2 * sh.k_eff) * sh.e + ring.forward_extra_bytes(sh)
            assert forward < backward, (model.name, sp, r)
            seen_larger_buffers |= ring.forward_extra_bytes(sh) > ring.backward_extra_bytes(sh)
    assert seen_larger_buffers  # the phase comparison, not the buffers alone, is what holds


def test_ring_hides_across_nodes_where_ulysses_all_to_alls_do_not():
    """Llama-3.1-8B at 1M tokens on 4 nodes: Ulysses over all 32 ranks sends its all-to-alls over the network
    with nothing to hide behind; Ulysses 8 inside each node x a ring of 4 across nodes hides nearly all of its
    P2P under blockwise attention."""
    hw = resolve_hardware("h100x32")
    w = Workload(seq_len=1 << 20)
    base = Candidate(sp=32, zero_stage=3, checkpointing="full", loss_chunks=8, overlap="none")
    ulysses = estimate(LLAMA, hw, w, base)
    hybrid = estimate(LLAMA, hw, w, replace(base, ring=4))
    assert hybrid.time.exposed_comm < 0.25 * ulysses.time.exposed_comm
    assert hybrid.time.step < ulysses.time.step
    assert any("spans nodes" in n for n in ulysses.notes)
    assert any(n.startswith("ring of 4 spans 4 nodes") for n in hybrid.notes)


def test_memory_grows_linearly_past_the_head_count():
    """Past 32 GPUs only the ring grows sp for Llama-3.1-8B; the longest context that fits grows ~linearly."""
    from autosp.cost_models import max_seq_len

    lean = dict(zero_stage=3, checkpointing="full", mlp_chunks=8, loss_chunks=32, offload_activations=True,
                offload_optimizer=True)
    ctx = {}
    for nodes in (4, 8, 16):
        hw = resolve_hardware(f"h100x{8 * nodes}")
        ctx[nodes] = max_seq_len(LLAMA, hw, Candidate(sp=8 * nodes, ring=8 * nodes, **lean), multiple_of=1024)
    assert ctx[8] > 1.9 * ctx[4] and ctx[16] > 1.9 * ctx[8]
    assert math.isfinite(ctx[16]) and ctx[4] > 15_500_000


def test_the_cost_model_pads_as_the_compiler_does():
    """The padded length priced is the one the compiler's zigzag sharding makes, for every U x R."""
    from autosp.compiler.attention.layout import pad_multiple
    from autosp.cost_models.shapes import padding_multiple

    for ulysses in (1, 2, 3, 4, 8):
        for ring in (1, 2, 3, 4, 8, 16):
            assert padding_multiple(Candidate(sp=ulysses * ring, ring=ring)) == pad_multiple(ulysses, ring), \
                (ulysses, ring)


def test_sequence_checkpointing_in_a_pure_ring_keeps_no_qkv():
    """`sequence` saves attention and collective outputs: with a Ulysses dimension q, k, v (after their
    all-to-all) and both layouts of the attention output; a pure ring has no all-to-all, so it keeps the layer
    input and one attention output and recomputes q, k, v in the backward (measured: studies/ring_costs.py)."""
    w = Workload(seq_len=4096)
    h, q, k = 64, 64, 32
    pure = Shapes(TINY, w, Candidate(sp=4, ring=4, checkpointing="sequence"))
    hybrid = Shapes(TINY, w, Candidate(sp=4, ring=2, checkpointing="sequence"))
    assert memory.layer_saved_elems(pure, "sequence", False) == (h + q, 0.0)
    assert memory.layer_saved_elems(hybrid, "sequence", False) == (h + 3 * q + 2 * k, 0.0)
    # the recomputed q, k, v live through the layer's attention backward
    hybrid_phase = memory.layer_transient_phases(hybrid, "sequence", 1)[2]
    assert memory.layer_transient_phases(pure, "sequence", 1)[2] == hybrid_phase + q + 2 * k
    # other policies and pure Ulysses are untouched
    for policy in ("none", "selective", "full"):
        assert (memory.layer_saved_elems(pure, policy, False) == memory.layer_saved_elems(hybrid, policy, False))
    assert ring.sequence_policy_without_all_to_all(Shapes(TINY, w, Candidate(sp=4))) == (0.0, 0.0)
