"""The cost model's sequence-chunk terms (``sequence_chunks``, ``offload_chunks``): per-chunk working set, what
stays full-length, host memory, host<->device traffic and its overlap, chunked attention's block speed, against
hand-computed expectations (docs/cost_model.md, "Sequence-chunked layers")."""

import math
from dataclasses import replace

import pytest

from autosp.cost_models import chunks, comm, memory, ring
from autosp.cost_models.estimate import estimate, max_seq_len
from autosp.cost_models.shapes import Shapes
from autosp.contract.specs import Candidate, Workload
from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.cost_models.catalog.models import resolve_model
from round_specs import GIB, TINY
from round_specs import ROUND as SHARED_ROUND

LLAMA = resolve_model("llama-3.1-8b")
ROUND = replace(SHARED_ROUND, nodes=1)  # one node of two devices
FULL = Candidate(sp=1, checkpointing="full")
KEPT = Candidate(sp=1, checkpointing="none")   # a chunked layer kept like attention
W1K = Workload(seq_len=1024)


def test_one_chunk_is_todays_model_bit_for_bit():
    """sequence_chunks = 1 prices exactly what the model priced before chunking existed (Llama-3.1-8B at 200k on
    h100x8; values computed on the published-runs branch, which has the same cost model without chunking and priced
    attention at FlashAttention-2's efficiency: that kernel pinned here, the H100 default is now cuDNN's). One change
    since, on purpose: the first case tiles its MLP, and the weight gradients a tiled MLP's chunks add into
    (memory.tiled_weight_grad_bytes) now add 0.34 GiB to its backward phase; and the third offloads its optimizer,
    whose step is now priced as DeepSpeed runs it (cost_models/optimizer_offload.py: the clip scale and the weight
    cast on the host, the gradients down in fp32): +0.31 s; and the first case's peak, the layers' backward, no longer
    holds the final norm's input and output, which that norm's backward frees before any layer's
    (memory.outside_layers_bytes): -0.40 GiB; and, with its loss tiled under ZeRO-3, the LM head it keeps gathered
    is counted once, not again as the largest module gathered on demand (memory.zero3_gathered_params): -0.60 GiB."""
    from autosp.cost_models.catalog.attention_kernels import with_kernel

    hw = with_kernel(resolve_hardware("h100x8"), "flash2")
    cases = [
        (Candidate(sp=8, zero_stage=3, checkpointing="full", mlp_chunks=8, loss_chunks=16, offload_activations=True,
                   overlap="head_pipeline"), 22985763958.4, 20.783549584755196),
        (Candidate(sp=8, ring=2, zero_stage=1, checkpointing="selective", overlap="kv_async"),
         163834287104.0, 15.990501205899351),
        (Candidate(sp=4, dp=2, zero_stage=2, checkpointing="none", offload_optimizer=True),
         409783135232.0, 32.545386287562344),
    ]
    for cand, total, step in cases:
        est = estimate(LLAMA, hw, Workload(seq_len=200_000, compile_backend="eager"), cand)  # priced op by op then
        assert est.memory.total == total and est.time.step == step
        sh = Shapes(LLAMA, Workload(seq_len=200_000), cand)
        assert (sh.N, sh.c) == (1, sh.s)
        assert chunks.compute_factor(sh) == ring.compute_factor(sh)


def _hand_chunk_bytes():
    """TINY in bf16, per token (analytic profile), the ``full`` policy's phases of one chunk's recomputed layer:
    MLP phase = n1, q, k, v, O, O', h1, n2 (3h + 3q + 2k) + the MLP intermediates a fused SwiGLU keeps (3f) + its
    gradient (f) (docs/cost_model.md section 12), x 2 bytes, + 24 fp32 bytes; attention phase = n1, q, k, v, O (h + 2q + 2k) + dO, dq, the fp32 dq
    accumulator (4q) and the chunk's dk, dv (2k), x 2, + 24."""
    h, q, k, f = 64, 64, 32, 128
    mlp = (3 * h + 3 * q + 2 * k + 3 * f + f) * 2 + 24
    attn = (h + 2 * q + 2 * k + 4 * q + 2 * k) * 2 + 24
    return mlp, attn


WEIGHT_GRADS = (4 + 2) * TINY.layer_params()  # one layer's fp32 weight-gradient accumulators + one chunk's (bf16)


