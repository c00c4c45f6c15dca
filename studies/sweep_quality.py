"""How fast ``autosp-plan sweep`` plans, and what its quick search (``--search fast``) gives up against the default
(Optuna) and exhaustive searches, side by side in one run.

1. Speed: a sweep of 216 cold throughput requests (Llama-3.2-1B, 3.1-8B, 3.1-70B x H100 x1..x128 x nine contexts
   8k..8M; no plan cache) with the fast search: wall time and this process's CPU time (the machine is shared, so
   the CPU time is what the search itself costs), then the same sweep again from the plan cache.
2. Quality, on the sweep's own requests: for each, the best tokens/s of the fast search over that of the default
   search (and, where the space is small enough to score whole in this run, the exhaustive search); for max-ctx
   requests the ratio of the longest contexts. Ratios below 1 are where the fast search is worse.

    .venv/bin/python -m studies.sweep_quality        # ~15 min on 2 shared cores; writes results/sweep_quality.txt
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from autosp.errors import InfeasibleError
from autosp.files import write_text
from autosp.planner.api import plan_for
from autosp.planner.request import PlanRequest
from autosp.planner.sweep import requests, run

MODELS = ("llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b")
GPUS = (1, 2, 4, 8, 16, 32, 64, 128)
CONTEXTS = ("8k", "32k", "128k", "256k", "512k", "1M", "2M", "4M", "8M")
QUALITY_THROUGHPUT = [(m, f"h100x{n}", c) for m in MODELS for n in (1, 8, 64) for c in ("32k", "512k", "2M")]
QUALITY_MAX_CTX = [(m, f"h100x{n}") for m in MODELS for n in GPUS]
EXHAUSTIVE_GPUS = (1, 8)
"""Exhaustive searches run only on these cluster sizes (a space of up to ~10^5 candidates; larger ones take
minutes each here)."""

OUT = Path(__file__).resolve().parent / "results" / "sweep_quality.txt"


def _timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def _best(request):
    try:
        plan = plan_for(request, cache=None)
    except InfeasibleError:
        return None
    return plan


def speed(lines: list[str]) -> None:
    base = PlanRequest(model=MODELS[0], hw="h100x1", ctx=CONTEXTS[0], search="fast")
    reqs = requests(base, MODELS, [f"h100x{n}" for n in GPUS], CONTEXTS)
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "plans.sqlite")
        rows, wall, cpu = _timed(lambda: run(reqs, cache=cache))
        again, wall2, cpu2 = _timed(lambda: run(reqs, cache=cache))
    ok = sum(r["status"] == "ok" for r in rows)
    hits = sum(r["cache"] == "hit" for r in again)
    lines.append(f"speed: {len(reqs)} throughput requests (3 models x h100 x1..x128 x 9 contexts 8k..8M), --search fast")
    lines.append(f"  cold (no plan cached): wall {wall:.2f} s, CPU {cpu:.2f} s of this process "
                 f"({1000 * cpu / len(reqs):.1f} ms CPU per request); {ok} planned, {len(reqs) - ok} do not fit")
    lines.append(f"  again from the plan cache: wall {wall2:.2f} s, CPU {cpu2:.2f} s; {hits} cache hits")
    evals = [r["evaluations"] for r in rows if r["evaluations"]]
    lines.append(f"  cost-model evaluations per planned request: median {statistics.median(evals):.0f}, max {max(evals)}")


def quality(lines: list[str]) -> None:
    lines.append("")
    lines.append("quality: fast vs default (optuna) vs exhaustive, best predicted tokens/s (max-ctx: longest context)")
    head = f"  {'model':<15}{'hardware':<10}{'ctx':>6}  {'fast/default':>12}{'fast/exhaustive':>16}" \
           f"{'fast CPU s':>11}{'default CPU s':>14}{'exh. CPU s':>11}"
    lines.append(head)
    ratios_default, ratios_exh = [], []
    cases = [(m, h, c, "throughput") for m, h, c in QUALITY_THROUGHPUT] + [(m, h, None, "max-ctx")
                                                                           for m, h in QUALITY_MAX_CTX]
    for model, hw, ctx, objective in cases:
        request = PlanRequest(model=model, hw=hw, ctx=ctx, objective=objective, search="fast")
        fast, _, fast_cpu = _timed(lambda: _best(request))
        default, _, default_cpu = _timed(lambda: _best(replace(request, search="optuna")))
        exh, exh_cpu = None, None
        if int(hw.split("x")[1]) in EXHAUSTIVE_GPUS:
            exh, _, exh_cpu = _timed(lambda: _best(replace(request, search="exhaustive")))

        def ratio(a, b):
            if a is None and b is None:
                return "both none"
            if a is None or b is None:
                return "fast none" if a is None else "other none"
            if objective == "max-ctx":
                return a.workload.seq_len / b.workload.seq_len
            return a.estimate.tokens_per_second / b.estimate.tokens_per_second

        speed_note = ""
        if objective == "max-ctx" and fast is not None and default is not None \
                and fast.workload.seq_len == default.workload.seq_len:
            speed_note = f"  (tokens/s at that context: {fast.estimate.tokens_per_second / default.estimate.tokens_per_second:.4f})"
        rd = ratio(fast, default)
        re_ = ratio(fast, exh) if exh_cpu is not None else "-"
        if isinstance(rd, float):
            ratios_default.append((rd, model, hw, ctx or "max"))
        if isinstance(re_, float):
            ratios_exh.append((re_, model, hw, ctx or "max"))

        def show(v):
            return f"{v:.4f}" if isinstance(v, float) else str(v)

        lines.append(f"  {model:<15}{hw:<10}{ctx or 'max':>6}  {show(rd):>12}{show(re_):>16}{fast_cpu:>11.2f}"
                     f"{default_cpu:>14.2f}{'-' if exh_cpu is None else f'{exh_cpu:.2f}':>11}{speed_note}")
        print(lines[-1], file=sys.stderr, flush=True)
    for name, ratios in (("default", ratios_default), ("exhaustive", ratios_exh)):
        values = [r[0] for r in ratios]
        if values:
            worst = min(ratios)
            lines.append(f"fast / {name}: {len(values)} requests, min {min(values):.4f} ({worst[1]} {worst[2]} "
                         f"{worst[3]}), median {statistics.median(values):.4f}, "
                         f"{sum(v >= 0.99 for v in values)} of {len(values)} >= 0.99")


def main() -> int:
    lines = [f"# python -m studies.sweep_quality ({time.strftime('%Y-%m-%d')}); 2 CPU cores shared with other work: "
             "the CPU times are this process's"]
    speed(lines)
    print("\n".join(lines), file=sys.stderr, flush=True)
    quality(lines)
    text = "\n".join(lines) + "\n"
    write_text(OUT, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
