"""Planner benchmark: speed, caching and search quality of ``autosp-plan``, and its max-context
predictions next to ALST's published numbers.

    .venv/bin/python studies/planner_bench.py          # prints, and writes studies/results/planner_bench.txt

For each (model, ctx, hardware) case, from one run:

- ``cold``: wall time of a fresh ``autosp-plan ... --json`` process (imports included) with an empty
  plan cache; ``cached``: the same command again (answered from the cache);
- Optuna search: trials and cost-model evaluations, best predicted tokens/s;
- exhaustive search over the same space: evaluations (= the space size) and best tokens/s;
- ratio = Optuna best / exhaustive best (1.0000 = the optimum).

Then the longest trainable context of Llama-3.1-8B on 1 and 8 H100s (``--objective max-ctx``) next to
ALST (arXiv 2506.13996: 500K tokens on 1 H100, 3.7M on 8). ALST's published recipes
(snowflakedb/ArcticTraining projects/sequence-parallelism/run-h100-sp{1,8}-llama-8b.yml) use ZeRO-3
with ``offload_optimizer`` (both) and ``offload_param`` (1 GPU only); autosp's space has both (parameter
offload since issue 14: docs/cost_model.md section 13).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autosp.contract.specs import Candidate, from_dict
from autosp.errors import InfeasibleError
from autosp.planner.api import plan_for
from autosp.planner.request import PlanRequest
from autosp.units import format_gib, format_tokens

CASES = [  # (model, ctx, hardware, global batch)
    ("llama-3.1-8b", "200k", "h100x8", None),
    ("llama-3.2-1b", "32k", "a100-80gx8", None),
    ("qwen2.5-7b", "500k", "h200x8", None),
    ("llama-3.1-70b", "128k", "h100x32", None),
    ("llama-3.1-8b", "16k", "h100x16", 64),
]
ALST = {"h100": 500_000, "h100x8": 3_700_000}
RESULTS = Path(__file__).resolve().parent / "results" / "planner_bench.txt"
GRANULE = 1024


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("autosp-plan")
    return [str(script)] if script.exists() else [sys.executable, "-m", "autosp.planner.cli.main"]


def timed_cli(args: list[str], cache: str) -> tuple[float, dict]:
    started = time.perf_counter()
    out = subprocess.run(_cli() + args + ["--json", "--cache", cache], capture_output=True, text=True, check=True)
    return time.perf_counter() - started, json.loads(out.stdout)


def search_rows(lines: list[str]) -> None:
    head = (f"{'model':<14}{'ctx':>6} {'hardware':<11}{'gb':>4} | {'cold s':>6} {'cached s':>8} | "
            f"{'trials':>6} {'evals':>6} {'default tok/s':>13} | {'evals':>6} {'exhaust tok/s':>13} {'s':>5} | "
            f"{'ratio':>6}  plan (default search)")
    lines += [head, "-" * len(head)]
    for model, ctx, hw, gb in CASES:
        args = ["--model", model, "--ctx", ctx, "--hw", hw] + (["--global-batch", str(gb)] if gb else [])
        with tempfile.TemporaryDirectory() as tmp:
            cache = os.path.join(tmp, "plans.sqlite")
            cold, plan = timed_cli(args, cache)
            cached, again = timed_cli(args, cache)
        assert plan["search"]["cache"] == "miss" and again["search"]["cache"] == "hit"
        started = time.perf_counter()
        full = plan_for(PlanRequest(model=model, ctx=ctx, hw=hw, global_batch=gb, search="exhaustive"))
        full_s = time.perf_counter() - started
        tps, best = plan["estimate"]["tokens_per_second"], full.estimate.tokens_per_second
        short = from_dict(Candidate, plan["candidate"]).short()
        lines.append(
            f"{model:<14}{ctx:>6} {hw:<11}{gb or '-':>4} | {cold:>6.2f} {cached:>8.2f} | "
            f"{plan['search']['trials'] or '-':>6} {plan['search']['evaluations']:>6} {tps:>13,.0f} | "
            f"{full.search['evaluations']:>6} {best:>13,.0f} {full_s:>5.1f} | {tps / best:>6.4f}  {short}")
        print(lines[-1], flush=True)


def _fits_without(model, hw, workload, cand, drop: tuple[str, ...]) -> bool:
    from autosp.cost_models import estimate

    est = estimate(model, hw, workload, cand)
    kept = est.memory.total - sum(getattr(est.memory, name) for name in drop)
    return kept <= est.capacity_bytes


def what_if_max_ctx(model, hw, cand, drop: tuple[str, ...]) -> int:
    """Longest context (multiple of GRANULE) of ``cand`` with the ``drop`` memory components off the GPU."""
    from autosp.contract.specs import Workload

    def ok(units: int) -> bool:
        return _fits_without(model, hw, Workload(seq_len=units * GRANULE), cand, drop)

    lo, hi = 0, 1
    while ok(hi) and hi < 2**24:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo * GRANULE


def max_ctx_rows(lines: list[str]) -> None:
    from autosp.cost_models.catalog.hardware import resolve_hardware
    from autosp.cost_models.catalog.models import resolve_model

    model = resolve_model("llama-3.1-8b")
    for hw_name, alst in ALST.items():
        hw = resolve_hardware(hw_name)
        started = time.perf_counter()
        try:
            plan = plan_for(PlanRequest(model=model, hw=hw, objective="max-ctx"))
        except InfeasibleError as err:
            lines += [f"Llama-3.1-8B on {hw.world_size} x H100 ({hw_name}): {err}", ""]
            print("\n".join(lines[-2:]), flush=True)
            continue
        seconds = time.perf_counter() - started
        ctx, cand, mem = plan.workload.seq_len, plan.candidate, plan.estimate.memory
        exhaustive = plan_for(PlanRequest(model=model, hw=hw, objective="max-ctx",
                                          search="exhaustive")).workload.seq_len
        lines += [
            f"Llama-3.1-8B on {hw.world_size} x H100 ({hw_name}):",
            f"  autosp predicted max context : {format_tokens(ctx)} ({ctx:,})   [optuna {seconds:.1f} s; "
            f"exhaustive search agrees: {exhaustive == ctx}]",
            f"  ALST published               : {format_tokens(alst)} ({alst:,})   -> autosp / ALST = {ctx / alst:.2f}",
            f"  plan: {cand.short()}",
            f"  GPU memory at that context   : parameters {format_gib(mem.parameters)}, gradients "
            f"{format_gib(mem.gradients)}, optimizer {format_gib(mem.optimizer_states)}, activations "
            f"{format_gib(mem.activations)}, logits+loss {format_gib(mem.logits_loss)}, buffers "
            f"{format_gib(mem.comm_buffers)}, reserve {format_gib(mem.reserve)}",
        ]
        if hw.world_size == 1 and not cand.offload_param:
            with_params = what_if_max_ctx(model, hw, cand, ("parameters", "gradients"))
            lines.append(f"  what-if, parameters offloaded too (ALST's 1-GPU recipe sets offload_param): "
                         f"{format_tokens(with_params)} ({with_params / alst:.2f} x ALST)")
        lines.append("")
        print("\n".join(lines[-7:]), flush=True)


EXPLANATION = """\
Why the numbers differ from ALST's
- Not the same recipe: besides ALST's knobs (ZeRO-3, optimizer and, on one GPU, parameter offload, tiled
  logits+loss, checkpoint offload) the planner runs each decoder layer in sequence chunks (FPDT's idea,
  docs/cost_model.md section 11), which ALST does not; with chunks off and ALST's recipe pinned (`--fix`) the
  planner gives 727k and 4.51M (commands in docs/cost_model.md section 8). The search is not the gap: the
  exhaustive search agrees with Optuna.
