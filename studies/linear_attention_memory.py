"""A Gated DeltaNet layer's memory as the planner predicts it, next to a tiny Qwen3-Next measured on the CPU.

    python -m studies.linear_attention_memory            # ~4 minutes on 2 cores; results/linear_attention_memory.{txt,json}
    python -m studies.linear_attention_memory --tokens 4096 8192

What is measured: the linear-attention mixer (``linear_attn``) of a tiny transformers Qwen3-Next layer (hidden 256,
2 q/k heads and 4 value heads of 64, conv kernel 4; fp32) with autosp's Ulysses layer installed as
``autosp.compile`` installs it (compiler/linear_attention.py ``install``: projections, the op
``autosp_ops::gated_delta_core`` over the whole sequence in pieces of 4,096 tokens, gated norm, out projection; one
rank, so no all-to-all), compiled by Inductor as autosp-train runs it, and run eagerly beside it; transformers' torch
fallback runs the conv and the chunked delta rule (no flash-linear-attention on a CPU). Per token of the sequence:

- **saved for backward**: the bytes autograd keeps (saved-tensor hooks, distinct storages; the compiled function
  saves through them too), parameters and the mixer's input left out. Predicted: cost_models/linear_attention.py
  ``kept(..., "none")`` less the layer's input and norms (x, n1, h1, n2: 4 h and the norms' 8 B, which the
  layer keeps outside its mixer) plus ``state_bytes`` (the fp32 states entering each piece after the first);
- **backward peak**: the most bytes the mixer's backward allocates at once on top of what existed (the profiler's
  allocation events, :func:`studies.measure.memory.allocated_peak`). Predicted: ``mixer_phase_bytes(..., "none")``
  less the residual gradient (h per token, the layer's, not the mixer's).

And, once, the **fit** behind ``linear_attention.TORCH_FALLBACK_ELEMS``: the op alone (``gated_delta_core`` over one
piece) at nine shapes; its allocated backward peak less its whole-sequence input gradients, per value head and token,
against the cost model's formula, and the least-squares coefficients. The GPU kernel (flash-linear-attention), which
the planner prices for GPU plans, is not measured here (no GPU in this run): its per-head-token bytes are printed as
priced.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from studies.bootstrap import ensure_autosp

ensure_autosp()

import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MODELING = "transformers.models.qwen3_next.modeling_qwen3_next"
TINY = dict(hidden_size=256, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
            linear_value_head_dim=64, linear_conv_kernel_dim=4, vocab_size=64, layer_types=["linear_attention"],
            num_experts=0, mlp_only_layers=[0], use_cache=False)
FIT_SHAPES = ((1, 1, 32, 32), (1, 1, 64, 64), (1, 1, 128, 128), (1, 2, 64, 64), (1, 4, 64, 64), (2, 4, 128, 128),
              (1, 1, 64, 128), (1, 1, 128, 64), (2, 2, 32, 96))
"""(q/k heads, value heads, d_k, d_v) of the fit."""


def _saved_bytes(fn, leave_out: set):
    """(bytes of the distinct storages autograd saves while ``fn`` runs, less ``leave_out``'s, fn's result)."""
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in leave_out:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(saved.values()), out


def tiny_mixer():
    """The tiny Qwen3-Next's linear-attention mixer with autosp's layer installed (one rank), and its ModelSpec."""
    from types import SimpleNamespace

    import transformers

    from autosp.compiler.linear_attention import install
    from autosp.contract.specs import Candidate, ModelSpec

    config = transformers.Qwen3NextConfig(**TINY)
    torch.manual_seed(0)
    model = transformers.Qwen3NextForCausalLM(config)
    install(model, SimpleNamespace(candidate=Candidate(sp=1), rule=""))
    spec = ModelSpec(name="tiny-qwen3-next", n_layers=1, hidden=TINY["hidden_size"], n_heads=TINY["num_attention_heads"],
                     n_kv_heads=TINY["num_key_value_heads"], head_dim=TINY["head_dim"], ffn_hidden=TINY["intermediate_size"],
                     vocab=TINY["vocab_size"], attn_output_gate=True, linear_layers=(0,),
                     **{k: TINY[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                             "linear_value_head_dim", "linear_conv_kernel_dim")})
    return model.model.layers[0].linear_attn, spec


def predicted(spec, tokens: int) -> dict:
    """The cost model's saved bytes and backward peak of the mixer (module docstring), torch fallback, fp32."""
    from autosp.contract.specs import Candidate
    from autosp.cost_models import linear_attention as la

    ls = la.layout(spec, Candidate(sp=1), tokens, tokens, 4, spec.q_dim, spec.kv_dim, kernel="torch")
    elems, fixed = la.kept(ls, "none")
    saved = tokens * ((elems - 4 * ls.h) * 4 + fixed - 8) + la.state_bytes(ls)
    peak = la.mixer_phase_bytes(ls, "none") - tokens * ls.h * 4
    return {"saved": saved, "bwd_peak": peak, "states": la.state_bytes(ls), "piece": la.piece_bytes(ls)}


