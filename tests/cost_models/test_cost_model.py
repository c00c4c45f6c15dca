"""Analytic cost model: ZeRO formulas, a hand-computed example, every knob's direction, comm volume."""

import math
from dataclasses import replace

import pytest

from autosp.cost_models import estimate, fits, max_seq_len, memory_only
from autosp.contract import deepspeed_buffers as ds
from autosp.cost_models import comm, flops, memory, optimizer_offload
from autosp.cost_models.shapes import Shapes
from autosp.contract.specs import AcceleratorSpec, Candidate, HardwareSpec, ModelSpec, Workload
from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.cost_models.catalog.models import resolve_model

GB = 1e9
GIB = 1024 ** 3

LLAMA = resolve_model("llama-3.1-8b")
H100X8 = resolve_hardware("h100x8")


# --------------------------------------------------------------------------------------------------
# ZeRO model states (docs/design.md section 3; ZeRO paper arXiv 1910.02054, Figure 1: psi = 7.5B, N_d = 64)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stage, expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_formulas_reproduce_the_zero_paper(stage, expected_gb):
    total = sum(memory.zero_state_bytes(7.5e9, 64, stage, "bf16"))
    assert total / GB == pytest.approx(expected_gb, abs=0.05)


def test_zero_splits_by_component():
    psi, nd = 1e9, 8
    assert memory.zero_state_bytes(psi, nd, 0) == (2 * psi, 2 * psi, 12 * psi)
    assert memory.zero_state_bytes(psi, nd, 1) == (2 * psi, 2 * psi, 12 * psi / nd)  # 4psi + 12psi/N
    assert memory.zero_state_bytes(psi, nd, 2) == (2 * psi, 2 * psi / nd, 12 * psi / nd)  # 2psi + 14psi/N
    assert memory.zero_state_bytes(psi, nd, 3) == (2 * psi / nd, 2 * psi / nd, 12 * psi / nd)  # 16psi/N
    # fp32 training: 4 B weights + 4 B grads + 8 B Adam m, v (no master copy) = 16 B as well
    assert memory.zero_state_bytes(psi, nd, 0, "fp32") == (4 * psi, 4 * psi, 8 * psi)
    assert sum(memory.zero_state_bytes(psi, nd, 3, "fp32")) == 16 * psi / nd


def test_sp_ranks_share_zero_states():
    """N_d is the whole dp x sp group: sp=8 dp=1 shards like dp=8."""
    w = Workload(seq_len=8192)
    from autosp.cost_models.shapes import Shapes

    states = []
    for cand in (Candidate(sp=8, dp=1, zero_stage=2), Candidate(sp=1, dp=8, zero_stage=2)):
        states.append(memory.model_states(cand, "bf16", Shapes(LLAMA, w, cand)))
    (pa, ga, oa, _), (pb, gb, ob, _) = states
    assert oa == ob == 12 * LLAMA.n_params() / 8
    assert ga == gb == 2 * LLAMA.n_params() / 8


# --------------------------------------------------------------------------------------------------
# A hand-computed example
# --------------------------------------------------------------------------------------------------

