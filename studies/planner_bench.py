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
ALST (arXiv 2506.13996: 500K tokens on 1 H100, 3.7M on 8), plus a what-if that moves the model states
to host memory the way ALST's published recipes do (ZeRO-3 with ``offload_optimizer`` on 8 GPUs, and
``offload_optimizer`` + ``offload_param`` on 1 GPU; snowflakedb/ArcticTraining
projects/sequence-parallelism/run-h100-sp{1,8}-llama-8b.yml). autosp's search space has no
optimizer/parameter offload knob, so the what-if evaluates the cost model with those bytes removed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autosp.errors import InfeasibleError
from autosp.planner.api import make_plan
from autosp.planner.units import format_gib, format_tokens

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
    return [str(script)] if script.exists() else [sys.executable, "-m", "autosp.planner.cli"]


def timed_cli(args: list[str], cache: str) -> tuple[float, dict]:
    started = time.perf_counter()
    out = subprocess.run(_cli() + args + ["--json", "--cache", cache], capture_output=True, text=True, check=True)
    return time.perf_counter() - started, json.loads(out.stdout)


def search_rows(lines: list[str]) -> None:
    head = (f"{'model':<14}{'ctx':>6} {'hardware':<11}{'gb':>4} | {'cold s':>6} {'cached s':>8} | "
            f"{'trials':>6} {'evals':>6} {'optuna tok/s':>13} | {'evals':>6} {'exhaust tok/s':>13} {'s':>5} | "
            f"{'ratio':>6}  plan (optuna)")
    lines += [head, "-" * len(head)]
    for model, ctx, hw, gb in CASES:
        args = ["--model", model, "--ctx", ctx, "--hw", hw] + (["--global-batch", str(gb)] if gb else [])
        with tempfile.TemporaryDirectory() as tmp:
            cache = os.path.join(tmp, "plans.sqlite")
            cold, plan = timed_cli(args, cache)
            cached, again = timed_cli(args, cache)
        assert plan["search"]["cache"] == "miss" and again["search"]["cache"] == "hit"
        started = time.perf_counter()
        full = make_plan(model, ctx, hw, global_batch=gb, search="exhaustive")
        full_s = time.perf_counter() - started
        tps, best = plan["estimate"]["tokens_per_second"], full.estimate.tokens_per_second
        cand = plan["candidate"]
        short = (f"sp{cand['sp']} dp{cand['dp']} z{cand['zero_stage']} mb{cand['micro_batch']} "
                 f"ga{cand['grad_accum']} {cand['checkpointing']} mlp/{cand['mlp_chunks']} "
                 f"loss/{cand['loss_chunks']}{' offload' if cand['offload_activations'] else ''} {cand['overlap']}")
        lines.append(
            f"{model:<14}{ctx:>6} {hw:<11}{gb or '-':>4} | {cold:>6.2f} {cached:>8.2f} | "
            f"{plan['search']['trials']:>6} {plan['search']['evaluations']:>6} {tps:>13,.0f} | "
            f"{full.search['evaluations']:>6} {best:>13,.0f} {full_s:>5.1f} | {tps / best:>6.4f}  {short}")
        print(lines[-1], flush=True)


def _non_state_fits(model, hw, workload, cand, drop: tuple[str, ...]) -> bool:
    from autosp.cost_models import estimate

    est = estimate(model, hw, workload, cand)
    kept = est.memory.total - sum(getattr(est.memory, name) for name in drop)
    return kept <= est.capacity_bytes


def what_if_max_ctx(plan_model, hw, cand, drop: tuple[str, ...]) -> int:
    """Longest context (multiple of GRANULE) with the ``drop`` memory components moved off the GPU."""
    from autosp.cost_models.specs import Workload

    def ok(units: int) -> bool:
        return _non_state_fits(plan_model, hw, Workload(seq_len=units * GRANULE), cand, drop)

    lo, hi = 0, 1
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi > 2**24:
            break
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo * GRANULE


