"""Gemma 2's soft-capping pieces on one process (fast; the trained models are in test_compiler_families.py):
the capped piece kernel merged blockwise equals the eager computation (forward and every input gradient, with
grouped-query heads, split blocks and a sliding window), the tiled loss applies the final-logit cap per chunk, and
the expert op's token pieces (``mlp_chunks`` on a mixture of experts) change nothing."""

from __future__ import annotations

import pytest
import torch

from autosp.compiler.attention import capped
from autosp.compiler.attention.blockwise import block_backward, block_forward
from autosp.compiler.attention.pieces import attention_pieces
from autosp.compiler.softcapping import _capped_sdpa

TOL = 1e-5  # the kernel accumulates in float32; the reference runs in float64


def _inputs(seed=0, b=2, hq=4, hkv=2, s=24, d=8):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, s, d, generator=gen, dtype=torch.float64, requires_grad=True) for h in (hq, hkv, hkv)]


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("window", [0, 5])
def test_capped_pieces_merged_blockwise_equal_eager_attention(monkeypatch, window):
    monkeypatch.setattr(capped, "ROWS", 5)  # several row blocks inside each piece
    q, k, v = _inputs()
    cap, scale, s = 0.7, 0.3, q.shape[2]
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    if window:
        mask = mask.triu(1 - window)
    ref = _capped_sdpa(q, k, v, mask, 0.0, False, scale, True, cap)
    dout = torch.randn_like(ref)
    ref.backward(dout)
    blocks = [(0, 10), (10, s)]
    outs, lses = [], []
    for qs in blocks:  # each query block over each key block, merged by log-sum-exp
        acc = None
        for ks in blocks:
            pieces = attention_pieces((qs,), (ks,), None, window or None)
            acc = block_forward(q.detach()[:, :, slice(*qs)], k.detach()[:, :, slice(*ks)], v.detach()[:, :, slice(*ks)],
                                [qs], [ks], scale, into=acc, pieces=pieces, softcap=cap)
        outs.append(acc[0])
        lses.append(acc[1])
    out, lse = torch.cat(outs, 2).to(q.dtype), torch.cat(lses, 2)
    assert _rel(out, ref) < TOL
    grads = [torch.zeros(t.shape, dtype=torch.float32) for t in (q, k, v)]
    for qs in blocks:
        for ks in blocks:
            rows, cols = slice(*qs), slice(*ks)
            pieces = attention_pieces((qs,), (ks,), None, window or None)
            gq, gk, gv = block_backward(dout[:, :, rows], q.detach()[:, :, rows], k.detach()[:, :, cols],
                                        v.detach()[:, :, cols], out[:, :, rows], lse[:, :, rows], [qs], [ks], scale,
                                        pieces=pieces, softcap=cap)
            grads[0][:, :, rows] += gq
            grads[1][:, :, cols] += gk
            grads[2][:, :, cols] += gv
    for got, t in zip(grads, (q, k, v)):
        assert _rel(got, t.grad) < TOL


def test_the_cap_changes_attention():  # the kernel does cap: a test that could not fail otherwise
    q, k, v = (t.detach() for t in _inputs())
    capped_out, _ = capped.capped_with_lse(q, k, v, True, 0.3, 0.2)
    plain = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                             is_causal=True, scale=0.3)
    assert _rel(capped_out, plain) > 1e-3


def test_tiled_loss_applies_the_final_logit_cap_per_chunk():
    from autosp.compiler.passes.tiling_loss import tiled_linear_cross_entropy

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 7, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 11, (2, 7), generator=gen)
    target[0, 2] = -100
    logits = torch.tanh(torch.nn.functional.linear(hidden, weight) / 2.0) * 2.0
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), reduction="sum")
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    got = tiled_linear_cross_entropy(hidden, weight, None, target, -100, False, 3, 2.0)
    grads = torch.autograd.grad(got, (hidden, weight))
    assert _rel(got, ref) < 1e-12
    for a, b in zip(grads, ref_grads):
        assert _rel(a, b) < 1e-12


def test_expert_op_token_pieces_change_nothing():
    from autosp.compiler.experts import moe_experts

    gen = torch.Generator().manual_seed(0)
    t, h, e, i, k = 10, 8, 4, 6, 2
    hidden = torch.randn(t, h, generator=gen, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, e, (t, k), generator=gen)
    weights = torch.rand(t, k, generator=gen, dtype=torch.float64, requires_grad=True)
    gate_up = torch.randn(e, 2 * i, h, generator=gen, dtype=torch.float64, requires_grad=True)
    down = torch.randn(e, h, i, generator=gen, dtype=torch.float64, requires_grad=True)
    results = []
    for chunks in (1, 3):
        out = moe_experts(hidden, index, weights, gate_up, down, "", "silu", chunks)
        results.append((out, *torch.autograd.grad(out.square().sum(), (hidden, weights, gate_up, down))))
    for a, b in zip(*results):
        assert _rel(a, b) < 1e-12
