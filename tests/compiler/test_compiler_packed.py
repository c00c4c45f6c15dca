"""Packed documents and sliding windows under SP == one process running every document on its own.

One spawned world-4 job runs every case: each builds an engine, trains 3 optimizer steps on packed full
batches (Hugging Face convention: position_ids restarting at 0 per document, labels -100 at each
document's first token; or the same documents as ``seq_lens`` / ``cu_seq_lens``), and rank 0 compares the
loss of every step, every gradient of the first step and every weight after the last with one process
that runs each document separately through a copy of the model and weights each document's loss by its
targets (:func:`autosp.compiler.testing.packed_loss`), fp32, relative 1e-5. The documents have uneven
lengths, include documents of one token and cross the shard boundary of every rank (and the zigzag chunks
of a ring). Two cases record the compiled joint graphs to prove no tensor has two sequence-sized
dimensions.
"""

from __future__ import annotations

import pytest
import torch

from test_compiler_exact import TOL, VOCAB, Z3, hf_model, reference_llama, sgd  # noqa: E402

from autosp.compiler.testing import assert_within
from autosp.contract.specs import Candidate

SEQ = 32
# documents per row and step: every rank boundary of SP=4 (8, 16, 24) and of SP=2 (16) lies inside a
# document, documents of one token, the last row different from the first (rows run separately)
PACKINGS = [
    [[5, 1, 7, 9, 1, 6, 3], [12, 1, 19]],
    [[1, 10, 10, 11], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2]],
    [[32], [9, 9, 9, 1, 4]],
]
SHAPES_SEQ = 48  # the shape-checked cases: s = 12, blocks of 24, S = 48 (no model dimension is one of them)
SHAPES_PACKINGS = [[[7, 1, 9, 10, 1, 10, 10]], [[20, 1, 27]], [[48]]]  # crossing 12, 24 and 36


def packed_batches(rows=2, seq=SEQ, form="position_ids", packings=PACKINGS, trim=0):
    """Full batches of packed documents; ``trim`` drops the last tokens (S % P != 0: the runtime pads)."""
    from autosp.compiler.attention.documents import position_ids_from_spans, spans_from_seq_lens

    gen = torch.Generator().manual_seed(3)
    out = []
    for packing in packings:
        lens = [list(packing[r % len(packing)]) for r in range(rows)]
        if trim:
            for row in lens:
                row[-1] -= trim
        n = seq - trim
        ids = torch.randint(0, VOCAB, (rows, n), generator=gen)
        labels = ids.clone()
        spans = [spans_from_seq_lens(row, n) for row in lens]
        for r, row in enumerate(spans):
            for a, _ in row:
                labels[r, a] = -100  # the convention: no target crosses into a document
        labels[0, 20:23] = -100      # and some ignored targets
        batch = {"input_ids": ids, "labels": labels}
        if form == "position_ids":
            batch["position_ids"] = torch.stack([position_ids_from_spans(row) for row in spans])
        elif form == "seq_lens":
            batch["seq_lens"] = lens
        else:  # cu_seq_lens over the flattened batch
            bounds = [0]
            for row in lens:
                for length in row:
                    bounds.append(bounds[-1] + length)
            batch["cu_seq_lens"] = torch.tensor(bounds)
        out.append(batch)
    return out


def mistral(window=5):
    return hf_model("mistral", sliding_window=window)


def qwen2_mixed(window=6):
    return hf_model("qwen2", use_sliding_window=True, sliding_window=window, max_window_layers=1)


