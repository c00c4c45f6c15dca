"""Packed documents and sliding windows in the cost model (cost_models/documents.py, docs/cost_model.md
"Documents and sliding windows"): exact formulas on small cases, the closed-form expectation against direct
enumeration and a simulated stream, and what the estimate does (and does not) change."""

import random
from dataclasses import replace

import pytest

from autosp.cost_models import documents, estimate, flops, memory_only, ring
from autosp.cost_models.documents import attention_pricing, cell_moments, compact_histogram, piece_moments
from autosp.cost_models.shapes import Shapes
from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.cost_models.catalog.models import resolve_model
from autosp.contract.specs import Candidate, ModelSpec, Workload, workload_key

S = 1024
LLAMA = resolve_model("llama-3.1-8b")
H100 = resolve_hardware("h100x8")
TINY = ModelSpec(name="tiny", n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_hidden=128, vocab=256)


def share(doc_lens, seq=S, window=0):
    return cell_moments(tuple(doc_lens), seq, window)[0] / seq ** 2


# --- exact small cases -----------------------------------------------------------------------------------

def test_one_document_is_the_whole_triangle():
    assert cell_moments(((S, 1),), S) == (S * S, S)
    assert share([(S, 7)]) == 1.0
    assert share([(3 * S, 2)]) == 1.0            # a document of 3 sequences fills each of them