@pytest.mark.parametrize("n", [2, 4, 8, 3])
def test_chunked_transient_is_full_length_residuals_and_accumulators_plus_one_chunk(n):
    sh = Shapes(TINY, W1K, replace(FULL, sequence_chunks=n))
    mlp, attn = _hand_chunk_bytes()
    assert mlp > attn
    s, c = 1024, math.ceil(1024 / n)
    assert sh.c == c
    residual = 2 * 64 * 2                 # the layer's output and input gradients, full-length
    state = 64 * 4                        # fp32 dK/dV accumulators (2k' = 64)
    assert chunks.transient_bytes(sh, 1, offload=False) == s * (residual + state) + c * mlp + WEIGHT_GRADS
    # offloaded: the accumulators shrink to two chunks, plus two K/V chunks
    assert chunks.transient_bytes(sh, 1, offload=True) == s * residual + 2 * c * 64 * (2 + 4) + c * mlp + WEIGHT_GRADS


def test_a_chunked_layer_is_kept_like_attention_unless_the_policy_is_full():
    """none / selective / sequence: x (h), K and V (2k'), the attention output (q) in bf16 and the fp32 log-sum-exp
    (4 per head); full: only x, the checkpoint."""
    per_token = (64 + 64 + 64) * 2 + 4 * 4
    for policy in ("none", "selective", "sequence"):
        cand = Candidate(sp=1, checkpointing=policy, sequence_chunks=4)
        sh = Shapes(TINY, W1K, cand)
        assert chunks.saved_bytes_per_token(sh) == per_token
        assert memory.activation_bytes(sh, cand)[2] == 1024 * per_token
    full = replace(FULL, sequence_chunks=4)
    assert memory.activation_bytes(Shapes(TINY, W1K, full), full)[2] == 1024 * 64 * 2