TINY = ModelSpec(name="tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_hidden=128, vocab=256)
ROUND = HardwareSpec(
    name="round", accelerator=AcceleratorSpec(name="round", peak_flops=1e12, memory_bytes=8 * GIB,
                                              memory_bandwidth=1e11),
    devices_per_node=2, intra_node_bandwidth=1e10, intra_node_latency=1e-5, inter_node_bandwidth=1e9,
    inter_node_latency=2e-5, host_bandwidth=1e10, host_memory_bytes=64 * GIB, matmul_efficiency=0.5,
    attention_efficiency=0.5, comm_efficiency=1.0, usable_memory_fraction=1.0)


def test_hand_computed_tiny_example():
    """tiny: L=2, h=64, 4 heads x 16, 2 KV heads, ffn 128, vocab 256; S=1024, sp=2, ZeRO 0, no checkpointing."""
    w = Workload(seq_len=1024, compile_backend="eager")  # the loss op by op (Inductor's fused loss: below)
    cand = Candidate(sp=2, dp=1, zero_stage=0, checkpointing="none")
    est = estimate(TINY, ROUND, w, cand)
    m = est.memory

    # Parameters: layer = q,o 2*64*64 + k,v 2*64*32 + MLP 3*64*128 + norms 2*64 = 36,992;
    # model = 2 layers + embedding and head 2*256*64 + final norm 64 = 106,816.
    psi = 2 * 36_992 + 2 * 256 * 64 + 64
    assert TINY.n_params() == psi == 106_816
    # ZeRO 0, bf16: 2 + 2 + 12 bytes per parameter; the gradients are not allocated at this example's peak
    # (the loss phase, see below).
    assert (m.parameters, m.gradients, m.optimizer_states) == (2 * psi, 0, 12 * psi)

    # Activations. s = 1024 / 2 = 512 local tokens, q = 64, k = 32 (2 KV heads divide by sp=2), e = 2.
    # Kept per token and layer (elements): x, norm1(x), h1, norm2(h1) = 4h = 256; q, k, v after the
    # all-to-all = 64 + 2*32 = 128; attention output + its o_proj copy = 2*64 = 128; MLP gate, silu,
    # up, product = 4*128 = 512 -> 1024 elements = 2048 B, plus fp32 logsumexp 4 B x 4 heads and two
    # fp32 RMSNorm inverse-RMS values (8 B) = 2072 B per token and layer.
    final = 2 * 64 * 2 * 512  # the final norm's input and output (2h x 2 B x 512), kept outside the layers
    kept = 2 * 512 * 2072 + final  # two layers + the final norm's
    # Backward working set of one layer: max(MLP grads 3f + 2h = 512, attention grads 4q + 2k + h = 384).
    transient = 512 * 2 * 512
    # Logits + loss: peak 512 tokens x 256 vocab x (2 B bf16 + 12 B fp32) = 1,835,008 B; during the layers'
    # backward only the bf16 logits (262,144 B) stay.
    loss_peak, logits_bwd = 512 * 256 * 14, 512 * 256 * 2
    # Buffers: all-to-all send+recv of the largest (q) tensor 2 x 512 x 64 x 2 B; ZeRO-0 one reduce bucket
    # (never larger than the model).
    a2a, bucket = 2 * 512 * 64 * 2, min(ds.REDUCE_BUCKET_SIZE, psi) * 2
    # Two candidate peaks: the loss phase (kept + loss peak + all-to-all staging: 4,218,880 B) and the
    # layers' backward (gradients + buckets + the layers' kept sets + transient + logits: 3,466,496 B; the final
    # norm's tensors are freed by its backward, before any layer's). The loss phase wins, so the breakdown is its
    # composition.
    loss_phase = kept + loss_peak + a2a
    backward_phase = 2 * psi + a2a + bucket + kept - final + transient + logits_bwd
    assert (loss_phase, backward_phase) == (4_218_880, 3_466_496)
    assert (m.activations, m.logits_loss, m.comm_buffers) == (kept, loss_peak, a2a)
    assert any("loss phase" in n for n in est.notes)

    # Reserve: 1 GiB context + 0.5 GiB NCCL + 5% of the dynamic bytes.
    dynamic = m.activations + m.logits_loss + m.comm_buffers
    assert m.reserve == pytest.approx(1.5 * GIB + 0.05 * dynamic)

    # FLOPs. Matmul params of one forward: 2 layers x (2*64*64 + 2*64*32 + 3*64*128 = 36,864) + head 256*64.
    dense = 2 * 36_864 + 256 * 64
    mm_fwd = 2 * 512 * dense  # 92,274,688
    att_fwd = 2 * 1024 ** 2 * 64 * 2 / 2  # causal 2 S^2 q per layer, 2 layers, half the heads per GPU
    assert est.flops_per_step == pytest.approx(2 * (6 * 512 * dense + 3 * att_fwd))  # both SP ranks

    # Time. Matmuls at 0.5 x 1e12, attention at 0.5 x 1e12 (backward 2.5x forward), pointwise bytes at 1e11:
    # per layer forward 4h + 2(q+k) + 5f + 6h + 2(2q+2k) = 1856 elements x 2 B x 512 tokens, x3 for fwd+bwd,
    # plus the loss's 32 B per logit.
    pointwise = 3 * 2 * 1856 * 2 * 512 + 512 * 256 * 32
    t_micro = 3 * mm_fwd / 0.5e12 + 3.5 * att_fwd / 0.5e12 + pointwise / 1e11
    t_optimizer = 28 * psi / 1e11  # ZeRO 0: every GPU updates all parameters
    assert est.time.compute == pytest.approx(t_micro + t_optimizer)
    assert est.time.recompute == 0

    # All-to-alls: q/out buffers 512 x 64 x 2 B, k/v 512 x 32 x 2 B; half of each crosses NVLink (1e10 B/s)
    # after one 10 us latency; 4 per layer forward + 4 backward, 2 layers. Nothing overlaps (overlap none).
    t_q = 1e-5 + 512 * 64 * 2 / 2 / 1e10
    t_kv = 1e-5 + 512 * 32 * 2 / 2 / 1e10
    a2a = 2 * 2 * (2 * t_q + 2 * t_kv)
    assert est.time.attention_comm == pytest.approx(a2a)
    # ZeRO 0: ring all-reduce of the bf16 gradients over 2 ranks after the backward: 2 steps of 10 us +
    # 2 (N-1)/N x 2 psi bytes at 1e10 B/s.
    t_zero = 2 * 1e-5 + 2 * 0.5 * 2 * psi / 1e10
    assert est.time.zero_comm == pytest.approx(t_zero)
    assert est.time.exposed_comm == pytest.approx(a2a + t_zero)
    assert est.time.step == pytest.approx(t_micro + t_optimizer + a2a + t_zero)
    assert est.tokens_per_second == pytest.approx(1024 / est.time.step)
    assert est.mfu == pytest.approx(est.flops_per_step / (est.time.step * 2e12))


# --------------------------------------------------------------------------------------------------
# Every knob moves memory / time the right way
# --------------------------------------------------------------------------------------------------

W64K = Workload(seq_len=65_536)
BASE = Candidate(sp=8, dp=1, zero_stage=2, micro_batch=1, grad_accum=1, checkpointing="selective")


def _est(cand, hw=H100X8, w=W64K, model=LLAMA):
    return estimate(model, hw, w, cand)


def test_checkpointing_trades_memory_for_time():
    order = ["none", "selective", "sequence", "full"]
    ests = [_est(replace(BASE, checkpointing=p)) for p in order]
    for lighter, heavier in zip(ests, ests[1:]):
        assert heavier.memory.activations < lighter.memory.activations
        assert heavier.time.recompute > lighter.time.recompute or lighter.time.recompute == heavier.time.recompute == 0
        assert heavier.time.step >= lighter.time.step
    assert ests[-1].time.step > ests[0].time.step
    assert ests[0].time.recompute == 0 and ests[-1].time.recompute > ests[2].time.recompute > 0


@pytest.mark.parametrize("policy", ["none", "selective", "sequence", "full"])
def test_mlp_tiling_lowers_memory_and_costs_time(policy):
    # With the logits tiled too, the layers' backward sets the peak, so MLP tiling shows in the total.
    # The first split always saves memory; further splits save memory until the attention backward (which
    # tiling does not touch) outweighs one MLP chunk, then they save nothing more (with `none` at N = 4:
    # the fused MLP holds 4f per token, docs/cost_model.md section 12) and never cost memory.
    base = replace(BASE, checkpointing=policy, loss_chunks=64)
    untiled = prev = _est(base)
    for chunks in (2, 4, 8):
        cur = _est(replace(base, mlp_chunks=chunks))
        assert cur.memory.activations <= prev.memory.activations
        assert cur.memory.total <= prev.memory.total
        assert cur.time.step > prev.time.step
        prev = cur
    assert prev.memory.activations < untiled.memory.activations and prev.memory.total < untiled.memory.total


def test_a_tiled_mlp_backward_holds_the_weight_gradients_its_chunks_add_into():
    """Tiled, the MLP phase is one chunk's working set plus e bytes per MLP parameter (the gradients the tiled op
    accumulates in place through its whole backward); untiled, only the working set."""
    sh = Shapes(LLAMA, W64K, replace(BASE, mlp_chunks=4))
    for chunks in (2, 4, 8):
        phase, fixed = memory.layer_mlp_phase(sh, "selective", chunks)
        working = sh.s * sh.e * phase + sh.s * fixed
        assert memory.mlp_phase_bytes(sh, "selective", chunks) == working + 2 * 3 * LLAMA.hidden * LLAMA.ffn_hidden
    phase, fixed = memory.layer_mlp_phase(sh, "selective", 1)
    assert memory.mlp_phase_bytes(sh, "selective", 1) == sh.s * sh.e * phase + sh.s * fixed


def test_the_optimizer_offload_step_streams_through_the_profiles_host_memory_bandwidth():
    """CPU Adam is host-DRAM bound: the offloaded step's optimizer time is its host passes (Adam, the clip scale, the
    weight cast: optimizer_offload.HOST_PASS_BYTES_PER_PARAM) over the GPU's share of the node's host_memory_bandwidth (a calibrated VM's, far below a DGX's, slows it in proportion); a profile without
    the figure (0, files from before it) is priced as a DGX H100 node, the catalog's H100 figure."""
    from autosp.cost_models.step_time import HOST_ADAM_BANDWIDTH_PER_NODE

    cand = replace(BASE, offload_optimizer=True)
    dgx = _est(cand)
    assert H100X8.host_memory_bandwidth == HOST_ADAM_BANDWIDTH_PER_NODE
    assert _est(cand, hw=replace(H100X8, host_memory_bandwidth=0.0)).time == dgx.time
    slow = _est(cand, hw=replace(H100X8, host_memory_bandwidth=HOST_ADAM_BANDWIDTH_PER_NODE / 4))
    t_host = optimizer_offload.HOST_PASS_BYTES_PER_PARAM * LLAMA.n_params() / 8 / (HOST_ADAM_BANDWIDTH_PER_NODE / 8)
    assert slow.time.compute - dgx.time.compute == pytest.approx(3 * t_host, rel=1e-9)
    assert _est(BASE, hw=replace(H100X8, host_memory_bandwidth=1e9)).time == _est(BASE).time  # no offload: no change


def test_peak_is_the_larger_of_loss_and_layer_phases():
    """Untiled logits set the peak: shrinking the layer working set then leaves the total unchanged;
    tiling the loss moves the peak into the layers' backward, where the working set counts."""
    a = _est(replace(BASE, checkpointing="full", mlp_chunks=4))
    b = _est(replace(BASE, checkpointing="full", mlp_chunks=8))
    assert b.memory.total == pytest.approx(a.memory.total)
    assert any("loss phase" in n for n in a.notes) and a.memory.gradients == 0
    c = _est(replace(BASE, checkpointing="full", mlp_chunks=4, loss_chunks=16))
    d = _est(replace(BASE, checkpointing="full", mlp_chunks=8, loss_chunks=16))
    assert not any("loss phase" in n for n in c.notes) and c.memory.gradients > 0
    assert d.memory.activations < c.memory.activations and d.memory.total < c.memory.total


def test_what_is_kept_outside_the_layers_is_priced_in_the_loss_phase_only():
    """The final norm's input and output (the profile's ``final``) live until the final norm's backward, which runs
    before any layer's: a larger ``final`` raises the loss phase, never the layers' backward (Qwen3-8B at 1M tokens
    on 8 GPUs as TRL ran it: the peak is a layer's backward)."""
    from autosp.cost_models.profile import Elems, analytic_profile

    model = resolve_model("qwen3-8b")
    cand = Candidate(sp=8, ring=8, zero_stage=3, checkpointing="full", loss_chunks=128, offload_activations=True)
    work = Workload(seq_len=2 ** 20, compile_backend="eager")
    prof = analytic_profile(model)
    base = estimate(model, H100X8, work, cand, profile=prof)
    grown = estimate(model, H100X8, work, cand, profile=replace(prof, final=prof.final + Elems(4 * model.hidden)))
    assert not any("loss phase" in n for n in base.notes + grown.notes)
    assert grown.memory == base.memory
    sh = Shapes(model, work, cand, prof)
    kept, transient, _, _ = memory.activation_bytes(sh, cand)
    assert memory.outside_layers_bytes(sh) == 2 * model.hidden * 2 * sh.s
    assert base.memory.activations == kept - memory.outside_layers_bytes(sh) + transient
    # the loss phase does hold them: with enough of them it becomes the peak
    huge = estimate(model, H100X8, work, cand, profile=replace(prof, final=prof.final + Elems(40 * model.hidden)))
    assert any("loss phase" in n for n in huge.notes) and huge.memory.total > base.memory.total


def test_loss_tiling_lowers_memory_and_costs_time():
    eager = replace(W64K, compile_backend="eager")
    prev = _est(BASE, w=eager)
    for chunks in (2, 4, 16):
        cur = _est(replace(BASE, loss_chunks=chunks), w=eager)
        assert cur.memory.logits_loss < prev.memory.logits_loss
        assert cur.memory.total < prev.memory.total
        assert cur.time.step > prev.time.step
        prev = cur


def test_inductor_fuses_an_untiled_loss_so_two_tiles_no_longer_save_memory():
    """Untiled, Inductor's fused cross-entropy holds the bf16 logits and one fp32 tensor per logit (6 B) where the
    op-by-op loss holds 14 B; the tiles run op by op under every backend, so two tiles of 7 B per logit (plus the
    hidden-state gradient) hold more than the fused untiled loss, and four or more hold less."""
    s, vocab = W64K.seq_len // BASE.sp, LLAMA.vocab
    fused, eager = _est(BASE), _est(BASE, w=replace(W64K, compile_backend="eager"))
    assert fused.memory.logits_loss == s * vocab * (2 + 4) and eager.memory.logits_loss == s * vocab * (2 + 12)
    for other in ("aot_eager", "eager"):
        assert _est(BASE, w=replace(W64K, compile_backend=other)).memory == eager.memory
    for chunks, saves in ((2, False), (4, True), (16, True)):
        tiled = _est(replace(BASE, loss_chunks=chunks))
        assert tiled.memory == _est(replace(BASE, loss_chunks=chunks), w=replace(W64K, compile_backend="eager")).memory
        assert (tiled.memory.logits_loss < fused.memory.logits_loss) is saves
    assert fused.time == eager.time  # only memory depends on the backend


def test_untiled_logits_dwarf_a_layer_at_long_context():
    m = memory_only(LLAMA, H100X8, Workload(seq_len=200_000), replace(BASE, checkpointing="full"))
    per_layer = 200_000 / 8 * 4096 * 2
    assert m.logits_loss > 10 * per_layer


def test_offload_moves_checkpoints_to_host():
    cand = replace(BASE, checkpointing="full", mlp_chunks=4, loss_chunks=8)
    on = _est(replace(cand, offload_activations=True))
    off = _est(cand)
    assert on.memory.activations < off.memory.activations
    assert on.time.step >= off.time.step
    # A host link too slow to hide the copies makes the offload visible in the step time.
    slow = replace(H100X8, host_bandwidth=1e8)
    assert _est(replace(cand, offload_activations=True), hw=slow).time.offload > 0
    # Too little host memory: infeasible (infinite activations) with a note saying how much is needed.
    small = replace(H100X8, host_memory_bytes=1 * GIB)
    est = _est(replace(cand, offload_activations=True), hw=small)
    assert math.isinf(est.memory.activations) and not est.fits
    assert any("host memory" in n for n in est.notes)


def test_zero_stage_lowers_memory_and_stage3_costs_comm():
    mems = [_est(replace(BASE, zero_stage=z)).memory for z in range(4)]
    totals = [m.parameters + m.gradients + m.optimizer_states for m in mems]
    assert totals[0] > totals[1] > totals[2] > totals[3]
    t2, t3 = _est(replace(BASE, zero_stage=2)).time, _est(replace(BASE, zero_stage=3)).time
    assert t3.zero_comm > t2.zero_comm  # ZeRO-3 moves 1.5x the bytes of ZeRO-2 (two gathers + a reduce-scatter)
    # With little compute to hide behind (short sequences across nodes), stage 3's gathers show.
    hw = resolve_hardware("h100x16")
    short = Workload(seq_len=2048)
    z2 = estimate(LLAMA, hw, short, Candidate(sp=1, dp=16, zero_stage=2, checkpointing="full"))
    z3 = estimate(LLAMA, hw, short, Candidate(sp=1, dp=16, zero_stage=3, checkpointing="full"))
    assert z3.time.exposed_comm > z2.time.exposed_comm and z3.time.step > z2.time.step
    # stage 3 keeps gathered parameters around: more than its 2psi/N shard
    assert mems[3].parameters > 2 * LLAMA.n_params() / 8


def test_sp_degree_lowers_activation_memory():
    w = Workload(seq_len=32_768)
    hw = resolve_hardware("h100x8")
    acts = [memory_only(LLAMA, hw, w, Candidate(sp=p, zero_stage=3, checkpointing="full")).activations
            for p in (1, 2, 4, 8)]
    assert acts[0] > acts[1] > acts[2] > acts[3]


def test_dp_raises_throughput_and_shards_states():
    hw = resolve_hardware("h100x16")
    a = estimate(LLAMA, hw, W64K, replace(BASE, dp=1))
    b = estimate(LLAMA, hw, W64K, replace(BASE, dp=2))
    assert b.tokens_per_second > a.tokens_per_second
    assert b.memory.optimizer_states < a.memory.optimizer_states


def test_micro_batch_and_grad_accum():
    a = _est(BASE)
    mb = _est(replace(BASE, micro_batch=2))
    assert mb.memory.activations > a.memory.activations and mb.time.step > a.time.step
    ga = _est(replace(BASE, grad_accum=4))
    assert ga.memory.total == a.memory.total
    assert ga.time.step > a.time.step
    assert ga.tokens_per_second >= a.tokens_per_second  # per-step collectives and optimizer amortised


def test_overlap_schedules_hide_all_to_all():
    none = _est(replace(BASE, overlap="none"))
    kv = _est(replace(BASE, overlap="kv_async"))
    heads = _est(replace(BASE, overlap="head_pipeline"))
    assert none.time.attention_comm == kv.time.attention_comm == heads.time.attention_comm > 0
    assert kv.time.exposed_comm < none.time.exposed_comm
    assert heads.time.exposed_comm < none.time.exposed_comm
    assert heads.time.step < none.time.step and kv.time.step < none.time.step


def test_sp_group_spanning_nodes_pays_the_network():
    hw = resolve_hardware("h100x16")
    w = Workload(seq_len=131_072)
    inside = estimate(LLAMA, hw, w, Candidate(sp=8, dp=2, zero_stage=3, checkpointing="full"))
    across = estimate(LLAMA, hw, w, Candidate(sp=16, dp=1, zero_stage=3, checkpointing="full"))
    # per GPU the all-to-all volume is about the same (s halves, P doubles) but it now crosses InfiniBand
    assert across.time.attention_comm > 3 * inside.time.attention_comm
    assert any("spans nodes" in n for n in across.notes)


def test_full_recompute_repeats_forward_all_to_alls():
    sel = _est(replace(BASE, checkpointing="sequence"))
    full = _est(replace(BASE, checkpointing="full"))
    assert full.time.attention_comm == pytest.approx(1.5 * sel.time.attention_comm)


# --------------------------------------------------------------------------------------------------
# Ulysses communication volume
# --------------------------------------------------------------------------------------------------

def test_all_to_all_volume_is_independent_of_p_at_fixed_tokens_per_gpu():
    """Per GPU, each layer moves (2q + 2k)(P-1)/P x s x e bytes: at fixed s = S/P that is constant up to
    the (P-1)/P factor (Jacobs et al. 2023, arXiv 2309.14509) while P <= n_kv."""
    s = 16_384
    volumes = {}
    for p in (2, 4, 8):
        sh = Shapes(LLAMA, Workload(seq_len=s * p), Candidate(sp=p))
        volumes[p] = comm.ulysses_bytes_per_layer(sh) / ((p - 1) / p)
    assert volumes[2] == volumes[4] == volumes[8] == (2 * 4096 + 2 * 1024) * s * 2


def test_kv_heads_replicated_beyond_n_kv():
    """Llama-3.1-8B has 8 KV heads: at sp=16 each is sent twice, so k and v carry 16 x 128 per token."""
    sh8 = Shapes(LLAMA, Workload(seq_len=16 * 4096), Candidate(sp=8))
    sh16 = Shapes(LLAMA, Workload(seq_len=16 * 4096), Candidate(sp=16))
    assert sh8.k_eff == 8 * 128 and sh8.kv_copies == 1
    assert sh16.k_eff == 16 * 128 and sh16.kv_copies == 2
    hw = resolve_hardware("h100x16")
    e8 = estimate(LLAMA, hw, Workload(seq_len=65_536), Candidate(sp=8, dp=2, zero_stage=2))
    e16 = estimate(LLAMA, hw, Workload(seq_len=65_536), Candidate(sp=16, zero_stage=2))
    assert not any("replicated" in n for n in e8.notes)
    assert any("replicated 2x" in n for n in e16.notes)
    # the replicated K/V are bigger after the all-to-all: 2 x (16 - 8) x 128 more elements per token and layer
    assert comm.ulysses_bytes_per_layer(sh16) / (15 / 16) - comm.ulysses_bytes_per_layer(sh8) / (7 / 8) * 0.5 \
        == pytest.approx(2 * 8 * 128 * sh16.s * 2)


def test_all_to_all_time_alpha_beta():
    hw = H100X8
    buf = 1e8
    t = comm.all_to_all_time(hw, 8, buf)
    assert t == pytest.approx(hw.intra_node_latency + buf * 7 / 8 / (hw.intra_node_bandwidth * hw.comm_efficiency))
    assert comm.all_to_all_time(hw, 1, buf) == 0


# --------------------------------------------------------------------------------------------------
# Validity, padding, max context
# --------------------------------------------------------------------------------------------------

def test_invalid_candidates_raise_value_error():
    with pytest.raises(ValueError, match="query heads"):
        estimate(resolve_model("qwen2.5-7b"), H100X8, W64K, Candidate(sp=8))  # 28 heads
    with pytest.raises(ValueError, match="KV heads"):
        estimate(resolve_model("qwen2.5-7b"), H100X8, W64K, Candidate(sp=7))  # 28 heads, 4 KV heads
    with pytest.raises(ValueError, match="needs 16 GPUs"):
        estimate(LLAMA, H100X8, W64K, Candidate(sp=8, dp=2))


def test_padding_is_noted_and_counted():
    est = estimate(LLAMA, H100X8, Workload(seq_len=100_001), Candidate(sp=8, zero_stage=3))
    assert any("padded from 100001 to 100008" in n for n in est.notes)
    assert est.tokens_per_second == pytest.approx(100_001 / est.time.step)


def test_fp32_costs_more_memory_than_bf16():
    a = memory_only(LLAMA, H100X8, W64K, BASE)
    b = memory_only(LLAMA, H100X8, Workload(seq_len=65_536, dtype="fp32"), BASE)
    assert b.activations == pytest.approx(2 * a.activations, rel=0.05)
    assert b.parameters == 2 * a.parameters


def test_max_seq_len_is_the_fit_boundary():
    cand = Candidate(sp=8, zero_stage=3, checkpointing="full", mlp_chunks=8, loss_chunks=16)
    best = max_seq_len(LLAMA, H100X8, cand, multiple_of=1024)
    assert best % 1024 == 0 and best > 1_000_000
    assert fits(LLAMA, H100X8, Workload(seq_len=best), cand)
    assert not fits(LLAMA, H100X8, Workload(seq_len=best + 1024), cand)
    # offloading the checkpoints buys more context
    assert max_seq_len(LLAMA, H100X8, replace(cand, offload_activations=True), multiple_of=1024) > best


def test_estimate_never_returns_negative_or_nan():
    for policy in ("none", "selective", "sequence", "full"):
        for overlap in ("none", "kv_async", "head_pipeline"):
            est = estimate(LLAMA, H100X8, W64K, replace(BASE, checkpointing=policy, overlap=overlap))
            for value in (*vars(est.memory).values(), *vars(est.time).values(), est.tokens_per_second, est.mfu):
                assert value >= 0 and not math.isnan(value)
            assert 0 < est.mfu < 1


def test_shapes_parameter_count_matches_model_spec():
    from autosp.cost_models.catalog.models import list_models

    odd = ModelSpec(name="odd", n_layers=3, hidden=96, n_heads=6, n_kv_heads=3, head_dim=24, ffn_hidden=200,
                    vocab=1000, gated_mlp=False, tied_embeddings=True, qkv_bias=True)
    for model in list_models() + [odd, TINY]:
        sh = Shapes(model, Workload(seq_len=4096), Candidate(sp=1))
        assert sh.n_params == model.n_params() and sh.layer_params == model.layer_params(), model.name


def test_hardware_without_link_figures_does_not_crash():
    """A calibrated hardware file may lack links (zeros): communication then costs infinite time, not an error."""
    bare = HardwareSpec(name="bare", accelerator=AcceleratorSpec(name="cpu", peak_flops=1e12, memory_bytes=64 * GIB,
                                                                  memory_bandwidth=0.0), devices_per_node=2)
    est = estimate(TINY, bare, Workload(seq_len=1024), Candidate(sp=2, zero_stage=1))
    assert math.isinf(est.time.step) and est.tokens_per_second == 0 and est.mfu == 0
    single = estimate(TINY, bare, Workload(seq_len=1024), Candidate(sp=1))
    assert 0 < single.time.step < math.inf and single.tokens_per_second > 0


def test_optimizer_offload_moves_states_to_host_and_costs_step_time():
    model, hw = resolve_model("llama-3.1-8b"), resolve_hardware("h100")
    work = Workload(seq_len=65536)
    base = Candidate(sp=1, zero_stage=2, checkpointing="full", loss_chunks=8)
    off = replace(base, offload_optimizer=True)
    on_device, offloaded = estimate(model, hw, work, base), estimate(model, hw, work, off)
    assert offloaded.memory.optimizer_states == 0 and offloaded.memory.gradients == 0
    assert on_device.memory.optimizer_states == 12 * model.n_params()
    assert offloaded.time.offload > 0 and offloaded.time.step > on_device.time.step
    # ALST trains Llama-3.1-8B on one H100 only with the optimizer offloaded: so must we
    assert max_seq_len(model, hw, replace(base, offload_optimizer=False), multiple_of=1024) == 0
    assert max_seq_len(model, hw, off, multiple_of=1024) > 0


def test_optimizer_offload_needs_zero():
    with pytest.raises(ValueError, match="zero_stage"):
        Candidate(sp=1, zero_stage=0, offload_optimizer=True)


def test_a_head_kept_for_a_tiled_loss_is_counted_once_under_zero3():
    """With the loss tiled, ZeRO-3 keeps the LM head's matrix resident (compiler/zero3.py): the gathered set at the
    peak is a layer (and its prefetch) plus the resident matrix once, tied or not (the input embedding is gathered
    only by the forward's first op and the backward's last, when no activation is held)."""
    cand = Candidate(sp=8, zero_stage=3, checkpointing="full", loss_chunks=4)
    for name in ("qwen3-0.6b", "llama-3.2-1b", "qwen3-8b"):  # tied, tied, untied; V x h larger than one layer
        model = resolve_model(name)
        sh = Shapes(model, Workload(seq_len=131_072), cand)
        assert sh.lm_head_params > sh.layer_params
        small = sh.L * sh.prof.layer_small_params + sh.prof.other_small_params
        layer_and_prefetch = min(sh.layer_params + min(ds.STAGE3_PREFETCH_BUCKET_SIZE, sh.layer_params),
                                 max(ds.STAGE3_MAX_LIVE_PARAMETERS, sh.layer_params))
        assert memory.zero3_gathered_params(sh, True) == layer_and_prefetch + small + sh.head_matmul_params
        # untiled: the head is gathered on demand as the largest module, and not kept
        assert memory.zero3_gathered_params(sh, False) == (
            min(sh.lm_head_params + min(ds.STAGE3_PREFETCH_BUCKET_SIZE, sh.layer_params),
                max(ds.STAGE3_MAX_LIVE_PARAMETERS, sh.lm_head_params)) + small)
