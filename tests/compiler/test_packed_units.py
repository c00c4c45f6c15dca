"""Packed documents and sliding windows, in one process: the document spans, the attention rule's pieces
(every allowed (query, key) pair exactly once), the span-restricted kernels against per-document SDPA,
the sharding of packed batches and the windows read from Hugging Face configs."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from autosp.compiler.attention.documents import (
    document_spans,
    position_ids_from_spans,
    publish,
    spans_from_cu_seq_lens,
    spans_from_seq_lens,
)
from autosp.compiler.attention.local import rows_backward, rows_forward, span_attention
from autosp.compiler.attention.merge import empty_accumulators
from autosp.compiler.attention.pieces import attention_pieces
from autosp.compiler.inputs import shard_batch
from autosp.compiler.windows import layer_windows
from autosp.errors import UsageError


def test_document_spans_follow_the_hugging_face_rule():
    assert document_spans(torch.tensor([0, 1, 2, 0, 1, 0])) == [(0, 3), (3, 5), (5, 6)]
    assert document_spans([5, 6, 7]) == [(0, 3)]             # counting up from any offset: one document
    assert document_spans([0, 1, 3, 4]) == [(0, 2), (2, 4)]  # any jump starts a new one
    assert document_spans([0, 0, 0]) == [(0, 1), (1, 2), (2, 3)]
    assert spans_from_seq_lens([3, 1, 2], 6) == [(0, 3), (3, 4), (4, 6)]
    assert spans_from_cu_seq_lens([0, 3, 4, 6]) == [(0, 3), (3, 4), (4, 6)]
    assert position_ids_from_spans([(0, 3), (3, 4), (4, 6)]).tolist() == [0, 1, 2, 0, 0, 1]
    with pytest.raises(ValueError, match="add up to 5"):
        spans_from_seq_lens([3, 2], 6)
    with pytest.raises(ValueError, match="positive"):
        spans_from_seq_lens([3, 0, 3])


def _allowed(q_spans, k_spans, docs, window):
    qrows = [t for a, b in q_spans for t in range(a, b)]
    krows = [t for a, b in k_spans for t in range(a, b)]

    def doc(t):
        return 0 if not docs else next(i for i, (a, b) in enumerate(docs) if a <= t < b)

    return {(i, j) for i, qt in enumerate(qrows) for j, kt in enumerate(krows)
            if kt <= qt and doc(kt) == doc(qt) and (window is None or qt - kt < window)}


def _covered(pieces):
    out = []
    for p in pieces:
        if p.causal:
            assert p.q_stop - p.q_start == p.k_stop - p.k_start, p
        for i in range(p.q_start, p.q_stop):
            for j in range(p.k_start, p.k_stop):
                li, lj = i - p.q_start, j - p.k_start
                if not p.causal or (lj >= li if p.mirrored else lj <= li):
                    out.append((i, j))
    return out


def test_pieces_cover_every_allowed_pair_exactly_once():
    rng = random.Random(0)
    for _ in range(600):
        seq = rng.randint(1, 30)
        cuts = sorted(rng.sample(range(1, seq), rng.randint(0, min(5, seq - 1)))) if seq > 1 else []
        bounds = [0, *cuts, seq]
        docs = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)] if rng.random() < 0.7 else None
        window = rng.choice([None, 1, 2, 3, 5, 8, 50])

        def spans():
            points = sorted(rng.sample(range(seq + 1), min(2 * rng.randint(1, 3), seq + 1)))
            out = [(points[i], points[i + 1]) for i in range(0, len(points) - 1, 2) if points[i] < points[i + 1]]
            return (out[::-1] if rng.random() < 0.5 else out) or [(0, seq)]

        q_spans, k_spans = spans(), spans()
        got = _covered(attention_pieces(q_spans, k_spans, docs, window))
        assert len(got) == len(set(got))
        assert set(got) == _allowed(q_spans, k_spans, docs, window), (q_spans, k_spans, docs, window)


def test_a_window_longer_than_the_blocks_is_plain_causal():
    assert attention_pieces([(0, 8)], [(0, 8)], None, 8) == attention_pieces([(0, 8)], [(0, 8)])


def _reference_attention(q, k, v, rows_docs, window):
    """Each row, each document on its own through SDPA with an explicit (tiny) mask."""
    b, hq, n, _ = q.shape
    groups = hq // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    outs = []
    for r in range(b):
        row = torch.zeros_like(q[r])
        for a, e in rows_docs[r] or [(0, n)]:
            i = torch.arange(e - a)
            allowed = i[None, :] <= i[:, None]
            if window:
                allowed &= i[None, :] > i[:, None] - window
            row[:, a:e] = F.scaled_dot_product_attention(q[r:r + 1, :, a:e], k[r:r + 1, :, a:e], v[r:r + 1, :, a:e],
                                                         attn_mask=allowed)[0]
        outs.append(row)
    return torch.stack(outs)


@pytest.mark.parametrize("window", [0, 1, 3, 7])
def test_span_kernels_equal_per_document_attention(window):
    torch.manual_seed(0)
    n, docs = 20, ([(0, 1), (1, 9), (9, 10), (10, 20)], None)
    q = torch.randn(2, 4, n, 8, dtype=torch.float64).float().requires_grad_()
    k = torch.randn(2, 2, n, 8).requires_grad_()
    v = torch.randn(2, 2, n, 8).requires_grad_()
    ref = _reference_attention(q, k, v, docs, window)
    dout = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)

    spans = ((0, n),)
    out, lse = rows_forward(q.detach(), k.detach(), v.detach(), spans, spans, None, docs, window,
                            empty_accumulators(q, 8))
    assert (out - ref).abs().max() <= 1e-5
    grads = tuple(torch.zeros_like(t) for t in (q, k, v))
    rows_backward(dout, q.detach(), k.detach(), v.detach(), out, lse, spans, spans, None, docs, window, grads)
    for got, want in zip(grads, ref_grads):
        assert (got - want).abs().max() <= 1e-5

    publish("unit-test", docs)  # the op reads the published documents, the autograd formula runs the backward
    out_op = span_attention(q, k, v, None, "unit-test", window)[0]
    assert (out_op - ref).abs().max() <= 1e-5
    for got, want in zip(torch.autograd.grad(out_op, (q, k, v), dout), ref_grads):
        assert (got - want).abs().max() <= 1e-5


@pytest.mark.parametrize("compiled", [False, True])
def test_span_attention_under_autocast_follows_sdpas_dtype_rule(compiled):
    """Hugging Face's rotary embeddings leave q and k in fp32 and v in bf16 under CPU autocast: SDPA runs in bf16,
    and so must the op that replaces it (before the autocast rule: "expected scalar type Float but found BFloat16")."""
    torch.manual_seed(0)
    q, k = (torch.randn(1, 2, 12, 8, requires_grad=True) for _ in range(2))
    v = torch.randn(1, 2, 12, 8).bfloat16().requires_grad_()

    def op(q, k, v):
        return span_attention(q, k, v, None, "", 0)[0]

    run = torch.compile(op, backend="aot_eager", fullgraph=True) if compiled else op
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(q, k, v)
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == ref.dtype == torch.bfloat16
    assert (out.float() - ref.float()).abs().max() <= 1e-2
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    want = torch.autograd.grad(ref.float().sum(), (q, k, v))
    assert [g.dtype for g in grads] == [torch.float32, torch.float32, torch.bfloat16]  # the inputs' own dtypes
    for got, expected in zip(grads, want):
        assert (got.float() - expected.float()).abs().max() <= 5e-2


def test_shard_batch_finds_packed_documents():
    ids = torch.arange(10).reshape(1, 10)
    pos = torch.tensor([[0, 1, 2, 0, 0, 1, 2, 3, 0, 1]])
    batch = shard_batch(ids, ids, sp=4, sp_rank=1, dp=1, dp_rank=0, position_ids=pos)
    # padded to 12: the pads continue the last document's positions
    assert batch.documents == [[(0, 3), (3, 4), (4, 8), (8, 12)]]
    assert batch.position_ids.tolist() == [[0, 0, 1]]
    same = shard_batch(ids, ids, sp=4, sp_rank=1, dp=1, dp_rank=0, seq_lens=[3, 1, 4, 2])
    assert same.documents == batch.documents and torch.equal(same.position_ids, batch.position_ids)
    cu = shard_batch(ids, ids, sp=4, sp_rank=1, dp=1, dp_rank=0, cu_seq_lens=torch.tensor([0, 3, 4, 8, 10]))
    assert cu.documents == batch.documents
    assert shard_batch(ids, ids, sp=2, sp_rank=0, dp=1, dp_rank=0, position_ids=torch.arange(10)[None]).documents is None


def test_packed_inputs_errors_are_one_line():
    ids = torch.arange(8).reshape(2, 4)
    for kwargs, match in [(dict(seq_lens=[3, 2]), "add up to 5"), (dict(seq_lens=[[4], [2, 1]]), "add up to 3"),
                          (dict(cu_seq_lens=[0, 3, 8]), "row boundary"), (dict(seq_lens=[4], cu_seq_lens=[0, 4, 8]),
                                                                         "not both"),
                          (dict(seq_lens=[2, 2], position_ids=torch.arange(4)[None]), "different documents"),
                          (dict(position_ids=torch.tensor([[0, 1, -1, 0]])), "non-negative")]:
        with pytest.raises(UsageError, match=match):
            shard_batch(ids, ids, sp=2, sp_rank=0, dp=1, dp_rank=0, **kwargs)


def test_layer_windows_from_hugging_face_configs():
    import transformers

    mistral = transformers.MistralConfig(num_hidden_layers=3, sliding_window=16)
    assert layer_windows(mistral) == (16, 16, 16)
    assert layer_windows(transformers.MistralConfig(num_hidden_layers=2, sliding_window=None)) is None
    qwen = transformers.Qwen2Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=8, max_window_layers=2)
    assert layer_windows(qwen) == (None, None, 8, 8)
    assert layer_windows(transformers.Qwen2Config(num_hidden_layers=2, sliding_window=8)) is None  # not switched on
    assert layer_windows(transformers.LlamaConfig(num_hidden_layers=2)) is None
    # Gemma 2: local (sliding) and global layers alternate, the first one local
    assert layer_windows(transformers.Gemma2Config(num_hidden_layers=3, sliding_window=8)) == (8, None, 8)


def test_packing_a_token_file_the_hugging_face_way():
    import numpy as np

    from autosp.compiler.packing import PackedTokenSource, first_document_start, pack_window

    sep = 9
    tokens = np.array([1, 2, sep, 3, sep, 4, 5, 6, sep, 7, 8], dtype=np.int64)
    ids, pos, labels = pack_window(tokens, 0, 8, (sep,))
    assert ids.tolist() == [1, 2, sep, 3, sep, 4, 5, 6]
    assert pos.tolist() == [0, 1, 2, 0, 1, 0, 1, 2]              # restarting after every separator
    assert labels.tolist() == [-100, 2, sep, -100, sep, -100, 5, 6]  # no target crosses a document
    assert first_document_start(tokens, 1, 4, (sep,)) == 3         # the next document start
    assert first_document_start(tokens, 6, 4, (sep,)) == 6         # none in reach with room: the raw offset
    batch = PackedTokenSource(tokens, 6, 0, (sep,), torch).batch(step=0, rows=2)
    assert batch["input_ids"].shape == batch["position_ids"].shape == batch["labels"].shape == (2, 6)
    for row in range(2):  # the engine finds the same documents the labels describe
        docs = document_spans(batch["position_ids"][row])
        assert [a for a, _ in docs] == (batch["labels"][row] == -100).nonzero().flatten().tolist()
