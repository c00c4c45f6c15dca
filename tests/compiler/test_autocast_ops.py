"""Under torch.autocast autosp's tiled MLP, tiled logits + loss and experts op compute as the ops they replace
would (compiler/autocast.py): the linears in the autocast dtype, the cross-entropy in fp32, the experts' weighted
sum in the hidden states' dtype, gradients back in the inputs' own dtypes. Without the rules a compiled graph ran
them in fp32 and the MLP returned fp32 (the intermediates at 4 bytes an element where the plan priced 2)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autosp.compiler.passes.tiling_loss import tiled_linear_cross_entropy
from autosp.compiler.passes.tiling_mlp import mlp_reference, tiled_mlp


def _maybe_compiled(fn, compiled: bool):
    return torch.compile(fn, backend="aot_eager", fullgraph=True) if compiled else fn


@pytest.mark.parametrize("compiled", [False, True])
def test_tiled_mlp_under_autocast_is_the_untiled_mlp_in_bf16(compiled):
    torch.manual_seed(0)
    x = torch.randn(1, 15, 8, requires_grad=True)  # 15 tokens in 4 tiles: uneven pieces
    up, gate = (torch.randn(32, 8, requires_grad=True) for _ in range(2))
    down = torch.randn(8, 32, requires_grad=True)
    run = _maybe_compiled(lambda *a: tiled_mlp(*a, "silu", 4), compiled)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(x, up, None, gate, None, down, None)
        ref = mlp_reference(x, up, None, gate, None, down, None, "silu")
    assert out.dtype == ref.dtype == torch.bfloat16
    assert torch.equal(out, ref)  # per token the same bf16 arithmetic
    grads = torch.autograd.grad(out.float().sum(), (x, up, gate, down))
    want = torch.autograd.grad(ref.float().sum(), (x, up, gate, down))
    assert [g.dtype for g in grads] == [torch.float32] * 4
    for got, expected in zip(grads, want):
        assert (got - expected).abs().max() <= 2e-2 * expected.abs().max()  # weight grads: sums over tiles


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("upcast", [False, True])
def test_tiled_loss_under_autocast_runs_the_head_in_bf16_and_the_loss_in_fp32(compiled, upcast):
    torch.manual_seed(0)
    hidden = torch.randn(13, 8, requires_grad=True)
    weight = torch.randn(50, 8, requires_grad=True)
    target = torch.randint(0, 50, (13,))
    target[3] = -100
    run = _maybe_compiled(lambda h, w: tiled_linear_cross_entropy(h, w, None, target, -100, upcast, 4), compiled)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(hidden, weight)
        logits = F.linear(hidden, weight)
        ref = F.cross_entropy(logits.float() if upcast else logits, target, ignore_index=-100, reduction="sum")
    assert out.dtype == ref.dtype == torch.float32
    assert abs(out.item() - ref.item()) <= 1e-5 * abs(ref.item())  # fp32 sums over 4 tiles vs one
    grads = torch.autograd.grad(out, (hidden, weight))
    want = torch.autograd.grad(ref, (hidden, weight))
    assert [g.dtype for g in grads] == [torch.float32] * 2
    for got, expected in zip(grads, want):
        assert (got - expected).abs().max() <= 2e-2 * expected.abs().max()


def _experts_reference(hidden, index, weights, gate_up, down):
    """Hugging Face's experts loop (transformers' Qwen3MoeExperts.forward): each token through its top-k experts,
    each output weighted and summed in the hidden states' dtype."""
    out = torch.zeros_like(hidden)
    for t in range(hidden.shape[0]):
        for j in range(index.shape[1]):
            gate, up = F.linear(hidden[t:t + 1], gate_up[index[t, j]]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, down[index[t, j]]) * weights[t:t + 1, j, None]
            out = out.index_add(0, torch.tensor([t]), y.to(out.dtype))
    return out


@pytest.mark.parametrize("compiled", [False, True])
def test_experts_op_under_autocast_is_hugging_faces_experts_loop(compiled):
    """The experts' linears in bf16, their weighted sum in the hidden states' fp32 (not the whole op in bf16)."""
    from autosp.compiler.experts import moe_experts

    torch.manual_seed(0)
    tokens, hidden_size, inner, experts, k = 10, 8, 6, 4, 2
    hidden = torch.randn(tokens, hidden_size, requires_grad=True)
    gate_up = torch.randn(experts, 2 * inner, hidden_size, requires_grad=True)
    down = torch.randn(experts, hidden_size, inner, requires_grad=True)
    index = torch.stack([torch.randperm(experts)[:k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, k), -1).bfloat16().requires_grad_()  # the router's, in bf16
    run = _maybe_compiled(lambda *a: moe_experts(*a, "", "silu"), compiled)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(hidden, index, weights, gate_up, down)
        ref = _experts_reference(hidden, index, weights, gate_up, down)
    assert out.dtype == ref.dtype == torch.float32
    assert torch.equal(out, ref)
    leaves = (hidden, weights, gate_up, down)
    grads, want = torch.autograd.grad(out.sum(), leaves), torch.autograd.grad(ref.sum(), leaves)
    assert [g.dtype for g in grads] == [w.dtype for w in want] == [torch.float32, torch.bfloat16, torch.float32,
                                                                      torch.float32]
    for got, expected in zip(grads, want):
        assert (got.float() - expected.float()).abs().max() <= 2e-2 * expected.float().abs().max()
