"""The experts' forward + backward: autosp's experts op next to Hugging Face's own implementations, side by side.

    python -m studies.moe_experts_speed                  # ~2 minutes on 2 cores; results/moe_experts_speed.{txt,json}
    python -m studies.moe_experts_speed --experts 128 --rounds 5

One transformers ``Qwen3MoeExperts`` module (fp32, random weights; 64 experts of hidden 256 and expert width 512 by
default, 4,096 tokens routed to 8 experts each by a random router) runs forward and backward (the gradients of the
tokens, the routing weights and both expert weights) under each ``config._experts_implementation``: ``eager``
(transformers' loop over the experts hit, indexing the 3-D weights per expert), ``grouped_mm`` (transformers'
grouped GEMM, where it runs on this machine) and ``autosp_ep`` (compiler/experts.py, what
``autosp.compile`` installs; no expert-parallel group here). Rounds alternate the implementations, so that a slow
phase of the machine hits all of them; each time is the median of the rounds. Every implementation's output and
gradients are compared with ``eager``'s (``max_rel_error``: the largest of their relative errors, ||a - b|| / ||b||;
fp32: <= 1e-5).

Why: indexing the stacked weights per expert makes each expert's backward a zero tensor of all the experts' size;
summing them is E passes over the layer's expert weights. autosp's op splits the weights once (``unbind``), and
its backward stacks the experts' gradients once.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from studies.bootstrap import ensure_autosp

ensure_autosp()

import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
IMPLEMENTATIONS = ("eager", "grouped_mm", "autosp_ep")
"""(transformers' ``batched_mm`` is left out: it gathers each routed token's expert weights, T x k weight matrices,
and took 13x autosp's time at 16 experts and 512 tokens here.)"""


def _module(experts: int, hidden: int, inner: int):
    import transformers
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    from autosp.compiler import experts as autosp_experts

    config = transformers.Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=inner, num_experts=experts,
                                         num_experts_per_tok=8, hidden_act="silu")
    module = Qwen3MoeExperts(config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        module.gate_up_proj.copy_(torch.randn(module.gate_up_proj.shape, generator=gen) / hidden ** 0.5)
        module.down_proj.copy_(torch.randn(module.down_proj.shape, generator=gen) / inner ** 0.5)
    autosp_experts._register()
    module._autosp_act = config.hidden_act
    return module


def _inputs(module, tokens: int):
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(tokens, module.hidden_dim, generator=gen, requires_grad=True)
    logits = torch.randn(tokens, module.num_experts, generator=gen)
    weights, index = torch.softmax(logits, dim=-1).topk(module.config.num_experts_per_tok, dim=-1)
    weights = (weights / weights.sum(-1, keepdim=True)).requires_grad_(True)
    return hidden, index, weights


def _run(module, impl: str, hidden, index, weights):
    module.config._experts_implementation = impl
    out = module(hidden, index, weights)
    upstream = torch.ones_like(out)
    grads = torch.autograd.grad(out, (hidden, weights, module.gate_up_proj, module.down_proj), upstream)
    return out.detach(), grads


def measure(experts: int, hidden: int, inner: int, tokens: int, rounds: int) -> dict:
    from autosp.compiler.testing import rel_err

    module = _module(experts, hidden, inner)
    inputs = _inputs(module, tokens)
    reference = _run(module, "eager", *inputs)
    rows = {}
    for impl in IMPLEMENTATIONS:
        try:
            out, grads = _run(module, impl, *inputs)  # also the warm-up
        except Exception as err:  # noqa: BLE001 - an implementation this machine lacks is a finding, not a crash
            rows[impl] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"}
            continue
        errors = [rel_err(out, reference[0])] + [rel_err(g, r) for g, r in zip(grads, reference[1])]
        rows[impl] = {"seconds": [], "max_rel_error": max(errors)}
    for _ in range(rounds):
        for impl, row in rows.items():
            if "error" in row:
                continue
            t0 = time.perf_counter()
            _run(module, impl, *inputs)
            row["seconds"].append(time.perf_counter() - t0)
    for row in rows.values():
        if "seconds" in row:
            row["median"] = statistics.median(row["seconds"])
    return {"experts": experts, "hidden": hidden, "inner": inner, "tokens": tokens, "top_k": 8, "rounds": rounds,
            "threads": torch.get_num_threads(), "torch": torch.__version__, "rows": rows}


def render(result: dict) -> str:
    ours = result["rows"]["autosp_ep"].get("median")
    lines = [f"experts forward + backward: transformers Qwen3MoeExperts, {result['experts']} experts of hidden "
             f"{result['hidden']} and width {result['inner']}, {result['tokens']} tokens x top-{result['top_k']}, "
             f"fp32, {result['threads']} threads, torch {result['torch']}; median of {result['rounds']} "
             f"alternating rounds",
             f"{'implementation':<14}{'seconds':>9}{'x autosp':>10}{'max rel err vs eager':>22}"]
    for impl, row in result["rows"].items():
        if "error" in row:
            lines.append(f"{impl:<14}  does not run here: {row['error']}")
            continue
        ratio = row["median"] / ours if ours else float("nan")
        lines.append(f"{impl:<14}{row['median']:9.3f}{ratio:10.2f}{row['max_rel_error']:22.1e}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inner", type=int, default=512, help="each expert's intermediate width")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=str(RESULTS / "moe_experts_speed"), help="OUT.json and OUT.txt")
    args = ap.parse_args(argv)
    if min(args.experts, args.hidden, args.inner, args.tokens, args.rounds) < 1 or args.experts < 8:
        ap.error("sizes and --rounds must be positive, --experts at least 8 (top-8 routing)")
    result = measure(args.experts, args.hidden, args.inner, args.tokens, args.rounds)
    text = render(result)
    print(text)
    Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
    Path(args.out + ".txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