@pytest.mark.parametrize("k", [2, 4, 16, 1024])
def test_k_equal_documents_are_one_kth_of_the_triangle(k):
    assert share([(S // k, 5)]) == pytest.approx(1 / k, rel=1e-15)


def test_a_window_prices_the_band():
    """Each query sees the W most recent keys: W^2 for the first W queries' triangle, then W per query:
    2 S W - W^2 of the S^2 units; a window at least S long changes nothing."""
    for W in (1, 64, 300, S - 1):
        assert share([(S, 1)], window=W) == (2 * S * W - W * W) / S ** 2
    assert share([(S, 1)], window=S) == share([(S, 1)], window=4 * S) == 1.0
    assert piece_moments(10, 4) == (2 * 10 * 4 - 16, 2 * 10 - 4)
    assert piece_moments(3, 4) == (9, 3)


def test_documents_shorter_than_the_window_ignore_it():
    assert share([(S // 8, 1)], window=S // 4) == share([(S // 8, 1)]) == 1 / 8


def _enumerated(doc_lens, seq, window):
    """The mean over every offset lattice point, summed directly (no closed form)."""
    from math import gcd

    g = seq
    for length, _ in doc_lens:
        g = gcd(g, length)
    total = sum(count * sum(documents._document_sum(length, j * g, seq, window)[0] for j in range(1, seq // g + 1))
                for length, count in doc_lens)
    tokens = sum(length * count for length, count in doc_lens)
    return total * seq / ((seq // g) * tokens)


@pytest.mark.parametrize("doc_lens,window", [
    (((100, 3), (37, 1), (700, 2)), 0), (((100, 3), (37, 1), (700, 2)), 50), (((3000, 1), (50, 5)), 300),
    (((1500, 1),), 200), (((1, 4), (1024, 1), (2047, 1)), 0), (((512, 1), (1536, 2)), 700),
])
def test_the_closed_form_equals_direct_enumeration(doc_lens, window):
    assert cell_moments(doc_lens, S, window)[0] == pytest.approx(_enumerated(doc_lens, S, window), rel=1e-12)


def test_the_expectation_matches_a_simulated_stream():
    """Documents drawn from the histogram, laid end to end, cut every S tokens: the mean share over 20,000
    sequences is the closed form's within 0.5%."""
    hist, W = ((100, 3), (37, 1), (700, 2), (3000, 1)), 300
    rnd = random.Random(0)
    pool = [length for length, count in hist for _ in range(count)]
    work = {0: 0, W: 0}
    cur = sequences = 0
    while sequences < 20_000:
        left = rnd.choice(pool)
        while left:
            piece = min(left, S - cur)
            for w in work:
                work[w] += piece_moments(piece, w)[0]
            left, cur = left - piece, cur + piece
            if cur == S:
                cur, sequences = 0, sequences + 1
    for w in work:
        assert work[w] / sequences / S ** 2 == pytest.approx(share(hist, window=w), rel=5e-3)


def test_kernel_time_follows_document_length():
    """Kernels run per document: time = work + n_half x length, so short documents cost more per FLOP."""
    half = ring.CAUSAL_HALF_TOKENS
    one = attention_pricing(((S, 1),), S, S, 0, 1, 1.0, 1.0, half)
    assert (one.work, one.steps) == (1.0, (1.0,))
    short = attention_pricing(((64, 1),), S, S, 0, 1, 1.0, 1.0, half)
    assert short.work == 1 / 16
    assert short.steps[0] / short.work == pytest.approx((1 + half / 64) / (1 + half / S))


def test_large_histograms_are_binned_keeping_tokens():
    counts = {length: 1 + length % 3 for length in range(1, 20_000)}
    hist = compact_histogram(counts)
    assert len(hist) <= documents.MAX_BINS
    tokens = sum(l * c for l, c in counts.items())
    assert sum(l * c for l, c in hist) == pytest.approx(tokens, rel=1e-3)
    assert sum(c for _, c in hist) == sum(counts.values())
    exact = sum(c * l * l for l, c in counts.items())
    assert sum(c * l * l for l, c in hist) == pytest.approx(exact, rel=2e-3)


# --- the estimate ----------------------------------------------------------------------------------------

def test_unpacked_and_one_document_per_sequence_price_the_same():
    cand = Candidate(sp=8, zero_stage=3, checkpointing="full")
    plain = estimate(LLAMA, H100, Workload(131_072), cand)
    whole = estimate(LLAMA, H100, Workload(131_072, doc_lens=((131_072, 9),)), cand)
    assert whole.time.step == pytest.approx(plain.time.step, rel=1e-12)
    assert whole.flops_per_step == pytest.approx(plain.flops_per_step, rel=1e-12)


def test_packing_cuts_attention_flops_and_time_not_memory():
    cand = Candidate(sp=8, zero_stage=3, checkpointing="selective", loss_chunks=8, mlp_chunks=2)
    plain_w, packed_w = Workload(1_048_576), Workload(1_048_576, doc_lens=((16_384, 1),))
    sh_plain, sh_packed = Shapes(LLAMA, plain_w, cand), Shapes(LLAMA, packed_w, cand)
    assert flops.attention_flops_forward(sh_packed) == pytest.approx(flops.attention_flops_forward(sh_plain) / 64)
    assert memory_only(LLAMA, H100, packed_w, cand) == memory_only(LLAMA, H100, plain_w, cand)
    plain, packed = estimate(LLAMA, H100, plain_w, cand), estimate(LLAMA, H100, packed_w, cand)
    assert packed.memory == plain.memory
    assert packed.time.step < plain.time.step / 5   # attention dominates a 1M-token step
    # model FLOPs (MFU) count only the attention the documents need
    matmul = 6.0 * 1_048_576 * Shapes(LLAMA, plain_w, cand).dense_params
    att_plain, att_packed = plain.flops_per_step - matmul, packed.flops_per_step - matmul
    assert att_packed == pytest.approx(att_plain / 64, rel=1e-9)


def test_ring_unpacked_is_todays_pricing():
    for R in (2, 4, 8):
        sh = Shapes(LLAMA, Workload(65_536), Candidate(sp=8, ring=R))
        diag, off = ring.block_speeds(sh)
        work, steps = ring.attention_steps(sh)
        assert work == 1.0 and len(steps) == R
        assert ring.compute_factor(sh) == pytest.approx((1 / diag + (R - 1) / off) / R, rel=1e-12)
        # one document per sequence, priced through the document path, is the same ring
        one = Shapes(LLAMA, Workload(65_536, doc_lens=((65_536, 1),)), Candidate(sp=8, ring=R))
        assert ring.attention_steps(one) == (1.0, pytest.approx(steps, rel=1e-12))


def test_ring_with_short_documents_does_its_work_at_step_zero():
    """Documents much shorter than a zigzag chunk never cross chunks: step 0 (the rank's own K/V) holds
    nearly all the work, the other steps almost none, so the K/V blocks travel with little to hide under."""
    cand = Candidate(sp=8, ring=4)
    sh = Shapes(LLAMA, Workload(1_048_576, doc_lens=((4096, 1),)), cand)
    work, steps = ring.attention_steps(sh)
    assert work == pytest.approx(4096 / 1_048_576)
    assert steps[0] > 50 * steps[1]
    long_docs = Shapes(LLAMA, Workload(1_048_576, doc_lens=((1_048_576, 1),)), cand)
    _, even = ring.attention_steps(long_docs)
    assert even[1] == pytest.approx(even[2]) and 0.5 < even[0] / even[1] < 2
    hw = resolve_hardware("h100x8")
    # a second of attention hides every transfer when it is spread over the steps, not when step 0 has it all
    fwd, exposed, _, _ = ring.layer_times(hw, cand, sh, 1.0, 2.5)
    fwd_long, exposed_long, _, _ = ring.layer_times(hw, cand, long_docs, 1.0, 2.5)
    t_kv, _ = ring.transfer_times(hw, cand, sh)
    assert fwd == fwd_long and exposed_long == 0.0 and exposed == pytest.approx(2 * t_kv, rel=0.01)


def test_windowed_layers_are_priced_by_their_window():
    W, L = 4096, LLAMA.n_layers
    half_windowed = replace(LLAMA, sliding_window=W, sliding_layers=tuple(range(0, L, 2)))
    cand = Candidate(sp=8)
    S_ = 131_072
    sh = Shapes(half_windowed, Workload(S_), cand)
    work, _ = ring.attention_steps(sh)
    assert work == pytest.approx((1 + (2 * S_ * W - W * W) / S_ ** 2) / 2, rel=1e-12)
    full = Shapes(LLAMA, Workload(S_), cand)
    assert flops.attention_flops_forward(sh) == pytest.approx(work * flops.attention_flops_forward(full))
    # windows and documents together: documents shorter than the window are unaffected by it
    both = Shapes(half_windowed, Workload(S_, doc_lens=((2048, 1),)), cand)
    assert ring.attention_steps(both)[0] == pytest.approx(2048 / S_)


def test_mistral_v01_has_its_window_and_the_others_none():
    mistral = resolve_model("mistral-7b-v0.1")
    assert mistral.sliding_window == 4096 and mistral.sliding_layers == tuple(range(32))
    for name in ("mistral-7b", "llama-3.1-8b", "qwen2.5-7b", "llama-3.2-1b"):
        assert resolve_model(name).sliding_window == 0
    # the fields windows added leave the fingerprints of unwindowed models as they were
    assert LLAMA.fingerprint() == "b5e106fddb6beb60"
    assert resolve_model("qwen2.5-7b").fingerprint() == "86bae4638f5d6341"
    assert mistral.fingerprint() != replace(mistral, sliding_window=0, sliding_layers=()).fingerprint()


@pytest.mark.parametrize("kwargs,match", [
    (dict(sliding_window=-1), "non-negative"), (dict(sliding_window=8), "go together"),
    (dict(sliding_layers=(0,)), "go together"), (dict(sliding_window=8, sliding_layers=(4,)), r"\[0, 4\)"),
    (dict(sliding_window=8, sliding_layers=(1, 0)), "increasing"),
])
def test_window_fields_are_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        replace(TINY, **kwargs)


def test_workload_doc_lens_round_trip_and_validation():
    w = Workload(8192, doc_lens=[[100, 2], [4000, 1]])   # as JSON gives it
    assert w.doc_lens == ((100, 2), (4000, 1)) and hash(w)
    assert workload_key(Workload(8192)) == {"seq_len": 8192, "global_batch": None, "dtype": "bf16",
                                            "optimizer": "adamw"}
    assert workload_key(w)["doc_lens"] == [[100, 2], [4000, 1]]
    for bad in ([[0, 1]], [[5, 1], [5, 2]], [[9, 1], [5, 1]], [[5]], [[5, True]]):
        with pytest.raises(ValueError, match="doc_lens"):
            Workload(8192, doc_lens=bad)