- ALST's lengths are lengths that ran, not maxima; the cost model reproduces every published ALST run as
  fitting and its iteration time within 7% from 1M tokens (studies/published_gpu.py), but it may still be
  optimistic about the boundary: the analytic model has no allocator
  fragmentation beyond its fixed reserve fraction, no growth of flash-attention / NCCL workspaces with
  the sequence, and none of the copies the Hugging Face code path makes (position ids, masks,
  Liger/loss-tiling buffers, the all-to-all staging buffers of a real Ulysses implementation).
- ALST's numbers are round lengths that ran, not searched boundaries: its 8-GPU recipe sets max_length
  3,800,000 (the paper reports 3.7M) and its 1-GPU recipe 500,000, with a comment that 555,000 failed in
  a Triton kernel (illegal memory access); the planner bisects to the memory boundary in 1,024-token steps.
- What it means: treat the planner's max-ctx as optimistic by a third to a half until the memory model is
  calibrated against measured peaks (autosp-calibrate); for throughput plans at a fixed context the
  headroom the report prints is the margin to watch.
"""


def main() -> int:
    lines = ["autosp planner benchmark", f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
             f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}", ""]
    print("\n".join(lines), flush=True)
    lines.append("Search: cold/cached = wall time of a fresh `autosp-plan --json` process; the default search (whole "
                 "spaces priced in bulk up to 1.5M candidates, else Optuna) vs exhaustive")
    search_rows(lines)
    lines.append("")
    lines.append("Maximum trainable context (--objective max-ctx), Llama-3.1-8B, bf16, AdamW")
    print(lines[-1], flush=True)
    max_ctx_rows(lines)
    lines.append(EXPLANATION)
    print(EXPLANATION)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