def measure_layer(mixer, tokens: int, compiled) -> dict:
    """Saved bytes and backward peak of ``mixer`` (eager) and ``compiled`` (Inductor) at ``tokens`` tokens."""
    from studies.measure.memory import allocated_peak

    params = list(mixer.parameters())
    leave_out = {p.untyped_storage().data_ptr() for p in params}
    out = {}
    for name, module in (("eager", mixer), ("compiled", compiled)):
        x = torch.randn(1, tokens, TINY["hidden_size"], generator=torch.Generator().manual_seed(1), requires_grad=True)
        if name == "compiled":
            module(x).sum().backward()  # compile at this length first (its own allocations are not the step's)
            x.grad = None
            for p in params:
                p.grad = None
        saved, y = _saved_bytes(lambda: module(x), leave_out | {x.untyped_storage().data_ptr()})
        upstream = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
        peak = allocated_peak(lambda: torch.autograd.grad(y, [x] + params, upstream))
        out[name] = {"saved": saved, "bwd_peak": peak}
        del y
    return out


def fit_kernel() -> dict:
    """The op alone over one piece at each of :data:`FIT_SHAPES`: its backward peak less the whole-sequence input
    gradients (d_qkv, d_weight, the fp32 d_g and d_beta), per value head and token, against the cost model's."""
    import numpy as np

    from autosp.compiler.linear_attention import PIECE_TOKENS, gated_delta_core
    from autosp.cost_models import linear_attention as la
    from studies.measure.memory import allocated_peak

    rows, design = [], []
    for nk, nv, dk, dv in FIT_SHAPES:
        tokens = PIECE_TOKENS
        channels = 2 * nk * dk + nv * dv
        gen = torch.Generator().manual_seed(0)
        inputs = [torch.randn(1, tokens, channels, generator=gen), torch.randn(channels, 4, generator=gen) / 2,
                  -torch.rand(1, tokens, nv, generator=gen) / 4, torch.rand(1, tokens, nv, generator=gen)]
        leaves = [t.clone().requires_grad_() for t in inputs]
        out, _ = gated_delta_core(*leaves, nk, dk, "silu", MODELING, "", PIECE_TOKENS)
        upstream = torch.randn(out.shape, generator=gen)
        peak = allocated_peak(lambda: torch.autograd.grad(out, leaves, upstream))
        accumulators = tokens * (channels * 4 + nv * 8) + channels * 4 * 4
        measured = (peak - accumulators) / tokens / nv
        shape = la.LinearShape(layers=1, n_layers=1, nk=nk, nv=nv, dk=dk, dv=dv, kernel_taps=4, U=1, replicas=1, h=1,
                               e=4, s=tokens, S_pad=tokens, b=1, q=1, k_eff=1, gate=False, kernel="torch")
        priced = la.kernel_bytes_per_head_token(shape)
        rows.append({"nk": nk, "nv": nv, "dk": dk, "dv": dv, "measured": measured, "predicted": priced})
        design.append([dk, dv, la.CHUNK, dk * dv / la.CHUNK])
    coef, *_ = np.linalg.lstsq(np.array(design, float), np.array([r["measured"] for r in rows]) / 4, rcond=None)
    return {"rows": rows, "fitted_elems": [float(c) for c in coef], "priced_elems": list(la.TORCH_FALLBACK_ELEMS)}