def max_ctx_rows(lines: list[str]) -> None:
    from autosp.planner.hardware import resolve_hardware
    from autosp.planner.models import resolve_model
    from autosp.planner.space import build_space
    from autosp.cost_models.specs import Workload

    model = resolve_model("llama-3.1-8b")
    for hw_name, alst in ALST.items():
        hw = resolve_hardware(hw_name)
        started = time.perf_counter()
        try:
            plan = make_plan(model, None, hw, objective="max-ctx")
            ctx, cand, note = plan.workload.seq_len, plan.candidate, ""
            exhaustive = make_plan(model, None, hw, objective="max-ctx", search="exhaustive").workload.seq_len
            states = plan.estimate.memory
            note = (f"plan {cand.short()}; GPU memory at that context: model states "
                    f"{format_gib(states.parameters + states.gradients + states.optimizer_states)} "
                    f"(optimizer {format_gib(states.optimizer_states)}), activations "
                    f"{format_gib(states.activations)}, logits+loss {format_gib(states.logits_loss)}")
            predicted = f"{format_tokens(ctx)} ({ctx:,}); exhaustive agrees: {exhaustive == ctx}"
        except InfeasibleError as err:
            ctx = 0
            predicted = "does not fit at any length"
            note = str(err)
            # the leanest candidate of the space, for the what-if below
            space = build_space(model, hw, Workload(GRANULE))
            cand = space.make(sp=max(space.sp), zero_stage=3, micro_batch=1, checkpointing="full",
                              mlp_chunks=16, loss_chunks=32, offload_activations=True, overlap="none")
        seconds = time.perf_counter() - started
        opt_only = what_if_max_ctx(model, hw, cand, ("optimizer_states",))
        all_states = what_if_max_ctx(model, hw, cand, ("optimizer_states", "gradients", "parameters"))
        lines += [
            f"Llama-3.1-8B on {hw.world_size} x H100 ({hw_name}):",
            f"  autosp predicted max context : {predicted}   [{seconds:.1f} s]",
            f"  ALST published               : {format_tokens(alst)} ({alst:,})"
            + (f"   -> autosp / ALST = {ctx / alst:.2f}" if ctx else ""),
            f"  {note}",
            f"  what-if, same plan, optimizer states on the host (ALST 8-GPU recipe): {format_tokens(opt_only)}"
            f" ({opt_only / alst:.2f} x ALST)",
            f"  what-if, all model states on the host (ALST 1-GPU recipe)           : {format_tokens(all_states)}"
            f" ({all_states / alst:.2f} x ALST)",
            "",
        ]
        print("\n".join(lines[-7:]), flush=True)


EXPLANATION = """\
Why the numbers differ from ALST's
- 1 x H100: autosp's space has no optimizer/parameter offload knob (the Candidate has no field for it),
  so the 16 bytes/parameter of bf16 mixed-precision Adam state (~120 GiB for 8B parameters) cannot fit
  an 80 GB GPU at any context. ALST's 1-GPU recipe runs ZeRO-3 with offload_optimizer and offload_param
  to CPU (cpu_adam). With the states moved off the GPU the cost model's activation memory alone would
  allow the what-if context above.
- 8 x H100: autosp keeps the optimizer states on the GPUs (ZeRO-3 over 8 ranks: 12 bytes x 8B / 8 = 11 GiB
  per GPU) and still predicts a context close to ALST's 3.7M, which had offload_optimizer on; with the
  same offload the model predicts the larger what-if value. So the cost model's per-token activation
  memory is lower than what ALST measured: the analytic model has no allocator fragmentation beyond its
  fixed reserve fraction, no flash-attention/NCCL workspace growth with sequence length and no copies
  made by the Hugging Face code path (position ids, masks, Liger/loss tiling buffers). ALST's numbers
  are also round lengths that ran, not searched boundaries: its 8-GPU recipe sets max_length 3,800,000
  (the paper reports 3.7M) and its 1-GPU recipe 500,000, with a comment that 555,000 failed in a Triton
  kernel (illegal memory access), whereas the planner bisects to the exact boundary in 1,024-token steps.
- What it means: treat the planner's max-ctx as optimistic by up to ~20-40% until the memory model is
  calibrated against measured peaks (autosp-calibrate), and add optimizer/parameter offload to the
  search space to plan single-GPU long-context runs at all.
"""


def main() -> int:
    lines = ["autosp planner benchmark", f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
             f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}", ""]
    print("\n".join(lines), flush=True)
    lines.append("Search: cold/cached = wall time of a fresh `autosp-plan --json` process; Optuna vs exhaustive")
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
