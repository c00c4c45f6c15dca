"""Memory of one Gated DeltaNet layer's sequence-mixing core per rank: autosp's op next to transformers' own code.

    python -m studies.gated_delta_memory          # ~1 minute on 2 cores; results/gated_delta_memory.{txt,json}
    python -m studies.gated_delta_memory --sp 4 --tokens 4096 8192

What ``autosp.compile`` runs for a Qwen3-Next / Qwen3.5 linear-attention layer after the head all-to-all
(compiler/linear_attention.py): ``autosp_ops::gated_delta_core`` on this rank's heads over the whole sequence.
Default shape: Qwen3-Next-80B-A3B's linear layers (16 q/k heads and 32 value heads of 128, conv kernel 4;
transformers' Qwen3NextConfig defaults, the model's config.json on the Hugging Face hub) over 8 Ulysses ranks:
2 q/k heads and 4 value heads per rank. fp32 (CPU), one sequence, transformers' torch fallback (no
flash-linear-attention here). Per token of the sequence, each measured exactly, in one run:

- ``op saved``: what the op keeps for its backward (saved-tensor hooks): its inputs (pre-conv q/k/v channels,
  g, beta, the conv weights) and the fp32 state entering each piece (``PIECE_TOKENS``);
- ``op fwd peak`` / ``op bwd peak``: the most bytes the op's forward / backward allocates at once on top of what
  existed (the profiler's allocation events, :func:`studies.measure.memory.allocated_peak`); the backward
  recomputes one piece at a time, and returns the inputs' gradients (the size of what the op saved);
- ``hf saved`` / ``hf bwd peak``: transformers' own conv + ``torch_chunk_gated_delta_rule`` run on the whole
  sequence under autograd (what the layer holds when its code is simply traced, as without autosp): it keeps
  its state once per 64-token chunk and more, so both grow with the sequence;
- ``held``: saved + backward peak, the most the core holds during its backward.

The op's output is checked against transformers' (``max_rel_error``, fp32: <= 1e-5).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from studies.bootstrap import ensure_autosp

ensure_autosp()

import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MODELING = "transformers.models.qwen3_next.modeling_qwen3_next"


def _saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd saves while ``fn`` runs."""
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(saved.values()), out


def measure_one(tokens: int, n_k: int, n_v: int, dk: int, dv: int, kernel: int, piece: int) -> dict:
    from autosp.compiler.linear_attention import _run_piece, gated_delta_core
    from autosp.compiler.testing import rel_err
    from studies.measure.memory import allocated_peak

    modeling = importlib.import_module(MODELING)
    gen = torch.Generator().manual_seed(0)
    channels = 2 * n_k * dk + n_v * dv
    inputs = [torch.randn(1, tokens, channels, generator=gen), torch.randn(channels, kernel, generator=gen) / 2,
              -torch.rand(1, tokens, n_v, generator=gen) / 4, torch.rand(1, tokens, n_v, generator=gen)]
    leaves = [t.clone().requires_grad_() for t in inputs]

    def op():
        return gated_delta_core(*leaves, n_k, dk, "silu", MODELING, "", piece)

    op_saved, (out, _) = _saved_bytes(op)
    op_fwd = allocated_peak(op)
    upstream = torch.randn(out.shape, generator=gen)
    op_bwd = allocated_peak(lambda: torch.autograd.grad(out, leaves, upstream))
    del out
    hf_leaves = [t.clone().requires_grad_() for t in inputs]

    def hf():
        return _run_piece(modeling, *hf_leaves, n_k, dk, "silu", 0, None, final=False)[0]

    hf_saved, hf_out = _saved_bytes(hf)
    hf_bwd = allocated_peak(lambda: torch.autograd.grad(hf_out, hf_leaves, upstream))
    with torch.no_grad():
        error = rel_err(gated_delta_core(*inputs, n_k, dk, "silu", MODELING, "", piece)[0], hf_out)
    per = {"op_saved": op_saved, "op_fwd_peak": op_fwd, "op_bwd_peak": op_bwd, "hf_saved": hf_saved,
           "hf_bwd_peak": hf_bwd}
    return {"tokens": tokens, "bytes": per, "per_token": {k: v / tokens for k, v in per.items()},
            "max_rel_error": error}