def measure(tokens: list[int], fit: bool = True) -> dict:
    from autosp.cost_models import linear_attention as la

    mixer, spec = tiny_mixer()
    compiled = torch.compile(mixer, backend="inductor", dynamic=False)
    rows = []
    for n in tokens:
        got = measure_layer(mixer, n, compiled)
        rows.append({"tokens": n, "predicted": predicted(spec, n), **got})
    fla = la.LinearShape(layers=1, n_layers=1, nk=16, nv=32, dk=128, dv=128, kernel_taps=4, U=8, replicas=1,
                         h=2048, e=2, s=1, S_pad=1, b=1, q=1, k_eff=1, gate=True, kernel="fla")
    return {"tiny": TINY, "dtype": "fp32", "rows": rows, "fit": fit_kernel() if fit else None,
            "fla_bytes_per_head_token_128": la.kernel_bytes_per_head_token(fla)}


def render(result: dict) -> str:
    t = result["tiny"]
    lines = [f"Gated DeltaNet mixer of a tiny Qwen3-Next (hidden {t['hidden_size']}, {t['linear_num_key_heads']} q/k + "
             f"{t['linear_num_value_heads']} value heads of {t['linear_key_head_dim']}, conv {t['linear_conv_kernel_dim']}), "
             "autosp's layer on one rank, fp32, CPU, transformers' torch fallback (python -m studies.linear_attention_memory)",
             "bytes per token of the sequence; compiled = Inductor (what autosp-train runs), eager shown beside it",
             f"{'tokens':>7}{'saved pred':>11}{'compiled':>10}{'ratio':>7}{'eager':>8}"
             f"{'bwd peak pred':>14}{'compiled':>10}{'ratio':>7}{'eager':>8}"]
    for row in result["rows"]:
        n, p, c, e = row["tokens"], row["predicted"], row["compiled"], row["eager"]
        lines.append(f"{n:>7}{p['saved'] / n:>11,.0f}{c['saved'] / n:>10,.0f}{p['saved'] / c['saved']:>7.3f}"
                     f"{e['saved'] / n:>8,.0f}{p['bwd_peak'] / n:>14,.0f}{c['bwd_peak'] / n:>10,.0f}"
                     f"{p['bwd_peak'] / c['bwd_peak']:>7.3f}{e['bwd_peak'] / n:>8,.0f}")
    fit = result["fit"]
    if fit is None:
        return "\n".join(lines)
    lines += ["", "fit: the op's backward over one 4,096-token piece less its whole-sequence input gradients, bytes per "
              "value head and token (torch fallback, fp32)",
              f"{'q/k':>4}{'v':>3}{'d_k':>5}{'d_v':>5}{'measured':>10}{'priced':>9}{'ratio':>7}"]
    for r in fit["rows"]:
        lines.append(f"{r['nk']:>4}{r['nv']:>3}{r['dk']:>5}{r['dv']:>5}{r['measured']:>10,.0f}{r['predicted']:>9,.0f}"
                     f"{r['predicted'] / r['measured']:>7.3f}")
    a, b, c, d = fit["fitted_elems"]
    pa, pb, pc, pd = fit["priced_elems"]
    lines += [f"least squares, fp32 elements: {a:.1f} d_k + {b:.1f} d_v + {c:.1f} C + {d:.2f} d_k d_v / C (C = 64); "
              f"priced (linear_attention.TORCH_FALLBACK_ELEMS): {pa} d_k + {pb} d_v + {pc} C + {pd} d_k d_v / C",
              f"GPU plans price flash-linear-attention's kernel instead (not measured here): "
              f"{result['fla_bytes_per_head_token_128']:,.0f} B per value head and token at d_k = d_v = 128"]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    ap.add_argument("--no-fit", action="store_true", help="leave out the kernel fit")
    ap.add_argument("--out", default=str(RESULTS / "linear_attention_memory"), help="OUT.json and OUT.txt")
    args = ap.parse_args(argv)
    if min(args.tokens) < 1:
        ap.error("--tokens must be positive")
    from studies.measure.compare import environment, write_json

    result = {**measure(args.tokens, fit=not args.no_fit), "environment": environment()}
    print(render(result))
    write_json(Path(args.out + ".json"), result)
    Path(args.out + ".txt").write_text(render(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