def test_device_memory_falls_with_the_chunk_count_as_the_formula_says():
    totals = {}
    per_layer = 1024 * ((64 + 64 + 64) * 2 + 16)
    mlp, _ = _hand_chunk_bytes()
    final = 2 * 64 * 2 * 1024     # the final norm's input and output stay full-length
    for n in (2, 4, 8, 16):
        cand = replace(KEPT, sequence_chunks=n, offload_chunks=True)
        kept, transient, layer, host = memory.activation_bytes(Shapes(TINY, W1K, cand), cand)
        totals[n] = kept + transient
        assert layer == per_layer
        assert kept == 2 * per_layer / n + final
        assert transient == 1024 * 2 * 64 * 2 + 2 * (1024 // n) * 64 * 6 + (1024 // n) * mlp + WEIGHT_GRADS
    values = [totals[n] for n in (2, 4, 8, 16)]
    assert values == sorted(values, reverse=True) and len(set(values)) == 4


def test_host_bytes_hold_every_layers_saved_set_and_one_layers_accumulators():
    cand = replace(KEPT, sequence_chunks=4, offload_chunks=True)
    sh = Shapes(TINY, W1K, cand)
    per_layer = 1024 * ((64 + 64 + 64) * 2 + 16)
    expected = 2 * per_layer + 1024 * 64 * 4       # L layers' kept chunks + the fp32 dK/dV accumulators
    assert chunks.host_bytes(sh, per_layer) == expected
    _kept, _t, _p, host = memory.activation_bytes(sh, cand)
    assert host == expected
    assert estimate(TINY, ROUND, W1K, cand).host_bytes == expected


def test_under_full_only_inputs_are_kept_and_one_layers_chunks_come_back():
    layer_set = 1024 * ((64 + 64 + 64) * 2 + 16)
    x = 1024 * 64 * 2
    final = 2 * 64 * 2 * 1024
    acc = 1024 * 64 * 4
    base = replace(FULL, sequence_chunks=4)
    plain_transient = chunks.transient_bytes(Shapes(TINY, W1K, base), 1, offload=False)
    kept, transient, per_layer, host = memory.activation_bytes(Shapes(TINY, W1K, base), base)
    assert (kept, per_layer, host) == (2 * x + final, x, 0.0)
    assert transient == plain_transient + layer_set            # the re-run chunked forward keeps its set
    both = replace(base, offload_chunks=True, offload_activations=True)
    kept, transient, per_layer, host = memory.activation_bytes(Shapes(TINY, W1K, both), both)
    off_transient = chunks.transient_bytes(Shapes(TINY, W1K, both), 1, offload=True)
    assert kept == min(2, TINY.n_layers) * x + final
    assert transient == off_transient + 2 * layer_set / 4       # two chunks of that layer's set on the device
    assert host == 2 * x + layer_set + acc                      # every checkpoint, one layer's set, accumulators


def test_a_plan_needing_more_host_memory_than_the_node_has_does_not_fit():
    cand = replace(FULL, sequence_chunks=4, offload_chunks=True)
    need = estimate(TINY, ROUND, W1K, cand).host_bytes
    small = replace(ROUND, host_memory_bytes=need * ROUND.devices_per_node / memory.HOST_USABLE_FRACTION * 0.99)
    est = estimate(TINY, small, W1K, cand)
    assert not est.fits and math.isinf(est.memory.activations)
    assert any("host memory" in n for n in est.notes)
    enough = replace(small, host_memory_bytes=small.host_memory_bytes / 0.98)
    assert estimate(TINY, enough, W1K, cand).fits


def test_chunked_layers_recompute_everything_but_attention():
    from autosp.cost_models import flops
    w = Workload(seq_len=131_072)
    chunked = Candidate(sp=8, sequence_chunks=4)
    sh = Shapes(LLAMA, w, chunked)
    matmul, attention = flops.recompute_flops(sh, chunked)
    assert attention == 0.0 and matmul == 2.0 * sh.s * sh.L * sh.layer_matmul_params
    full = Candidate(sp=8, checkpointing="full")
    assert flops.recompute_flops(Shapes(LLAMA, w, full), full)[0] == matmul
    # under full the chunked layer is re-run first, attention included, then recomputes its layer again
    twice = Candidate(sp=8, checkpointing="full", sequence_chunks=4)
    m2, a2 = flops.recompute_flops(Shapes(LLAMA, w, twice), twice)
    assert m2 == 2 * matmul and a2 == flops.attention_flops_forward(Shapes(LLAMA, w, twice))


def test_offload_traffic_per_pass():
    cand = replace(FULL, sequence_chunks=2, offload_chunks=True)
    sh = Shapes(TINY, W1K, cand)
    per_layer = 1024 * ((64 + 64 + 64) * 2 + 16)
    c = 512
    kv, acc = c * 64 * 2, c * 64 * 4
    fwd_h2d, fwd_d2h, bwd_h2d, bwd_d2h = chunks.offload_pass_bytes(sh, per_layer)
    assert fwd_h2d == 1 * kv and fwd_d2h == per_layer                 # chunk 1 reads chunk 0's K/V
    # backward: the kept chunks but their K/V come back; pairs (1,0), (1,1), (0,0) read K/V and accumulators
    assert bwd_h2d == per_layer - 1024 * 64 * 2 + 3 * (kv + acc)
    assert bwd_d2h == 3 * acc                                         # accumulators back


def test_transfer_seconds_takes_the_slower_direction_or_the_hosts_dram():
    assert chunks.transfer_seconds(10.0, 4.0, link=2.0, dram_per_gpu=100.0) == 5.0
    assert chunks.transfer_seconds(10.0, 10.0, link=2.0, dram_per_gpu=2.0) == 10.0
    assert chunks.transfer_seconds(0.0, 0.0, link=0.0, dram_per_gpu=0.0) == 0.0
    assert chunks.transfer_seconds(1.0, 0.0, link=0.0, dram_per_gpu=1.0) == math.inf


def test_copies_hide_under_compute_except_the_first_chunk():
    cand = replace(FULL, sequence_chunks=4, offload_chunks=True)
    sh = Shapes(TINY, W1K, cand)
    per_layer = 1024 * ((64 + 64 + 64) * 2 + 16)
    copies, exposed = chunks.offload_exposed(sh, per_layer, 1.0, 1.0, link=1e9, dram_per_gpu=1e12)
    assert copies < 1.0 and exposed == pytest.approx(per_layer / 4 / 1e9)
    _c, slow = chunks.offload_exposed(sh, per_layer, 0.0, 0.0, link=1e9, dram_per_gpu=1e12)
    assert slow == pytest.approx(copies + per_layer / 4 / 1e9)


def test_slow_host_link_shows_up_in_the_step_time():
    cand = replace(FULL, sequence_chunks=4, offload_chunks=True)
    fast = estimate(TINY, ROUND, W1K, cand)
    slow = estimate(TINY, replace(ROUND, host_bandwidth=1e6), W1K, cand)
    assert slow.time.offload > fast.time.offload and slow.time.step > fast.time.step


def test_chunked_attention_block_speed():
    sh = Shapes(LLAMA, Workload(seq_len=65_536), Candidate(sp=8, sequence_chunks=8))
    n = sh.S_pad / 8
    base = ring.kernel_speed(sh.S_pad, ring.CAUSAL_HALF_TOKENS)
    diag = ring.kernel_speed(n, ring.CAUSAL_HALF_TOKENS) / base
    off = min(1.0, ring.kernel_speed(n, ring.FULL_HALF_TOKENS) / base)
    assert chunks.compute_factor(sh) == pytest.approx((1 / diag + 7 / off) / 8)
    factors = [chunks.compute_factor(Shapes(LLAMA, Workload(seq_len=65_536), Candidate(sp=8, sequence_chunks=n)))
               for n in (1, 4, 16, 64)]
    assert factors[0] == 1.0 and factors == sorted(factors) and factors[-1] > 1.05
    long = Shapes(LLAMA, Workload(seq_len=8_000_000), Candidate(sp=8, sequence_chunks=64))
    assert chunks.compute_factor(long) < 1.005       # 125k-token blocks: as fast as the whole sequence
    ringed = Shapes(LLAMA, Workload(seq_len=65_536), Candidate(sp=8, ring=2, sequence_chunks=4))
    assert chunks.compute_factor(ringed) > ring.compute_factor(Shapes(LLAMA, Workload(seq_len=65_536),
                                                                      Candidate(sp=8, ring=2)))



def test_chunked_attention_on_packed_documents_runs_at_the_slower_of_the_two_cuts():
    """Short documents already cut attention into short kernels: chunking adds (almost) nothing on top, so the
    factor is the documents' own; with one document per sequence it is the chunks'."""
    def factor(chunks_n, doc_lens=()):
        return chunks.compute_factor(Shapes(LLAMA, Workload(seq_len=1_048_576, doc_lens=doc_lens),
                                            Candidate(sp=8, sequence_chunks=chunks_n)))

    short = ((2048, 512),)  # 512 documents of 2k tokens
    assert factor(16, short) == pytest.approx(factor(1, short)) and factor(1, short) > factor(16)
    whole = ((1_048_576, 1),)  # one document: the chunk factor, as without documents
    assert factor(16, whole) == pytest.approx(max(factor(16), factor(1, whole)))
    assert factor(16, whole) >= factor(16)

def test_all_to_all_and_ring_pay_one_latency_per_chunk():
    hw = resolve_hardware("h100x8")
    one = comm.ulysses_layer_times(hw, Shapes(LLAMA, Workload(seq_len=131_072), Candidate(sp=8)))
    four = comm.ulysses_layer_times(hw, Shapes(LLAMA, Workload(seq_len=131_072), Candidate(sp=8, sequence_chunks=4)))
    for a, b in zip(one, four):
        assert b - a == pytest.approx(3 * hw.intra_node_latency)
    r1 = ring.transfer_times(hw, Candidate(sp=8, ring=4), Shapes(LLAMA, Workload(seq_len=131_072), Candidate(sp=8, ring=4)))
    c4 = Candidate(sp=8, ring=4, sequence_chunks=4)
    r4 = ring.transfer_times(hw, c4, Shapes(LLAMA, Workload(seq_len=131_072), c4))
    assert r4[0] - r1[0] == pytest.approx(3 * hw.intra_node_latency)


def test_all_to_all_staging_is_one_chunk():
    hw = resolve_hardware("h100x8")
    w = Workload(seq_len=131_072)
    one = memory.a2a_buffer_bytes(Shapes(LLAMA, w, Candidate(sp=8)))
    four = memory.a2a_buffer_bytes(Shapes(LLAMA, w, Candidate(sp=8, sequence_chunks=4)))
    assert four == one / 4 and hw.world_size == 8


def test_max_context_with_chunk_offload_on_one_gpu_and_where_host_memory_binds():
    """One H100 (a whole node's host memory): chunk offload takes the context well past ALST's recipe (1.61M tokens
    against 680K; 582K before the final norm's tensors left the layers' backward, memory.outside_layers_bytes: the
    recipe's peak is a layer's backward, the chunked plan's the loss phase). Eight: the node's host memory binds
    first, since a chunked layer parks its K/V and attention output there too, not just its input (20.6 KB against
    8 KB per token and layer for Llama-3.1-8B)."""
    base = Candidate(sp=1, zero_stage=2, checkpointing="full", mlp_chunks=16, loss_chunks=64, offload_optimizer=True,
                     offload_activations=True)
    chunked = replace(base, checkpointing="none", offload_activations=False, mlp_chunks=1, loss_chunks=128,
                      sequence_chunks=64, offload_chunks=True)
    one = resolve_hardware("h100")
    assert max_seq_len(LLAMA, one, chunked, multiple_of=8192) > 2.2 * max_seq_len(LLAMA, one, base, multiple_of=8192)
    eight = resolve_hardware("h100x8")
    base8, chunked8 = replace(base, sp=8, zero_stage=3), replace(chunked, sp=8, zero_stage=3)
    longest = max_seq_len(LLAMA, eight, chunked8, multiple_of=8192)
    est = estimate(LLAMA, eight, Workload(seq_len=longest + 8192), chunked8)
    assert any("host memory" in n for n in est.notes)              # host memory, not the GPU, stops it
    assert longest < max_seq_len(LLAMA, eight, base8, multiple_of=8192)


def test_offload_chunks_needs_sequence_chunks():
    with pytest.raises(ValueError, match="needs sequence_chunks > 1"):
        Candidate(sp=1, offload_chunks=True)
    with pytest.raises(ValueError, match="sequence_chunks must be a positive integer"):
        Candidate(sp=1, sequence_chunks=0)
