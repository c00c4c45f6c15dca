"""Compute throughput on one rank: matmul, linear forward+backward, causal attention, memory copies.

FLOP conventions (the cost model must use the same ones to turn these rates into times):

- matmul ``(M, K, N)``: ``2 M K N``.
- linear forward + backward at ``(M, K, N)`` (``y = x W^T``, gradients of ``x`` and ``W``): ``6 M K N``.
- causal attention forward + backward, ``B`` sequences of ``S`` tokens, ``H`` heads of width ``D``
  (``h = H D``), counted as the cost model (cost_models/flops.py) counts the work a flash kernel does:
  forward ``2 B h S^2`` (QK^T and PV, ``4 B h S^2``, halved by the causal mask) and backward 2.5 x the
  forward (it recomputes QK^T; FlashAttention-2, arXiv 2307.08691): ``7 B h S^2`` in all. This is
  ``flop``; ``flop_model`` (``6 B h S^2``, backward 2 x forward, what MFU counts) and ``flop_full``
  (``12 B h S^2``, no causal halving) are recorded too.
- memory copy of ``n`` bytes: ``2 n`` bytes moved (read + write).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from autosp.profiling.calibration.timing import TORCH_DTYPES, measure

ATTENTION_BACKWARD_FACTOR = 2.5
"""Flash-attention backward work / forward work, as cost_models/flops.py (FA_BACKWARD_FACTOR) counts it."""


def _record(kind: str, dtype: str, flop: float, timing: dict, **extra) -> dict:
    out = {"kind": kind, "dtype": dtype, **extra, "flop": flop, "seconds": timing["seconds"],
           "flops": flop / timing["seconds"], "samples": timing["samples"], "inner": timing["inner"]}
    return out


def matmul(shape, dtype: str, device, sync, settings) -> dict:
    m, k, n = shape
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, device=device, dtype=TORCH_DTYPES[dtype], generator=gen)
    b = torch.randn(k, n, device=device, dtype=TORCH_DTYPES[dtype], generator=gen)
    with torch.no_grad():
        timing = measure(lambda: torch.mm(a, b), sync, settings)
    return _record("matmul", dtype, 2.0 * m * k * n, timing, shape=list(shape))


def linear_fwd_bwd(shape, dtype: str, device, sync, settings) -> dict:
    """``F.linear`` forward and backward (input and weight gradients), as in a training step."""
    m, k, n = shape
    dt = TORCH_DTYPES[dtype]
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(m, k, device=device, dtype=dt, generator=gen).requires_grad_()
    w = (torch.randn(n, k, device=device, dtype=dt, generator=gen) / k ** 0.5).requires_grad_()
    dy = torch.randn(m, n, device=device, dtype=dt, generator=gen)

    def step():
        y = F.linear(x, w)
        torch.autograd.grad(y, (x, w), dy)

    timing = measure(step, sync, settings)
    return _record("linear_fwd_bwd", dtype, 6.0 * m * k * n, timing, shape=list(shape))


def attention_fwd_bwd(seq_len: int, dtype: str, device, sync, settings, batch: int = 1) -> dict:
    """Causal ``scaled_dot_product_attention`` forward and backward on ``[B, H, S, D]`` inputs."""
    heads, head_dim = settings.attention_heads, settings.attention_head_dim
    dt = TORCH_DTYPES[dtype]
    gen = torch.Generator(device=device).manual_seed(2)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, device=device, dtype=dt, generator=gen)
               .requires_grad_() for _ in range(3))
    dout = torch.randn(batch, heads, seq_len, head_dim, device=device, dtype=dt, generator=gen)

    def step():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(out, (q, k, v), dout)

    timing = measure(step, sync, settings)
    forward = 2.0 * batch * heads * head_dim * seq_len * seq_len  # causal: half of QK^T + PV
    rec = _record("attention_fwd_bwd", dtype, forward * (1 + ATTENTION_BACKWARD_FACTOR), timing, seq_len=seq_len,
                  batch=batch, heads=heads, head_dim=head_dim)
    rec["flop_model"] = 3.0 * forward
    rec["flop_full"] = 6.0 * forward
    return rec


def copy_bandwidth(nbytes: int, device, sync, settings) -> dict:
    """Device memory bandwidth from ``dst.copy_(src)`` of ``nbytes`` (2 x nbytes moved)."""
    n = max(1, nbytes // 4)
    src = torch.ones(n, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    timing = measure(lambda: dst.copy_(src), sync, settings)
    moved = 2.0 * n * 4
    return {"kind": "copy", "bytes": n * 4, "bytes_moved": moved, "seconds": timing["seconds"],
            "bandwidth": moved / timing["seconds"], "samples": timing["samples"], "inner": timing["inner"]}


def count_compute_items(settings) -> int:
    """How many measurements :func:`run_compute` makes (for the progress bar)."""
    total = 1  # copy
    for dtype in settings.dtypes():
        total += len(settings.matmul_shapes.get(dtype, ())) + (dtype in settings.linear_shape)
        total += len(settings.attention_seq_lens.get(dtype, ()))
    return total


def run_compute(device, sync, settings, tick=lambda label: None) -> dict:
    """Every compute measurement of ``settings`` on this rank."""
    results = {"matmul": [], "linear": [], "attention": [], "copy": None}
    for dtype in settings.dtypes():
        for shape in settings.matmul_shapes.get(dtype, ()):
            tick(f"matmul {dtype} {'x'.join(map(str, shape))}")
            results["matmul"].append(matmul(shape, dtype, device, sync, settings))
        if dtype in settings.linear_shape:
            shape = settings.linear_shape[dtype]
            tick(f"linear fwd+bwd {dtype} {'x'.join(map(str, shape))}")
            results["linear"].append(linear_fwd_bwd(shape, dtype, device, sync, settings))
        for seq_len in settings.attention_seq_lens.get(dtype, ()):
            tick(f"attention {dtype} S={seq_len}")
            results["attention"].append(attention_fwd_bwd(seq_len, dtype, device, sync, settings))
    tick("memory copy")
    results["copy"] = copy_bandwidth(settings.copy_bytes, device, sync, settings)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return results


__all__ = ["ATTENTION_BACKWARD_FACTOR", "attention_fwd_bwd", "copy_bandwidth", "count_compute_items",
           "linear_fwd_bwd", "matmul", "run_compute"]
