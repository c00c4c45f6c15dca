"""Which attention kernel runs, on this machine, for SDPA and for the compiler's blockwise/ring pieces.

    .venv/bin/python -m studies.gpu_check.attention        # also run (in a child process) by python -m studies.gpu_check

For the machine's default kernel (what ``autosp-train`` selects without a plan: compiler/attention_kernel.py) and
every other SDPA kernel it offers, under that kernel's SDPA backend selection
(:func:`autosp.compiler.attention_kernel.sdpa_context`, as ``autosp-train`` runs its steps), one blockwise piece
(:func:`autosp.compiler.attention.kernels.sdpa_with_lse` and its backward; bf16, causal, grouped-query heads) is
run: the line names the aten kernel that ran (:func:`~autosp.compiler.attention.kernels.cuda_backend`), its error
against a float32 reference (output, log-sum-exp and the three gradients) and its forward+backward time. SDPA's own
choice is read with the profiler on one ``scaled_dot_product_attention`` call. On a machine without CUDA there is
no choice to check (SDPA's CPU flash kernel runs): one line says so.

Kept in its own process: the GPU check's parent process holds no CUDA context (its rows measure device memory).
"""

from __future__ import annotations

import sys

SHAPE = (1, 16, 4096, 128)  # batch, query heads, tokens, head dim (Llama-3.1-8B's heads at a 4k piece)
KV_HEADS = 4


def _reference(q, k, v, scale):
    """float32 (out, lse) of causal attention with grouped-query heads."""
    import torch

    groups = q.shape[1] // k.shape[1]
    qf, kf, vf = q.float(), k.float().repeat_interleave(groups, 1), v.float().repeat_interleave(groups, 1)
    scores = (qf @ kf.transpose(-1, -2)) * scale
    n = q.shape[2]
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(scores, -1) @ vf, torch.logsumexp(scores, -1)


def _sdpa_kernel_name(q, k, v) -> str:
    """The aten kernel SDPA itself dispatches to under the current backend selection (profiler)."""
    import torch
    import torch.nn.functional as F

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    names = [e.name for e in prof.events() if e.name.startswith("aten::_scaled_dot_product")]
    return names[0].removeprefix("aten::") if names else "math (no fused kernel)"


def probe_lines() -> list[str]:
    import torch

    from autosp.compiler import attention_kernel as kernels
    from autosp.compiler.attention.kernels import cuda_backend, sdpa_with_lse, sdpa_with_lse_backward

    m = kernels.machine()
    default, _ = kernels.choose(None, m)
    if m.device != "cuda":
        return [f"attention kernels: no CUDA device; SDPA's CPU flash kernel runs (kernel {default!r}), nothing to select"]
    lines = [f"attention kernels: sm{m.capability[0]}{m.capability[1]}, cuDNN {m.cudnn_version}; this machine runs "
             f"{', '.join(kernels.available(m))}; autosp-train selects {default} without a plan"]
    torch.manual_seed(0)
    b, h, n, d = SHAPE
    q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, KV_HEADS, n, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, KV_HEADS, n, d, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
    scale = d ** -0.5
    qr, kr, vr = (t.float().requires_grad_() for t in (q, k, v))
    ref_out, ref_lse = _reference(qr, kr, vr, scale)
    ref_out.backward(dout.float())
    refs = (ref_out.detach(), ref_lse.detach(), qr.grad, kr.grad, vr.grad)
    for kernel in [default] + [x for x in kernels.available(m) if x != default]:
        if kernels.sdpa_backends(kernel) is None:
            lines.append(f"  {kernel:<7} not an SDPA backend (its own entry point): the blockwise pieces keep SDPA's order")
            continue
        with kernels.sdpa_context(kernel):
            groups = h // KV_HEADS
            piece = cuda_backend(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), True)
            sdpa = _sdpa_kernel_name(q, k, v)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for attempt in range(3):  # the first call compiles/plans the kernel; the last one is timed
                start.record()
                out, lse = sdpa_with_lse(q, k, v, True, scale)
                grads = sdpa_with_lse_backward(dout, q, k, v, out, lse, True, scale)
                end.record()
            torch.cuda.synchronize()
        errors = [float((a.float() - r).abs().max() / r.abs().max().clamp_min(1e-6))
                  for a, r in zip((out, lse) + tuple(grads), refs)]
        lines.append(f"  {kernel:<7} blockwise pieces ran {piece} (SDPA itself: {sdpa}); forward+backward "
                     f"{start.elapsed_time(end):.2f} ms at {n} tokens; max relative error vs fp32 "
                     f"{max(errors):.1e} (out, lse, dq, dk, dv)")
    return lines


def main() -> int:
    for line in probe_lines():
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
