"""Can the CPU attention backward be made faster by calling torch's kernel on row blocks? (issue 23, item 4)

Attention is about two thirds of the SP step of ``profile_step.py`` and runs the same kernel in autosp and ALST
(``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward), so only a faster attention than that
kernel's could move the memory-lean plan's step well below ALST's. Two of the kernel's habits cost time at the
study's shapes: it computes every 512-key block on the causal diagonal whole (12.5% masked work at 4k tokens),
and its backward works on 256 x 512 score blocks whose two fp32 buffers (1 MiB) overflow a 1 MiB L2 cache.

This study times the alternative that needs no kernel of its own: the backward of causal attention as one
kernel call per block of ``--rows`` query rows (a causal call on the diagonal block, a non-causal call over the
keys before it; small query blocks make the kernel take 32-row score blocks), the gradients summed. The forward
and its log-sum-exp are the single call's, so the result is the same attention (checked: worst relative
difference of the gradients). The variants take turns round by round; printed: the median time of each and its
ratio to the single call, per shape and thread count.

Run:  .venv/bin/python studies/cpu_attention_rows.py [--rounds 7]    (about a minute)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

aten = torch.ops.aten
FORWARD = aten._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default

SHAPES = (  # (tokens, query heads, key/value heads, head dim, dtype): the study's per-rank shape first
    (4096, 2, 1, 32, torch.float32),
    (2048, 2, 1, 32, torch.float32),
    (8192, 2, 1, 32, torch.float32),
    (4096, 4, 4, 64, torch.float32),
    (4096, 2, 1, 128, torch.float32),
    (4096, 2, 1, 64, torch.bfloat16),
)


def backward_in_rows(dout, q, k, v, out, lse, rows: int):
    """(dq, dk, dv) of causal attention, one causal and one non-causal kernel call per block of query rows."""
    n = q.shape[2]
    dq = torch.empty_like(q)
    dk = torch.zeros(k.shape, dtype=torch.float32)
    dv = torch.zeros(v.shape, dtype=torch.float32)
    for start in range(0, n, rows):
        r = slice(start, min(start + rows, n))
        args = (dout[:, :, r], q[:, :, r])
        gq, gk, gv = BACKWARD(*args, k[:, :, r], v[:, :, r], out[:, :, r], lse[:, :, r], 0.0, True)
        dk[:, :, r] += gk
        dv[:, :, r] += gv
        if start:
            before = slice(0, start)
            gq2, gk2, gv2 = BACKWARD(*args, k[:, :, before], v[:, :, before], out[:, :, r], lse[:, :, r], 0.0, False)
            gq = gq.float() + gq2
            dk[:, :, before] += gk2
            dv[:, :, before] += gv2
        dq[:, :, r] = gq
    return dq, dk.to(k.dtype), dv.to(v.dtype)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def measure(shape, rows_options, rounds: int) -> dict:
    n, hq, hkv, d, dtype = shape
    gen = torch.Generator().manual_seed(0)
    q, dout = (torch.randn(1, hq, n, d, generator=gen).to(dtype) for _ in range(2))
    k, v = (torch.randn(1, hkv, n, d, generator=gen).to(dtype) for _ in range(2))
    out, lse = FORWARD(q, k, v, 0.0, True)[:2]
    variants = {"single call": lambda: BACKWARD(dout, q, k, v, out, lse, 0.0, True)}
    variants |= {f"rows {r}": (lambda r=r: backward_in_rows(dout, q, k, v, out, lse, r)) for r in rows_options}
    reference = variants["single call"]()
    errors = {name: max(rel_err(a, b) for a, b in zip(fn(), reference)) for name, fn in variants.items()}
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    single = statistics.median(times["single call"])
    return {name: {"ms": statistics.median(t) * 1e3, "x_single": statistics.median(t) / single,
                   "rel_err": errors[name]} for name, t in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rows", default="64,128,256", help="query rows per block, comma-separated")
    parser.add_argument("--threads", default="1,2", help="torch thread counts to run, comma-separated")
    args = parser.parse_args(argv)
    rows_options = [int(r) for r in args.rows.split(",")]
    print(f"torch {torch.__version__}; backward time over the single kernel call's (median of {args.rounds} rounds)")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for shape in SHAPES:
            n, hq, hkv, d, dtype = shape
            result = measure(shape, rows_options, args.rounds)
            cells = "  ".join(f"{name} {r['x_single']:.2f}x" for name, r in result.items() if name != "single call")
            worst = max(r["rel_err"] for r in result.values())
            print(f"threads {threads}  {n:>5} tokens {hq}/{hkv} heads d {d:>3} {str(dtype)[6:]:<8}  single "
                  f"{result['single call']['ms']:7.1f} ms  {cells}  (worst rel. err {worst:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