# name -> (model factory, batch kwargs, sp_run's plan= and options)
EXACT = {
    # Ulysses SP=4, two rows packed differently, KV heads replicated (2 KV heads on 4 ranks)
    "llama_sp4_rows": (reference_llama, dict(), dict(plan=Candidate(sp=4, micro_batch=2))),
    # SP=2 x DP=2, ZeRO-1, documents given as seq_lens, S % P != 0 (31 tokens, padded)
    "llama_sp2_dp2_zero1_seq_lens_pad": (reference_llama, dict(form="seq_lens", trim=1),
                                         dict(plan=Candidate(sp=2, dp=2, zero_stage=1, micro_batch=1))),
    # ZeRO-3, SP 2 x DP 2: layers are graph fragments
    "llama_sp2_dp2_zero3": (reference_llama, dict(), dict(plan=Candidate(sp=2, dp=2, zero_stage=3, micro_batch=1),
                                                          ds_config=Z3)),
    # HF Llama, U 2 x R 2 ring (documents cross the zigzag chunks), cu_seq_lens; joint graphs shape-checked
    "hf_llama_u2r2_cu_seq_lens_shapes": (lambda: hf_model("llama"),
                                         dict(rows=1, form="cu_seq_lens", seq=SHAPES_SEQ, packings=SHAPES_PACKINGS),
                                         dict(plan=Candidate(sp=4, ring=2, micro_batch=1))),
    # HF Mistral, sliding window 5 < S, SP=4 (the window crosses shard boundaries); shapes checked
    "hf_mistral_window5_sp4_shapes": (mistral, dict(rows=1, seq=SHAPES_SEQ, packings=SHAPES_PACKINGS),
                                      dict(plan=Candidate(sp=4, micro_batch=1))),
    # HF Mistral window 5 on a U 2 x R 2 ring: the window crosses ring blocks
    "hf_mistral_window5_u2r2": (mistral, dict(), dict(plan=Candidate(sp=4, ring=2, micro_batch=2))),
    # HF Qwen2, layer 0 global, layer 1 window 6 (the layer read from the module path), SP 4
    "hf_qwen2_mixed_window_sp4": (qwen2_mixed, dict(rows=1), dict(plan=Candidate(sp=4, micro_batch=1))),
    # the same under ZeRO-3 (one graph per layer: the layer read from its parameters)
    "hf_qwen2_mixed_window_zero3_sp4": (qwen2_mixed, dict(),
                                        dict(plan=Candidate(sp=4, zero_stage=3, micro_batch=2), ds_config=Z3)),
    # ZeRO-3 with a window of 10 > the 8 local tokens: both layers' masks are causal on a rank, only the
    # window attribute tells the layers apart
    "hf_qwen2_mixed_window10_zero3_sp4": (lambda: qwen2_mixed(10), dict(rows=1),
                                          dict(plan=Candidate(sp=4, zero_stage=3, micro_batch=1), ds_config=Z3)),
    # knobs on packed data: full checkpointing, MLP and loss tiling, U 2 x R 2
    "llama_u2r2_full_mlp2_loss2": (reference_llama, dict(),
                                   dict(plan=Candidate(sp=4, ring=2, micro_batch=2, checkpointing="full", mlp_chunks=2,
                                                       loss_chunks=2))),
    # knobs: selective checkpointing + head pipeline, Ulysses SP=2 x DP 2
    "llama_sp2_dp2_selective_head_pipeline": (lambda: reference_llama(n_kv=2, n_heads=8), dict(),
                                              dict(plan=Candidate(sp=2, dp=2, micro_batch=1, checkpointing="selective",
                                                                  overlap="head_pipeline"))),
    # sequence-chunked layers on packed documents (documents cross the chunks as well as the ranks):
    # SP=2 x DP 2, 3 uneven chunks of the 16 local tokens, seq_lens
    "llama_sp2_dp2_chunks3_seq_lens": (reference_llama, dict(form="seq_lens"),
                                       dict(plan=Candidate(sp=2, dp=2, micro_batch=1, sequence_chunks=3))),
    # SP=4, two rows packed differently, 2 chunks kept in host memory, full checkpointing
    "llama_sp4_rows_chunks2_offload_full": (reference_llama, dict(),
                                            dict(plan=Candidate(sp=4, micro_batch=2, sequence_chunks=2,
                                                                offload_chunks=True, checkpointing="full"))),
    # U 2 x R 2 ring with 2 chunks: the documents cross zigzag blocks and chunks
    "llama_u2r2_chunks2": (reference_llama, dict(),
                           dict(plan=Candidate(sp=4, ring=2, micro_batch=2, sequence_chunks=2))),
    # sliding window 5 across chunks (4 local tokens a chunk), SP=4; and on a U 2 x R 2 ring
    "hf_mistral_window5_sp4_chunks2": (mistral, dict(), dict(plan=Candidate(sp=4, micro_batch=2, sequence_chunks=2))),
    "hf_mistral_window5_u2r2_chunks2": (mistral, dict(),
                                        dict(plan=Candidate(sp=4, ring=2, micro_batch=2, sequence_chunks=2))),
    # a global and a windowed layer under ZeRO-3, chunked
    "hf_qwen2_mixed_window_zero3_chunks2": (qwen2_mixed, dict(),
                                            dict(plan=Candidate(sp=4, zero_stage=3, micro_batch=2, sequence_chunks=2),
                                                 ds_config=Z3)),
}
CHUNKED = [name for name, (_, _, kw) in EXACT.items() if kw["plan"].sequence_chunks > 1]


def _record_joint_graph_shapes(shapes: list):
    from test_compiler_ring import _record_joint_graph_shapes as record

    return record(shapes)


def run_cases(rank, world, names):
    from autosp.compiler import testing

    def run_one(name):
        factory, batch_kw, compile_kw = EXACT[name]
        compile_kw = {"backend": "aot_eager", **compile_kw}
        model, batches = factory(), packed_batches(**batch_kw)
        shapes: list = []
        restore = _record_joint_graph_shapes(shapes) if name.endswith("_shapes") else None
        try:
            got = testing.sp_run(model, batches, sgd, **compile_kw)
        finally:
            if restore:
                restore()
        if rank == 0:
            ref = testing.reference_run(model, batches, sgd, loss_fn=testing.packed_loss)
            return {"errors": testing.compare(got, ref), "attention": got["stats"].attention, "shapes": shapes,
                    "layers_chunked": got["stats"].layers_chunked}
        return None

    return testing.run_cases(rank, names, run_one)


@pytest.fixture(scope="module")
def world4():
    from autosp.compiler import testing

    return testing.spawn(run_cases, 4, list(EXACT))


def _ok(world4, name):
    result = world4[name]
    assert "crash" not in result, result.get("crash")
    return result


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXACT))
def test_packed_exact_against_documents_run_one_by_one(world4, name):
    assert_within(world4[name], TOL)


@pytest.mark.slow
@pytest.mark.parametrize("name", CHUNKED)
def test_chunked_cases_ran_their_layers_in_chunks(world4, name):
    assert _ok(world4, name)["layers_chunked"] >= 1


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in EXACT if n.endswith("_shapes")])
def test_no_sequence_by_sequence_tensor_for_packed_inputs(world4, name):
    shapes = _ok(world4, name)["shapes"]
    plan = EXACT[name][2]["plan"]
    sp, ring = plan.sp, plan.ring
    s = SHAPES_SEQ // sp
    sequence_sizes = {s, s * (sp // ring), SHAPES_SEQ}  # a rank's tokens, a ring block, the whole sequence
    assert any(sum(d in sequence_sizes for d in shape) == 1 and len(shape) == 4 for shape in shapes)
    square = [shape for shape in shapes if sum(d in sequence_sizes for d in shape) >= 2]
    assert not square, square
