"""The experts' backward (compiler/experts.py): each expert's weight gradient is made once, not as a zero tensor of
every expert's size."""

import torch

from autosp.compiler.experts import _gate, _local_experts


def _case(dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    rows, hidden, experts, inner = 12, 6, 5, 4
    x = torch.randn(rows, hidden, generator=gen, dtype=dtype, requires_grad=True)
    expert = torch.tensor([0, 2, 2, 0, 4, 2, 0, 0, 4, 2, 2, 0])  # expert 1 and 3 get no rows
    gate_up = torch.randn(experts, 2 * inner, hidden, generator=gen, dtype=dtype, requires_grad=True)
    down = torch.randn(experts, hidden, inner, generator=gen, dtype=dtype, requires_grad=True)
    return x, expert, gate_up, down


def _graph_names(root) -> set[str]:
    seen, names, stack = set(), set(), [root]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.add(type(fn).__name__)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return names


def test_the_expert_weights_are_split_once_so_their_gradients_are_stacked_once():
    """Indexing gate_up[e] per expert put a SelectBackward on every expert: each made a zero tensor of all the
    experts' size in the backward, added up one by one (E passes over the layer's expert weights)."""
    x, expert, gate_up, down = _case()
    out = _local_experts(x, expert, gate_up, down, _gate("silu"))
    names = _graph_names(out.grad_fn)
    assert "UnbindBackward0" in names and "SelectBackward0" not in names


def test_the_experts_gradients_equal_a_per_row_reference_and_are_zero_for_experts_without_rows():
    x, expert, gate_up, down = _case()
    out = _local_experts(x, expert, gate_up, down, _gate("silu"))
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    got = torch.autograd.grad((out * weight).sum(), (x, gate_up, down))
    ref_out = []
    for r in range(x.shape[0]):  # each row through its own expert, no grouping at all
        gate, up = torch.nn.functional.linear(x[r], gate_up[expert[r]]).chunk(2)
        ref_out.append(torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, down[expert[r]]))
    ref = torch.autograd.grad((torch.stack(ref_out) * weight).sum(), (x, gate_up, down))
    torch.testing.assert_close(out, torch.stack(ref_out), rtol=1e-12, atol=1e-12)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert got[1][[1, 3]].abs().sum() == 0 and got[2][[1, 3]].abs().sum() == 0


def test_the_experts_backward_holds_one_copy_of_the_expert_weight_gradients_beside_autograds():
    """fp32, few tokens (the expert weights dominate): the op's backward peaks at 1.68x the local expert weights' bytes
    whole, 2.68x in pieces (the sums, one piece's gradients, autograd's stacking of them). It summed into zero-filled
    copies of the weights before: 2.68x and 3.68x. The cost model prices that peak within a few percent."""
    from studies.measure.memory import allocated_peak

    from autosp.compiler.experts import moe_experts

    torch.manual_seed(0)
    tokens, hidden_size, experts, inner, k = 64, 128, 8, 512, 2
    weight_bytes = experts * 3 * hidden_size * inner * 4
    hidden = torch.randn(tokens, hidden_size, requires_grad=True)
    index = torch.arange(tokens * k).reshape(tokens, k) % experts  # every expert gets rows
    weights = torch.rand(tokens, k, requires_grad=True)
    gate_up = torch.randn(experts, 2 * inner, hidden_size, requires_grad=True)
    down = torch.randn(experts, hidden_size, inner, requires_grad=True)
    peaks = {}
    for chunks in (1, 2):
        out = moe_experts(hidden, index, weights, gate_up, down, "", "silu", chunks)
        grad = torch.ones_like(out)
        peaks[chunks] = allocated_peak(lambda: out.backward(grad)) / weight_bytes
        for t in (hidden, weights, gate_up, down):
            t.grad = None
    assert peaks[1] < 1.75 and peaks[2] < 2.75, peaks
    # the cost model's price of it (moe.expert_grad_bytes, what the MoE layer's MLP phase holds at the op's end)
    from autosp.cost_models import moe

    shape = moe.MoeShape(E=experts, k=k, h=hidden_size, fe=inner, m=3, moe_layers=1, L=1, ep=1, world=1,
                         expert_params=experts * 3 * hidden_size * inner)
    for chunks, peak in peaks.items():
        predicted = moe.expert_grad_bytes(shape, 4, chunks)[1] + tokens * hidden_size * 4
        assert 0.95 < predicted / (peak * weight_bytes) < 1.02, (chunks, predicted / (peak * weight_bytes))
