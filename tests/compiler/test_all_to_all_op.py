"""autosp_ops::all_to_all and its start/wait pair against the definition, on 2 gloo processes.

The blocking op sends its input without a copy when the rank chunks are already consecutive blocks of it
(every dimension before ``scatter_dim`` of size 1) and returns the receive buffer itself when the received
slots are the output's consecutive blocks (every dimension before ``gather_dim`` of size 1); otherwise it
copies. Both branches must give the definition: rank r's output is the concatenation along ``gather_dim``,
in rank order, of chunk r (along ``scatter_dim``) of every rank's input. One spawned run covers the layouts
Ulysses uses (batch 1 and 2, heads <-> sequence both ways), a non-contiguous input, 16-bit inputs (fp32
transport), the asynchronous pair, and the gradient (the inverse exchange).
"""

from __future__ import annotations

import pytest
import torch

CASES = [  # (shape, scatter_dim, gather_dim, dtype, contiguous)
    ((1, 4, 6, 3), 1, 2, torch.float32, True),    # q/k/v: heads out, sequence in (send without a copy)
    ((1, 2, 12, 3), 2, 1, torch.float32, True),   # attention output: sequence out, heads in (receive without a copy)
    ((2, 4, 6, 3), 1, 2, torch.float32, True),    # batch 2: both sides copy
    ((2, 2, 12, 3), 2, 1, torch.float32, True),
    ((1, 4, 6, 3), 1, 2, torch.float32, False),   # a transposed (non-contiguous) input
    ((1, 4, 6, 3), 1, 2, torch.bfloat16, True),   # sent as fp32 over gloo, returned in bf16
    ((4, 6), 0, 1, torch.float32, True),
]


def _input(rank, shape, dtype, contiguous):
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(shape, generator=gen).to(dtype)
    if not contiguous:  # same values, transposed storage
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    return x


def _expected(rank, world, shape, scatter_dim, gather_dim, dtype, contiguous):
    parts = [torch.tensor_split(_input(j, shape, dtype, contiguous), world, dim=scatter_dim)[rank]
             for j in range(world)]
    return torch.cat(parts, dim=gather_dim)


def _check(rank, world):
    import torch.distributed as dist

    from autosp.compiler import ops

    group = dist.group.WORLD.group_name
    failures = []
    for case in CASES:
        shape, scatter_dim, gather_dim, dtype, contiguous = case
        x = _input(rank, shape, dtype, contiguous)
        want = _expected(rank, world, *case)
        got = ops.all_to_all(x, scatter_dim, gather_dim, group)
        if got.dtype != dtype or not torch.equal(got, want):
            failures.append(f"all_to_all {case}")
        recv = ops.all_to_all_start(x, scatter_dim, gather_dim, group)
        got = ops.all_to_all_wait(recv, scatter_dim, gather_dim, group, dtype)
        if not torch.equal(got, want):
            failures.append(f"start/wait {case}")
        if dtype == torch.float32:
            # d out / d x of sum(out * w) is the inverse exchange of w
            leaf = x.clone().requires_grad_()
            weight = torch.randn(want.shape, generator=torch.Generator().manual_seed(7 + rank))
            (ops.all_to_all(leaf, scatter_dim, gather_dim, group) * weight).sum().backward()
            back = ops.all_to_all(weight, gather_dim, scatter_dim, group)
            if not torch.equal(leaf.grad, back):
                failures.append(f"gradient {case}")
    return failures


@pytest.mark.slow
def test_all_to_all_matches_its_definition_in_every_layout():
    from autosp.compiler.testing import spawn

    assert spawn(_check, 2) == []