def measure(tokens: list[int], heads_k: int, heads_v: int, dk: int, dv: int, kernel: int, sp: int,
            piece: int) -> dict:
    from autosp.compiler.linear_attention import head_slice, split_reason

    reason = split_reason(heads_k, heads_v, sp)
    if reason:
        raise SystemExit(f"--sp {sp}: {reason}")
    part = head_slice(heads_k, heads_v, sp, 0, "")
    n_k, n_v = part.k1 - part.k0, part.v1 - part.v0
    rows = [measure_one(t, n_k, n_v, dk, dv, kernel, piece) for t in tokens]
    return {"heads_k": heads_k, "heads_v": heads_v, "dk": dk, "dv": dv, "kernel": kernel, "sp": sp, "piece": piece,
            "local_heads_k": n_k, "local_heads_v": n_v, "state_bytes": n_v * dk * dv * 4, "dtype": "fp32",
            "torch": torch.__version__, "rows": rows}


def render(result: dict) -> str:
    r = result
    lines = [f"Gated DeltaNet core per rank: {r['heads_k']} q/k and {r['heads_v']} v heads (d_k {r['dk']}, d_v "
             f"{r['dv']}, conv {r['kernel']}) over {r['sp']} Ulysses ranks = {r['local_heads_k']} q/k + "
             f"{r['local_heads_v']} v heads per rank; {r['dtype']}, one sequence, transformers' torch fallback; "
             f"pieces of {r['piece']} tokens; the recurrent state of the rank's heads: {r['state_bytes']:,} bytes",
             "bytes per token of the sequence (hf = transformers' code over the whole sequence under autograd; "
             "held in backward = saved + backward peak)",
             f"{'tokens':>8}{'op saved':>10}{'op fwd peak':>13}{'op bwd peak':>13}{'op held':>10}{'hf saved':>10}"
             f"{'hf bwd peak':>13}{'hf held':>10}{'hf/op held':>12}{'max rel err':>13}"]
    for row in r["rows"]:
        p = row["per_token"]
        op_held, hf_held = p["op_saved"] + p["op_bwd_peak"], p["hf_saved"] + p["hf_bwd_peak"]
        lines.append(f"{row['tokens']:>8}{p['op_saved']:>10,.0f}{p['op_fwd_peak']:>13,.0f}{p['op_bwd_peak']:>13,.0f}"
                     f"{op_held:>10,.0f}{p['hf_saved']:>10,.0f}{p['hf_bwd_peak']:>13,.0f}{hf_held:>10,.0f}"
                     f"{hf_held / op_held:>12.2f}{row['max_rel_error']:>13.1e}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--heads-k", type=int, default=16)
    ap.add_argument("--heads-v", type=int, default=32)
    ap.add_argument("--dk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--kernel", type=int, default=4)
    ap.add_argument("--sp", type=int, default=8, help="Ulysses ranks the heads are split over")
    ap.add_argument("--piece", type=int, default=None, help="the op's piece length (default PIECE_TOKENS)")
    ap.add_argument("--out", default=str(RESULTS / "gated_delta_memory"), help="OUT.json and OUT.txt")
    args = ap.parse_args(argv)
    from autosp.compiler.linear_attention import PIECE_TOKENS

    piece = args.piece or PIECE_TOKENS
    if min(*args.tokens, args.heads_k, args.heads_v, args.dk, args.dv, args.kernel, args.sp, piece) < 1:
        ap.error("every size must be a positive integer")
    result = measure(args.tokens, args.heads_k, args.heads_v, args.dk, args.dv, args.kernel, args.sp, piece)
    text = render(result)
    print(text)
    Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
    Path(args.out + ".txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
