"""How close the default search (``autosp-plan`` without ``--search``) comes to the optimum, over a broad
random set of requests.

    .venv/bin/python -m studies.search_quality                 # seed 0, 150 requests, ~15 min on 2 cores
    .venv/bin/python -m studies.search_quality --seed 7 --out OUT              # OUT.json and OUT.txt
    .venv/bin/python -m studies.search_quality --seed 7 --trials 60 --out OUT  # the Optuna search instead
    .venv/bin/python -m studies.search_quality --seed 31 --search fast --out OUT  # autosp-plan sweep's quick search

(seed 7's results: studies/results/search_quality_seed7_n150.txt and studies/results/search_quality_seed7_n150_optuna.txt)
    .venv/bin/python -m studies.search_quality --n 40 --seed 1
    .venv/bin/python -m studies.search_quality --report-only   # the summary of the saved results again

For each request (a preset model, a catalog accelerator on 1 to 64 devices, a context between 2k and 2M
tokens drawn log-uniformly, with or without a global batch and cross-node SP, bf16 or fp32) the script
plans twice in this process: with the default search, and with the exhaustive search (every candidate scored: the
optimum), priced by the bulk cost model (``--scalar-reference``: by the scalar model, candidate by candidate; the
two agree on every candidate, tests/cost_models/test_bulk.py). The default search itself scores a space of up to
BULK_EXHAUSTIVE_CANDIDATES whole in bulk, so the requests that test the sampler are the larger ones. ratio = default best tokens/s / exhaustive best tokens/s. Requests that nothing fits
are counted and left out. It prints the distribution of the ratio, which strategy the default used, the
worst requests, and the timings that set the planner's threshold for scoring a small space exhaustively
(cost of one cost-model evaluation inside the exhaustive search, cost of one Optuna trial), and writes
``studies/results/search_quality.{json,txt}``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from pathlib import Path

from autosp.errors import InfeasibleError, UsageError
from autosp.planner.api import plan_for
from autosp.planner.request import PlanRequest

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "mistral-7b",
          "mistral-7b-v0.1", "qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b")
ACCELERATORS = ("a100-40g", "a100-80g", "h100", "h200", "b200", "mi300x")
DEVICES = (1, 2, 4, 8, 16, 32, 64)


def random_request(rng: random.Random) -> dict:
    devices = rng.choice(DEVICES)
    ctx = int(round(math.exp(rng.uniform(math.log(2_000), math.log(2_000_000))) / 1000)) * 1000
    request = {"model": rng.choice(MODELS), "ctx": ctx,
               "hw": f"{rng.choice(ACCELERATORS)}x{devices}" if devices > 1 else rng.choice(ACCELERATORS),
               "dtype": rng.choice(("bf16", "bf16", "bf16", "fp32"))}
    if rng.random() < 0.3:
        request["global_batch"] = devices * rng.choice((1, 2, 4, 8))
    if devices > 8 and rng.random() < 0.5:
        request["allow_cross_node_sp"] = True
    return request


def one(request: dict) -> dict:
    row = {"request": request}
    try:
        started = time.perf_counter()
        default = plan_for(PlanRequest(**request, trials=TRIALS, search=SEARCH))
        row["default_s"] = time.perf_counter() - started
        started = time.perf_counter()
        best = scalar_exhaustive(request) if SCALAR_REFERENCE else bulk_exhaustive(request)
        row["exhaustive_s"] = time.perf_counter() - started
    except InfeasibleError:
        row["infeasible"] = True
        return row
    s = default.search
    (best_cand, best_est), evaluations = best
    row.update(strategy=s["strategy"], space_size=s["space_size"], evaluations=s["evaluations"],
               trials=s.get("trials"), default_tps=default.estimate.tokens_per_second,
               best_tps=best_est.tokens_per_second,
               ratio=default.estimate.tokens_per_second / best_est.tokens_per_second,
               default=default.candidate.short(), best=best_cand.short(), sampler=s["sampler"],
               exhaustive_eval_ms=1000 * row["exhaustive_s"] / max(1, evaluations),
               default_search_s=s["search_wall_time_s"])
    return row


TRIALS = None
"""``--trials N``: plan with N sampler trials (the Optuna search, bulk family completion included) instead of the
default search, which scores every space of the random requests whole in bulk (they stay under
BULK_EXHAUSTIVE_CANDIDATES)."""

SEARCH = "optuna"
"""``--search fast``: plan with the quick search of ``autosp-plan sweep`` (planner/search/fast.py) instead of the
default search."""

SCALAR_REFERENCE = False
"""``--scalar-reference``: price the reference with the scalar model, candidate by candidate (hours for 150 requests
on a loaded machine); by default the bulk model prices it, which equals the scalar model on every candidate
(tests/cost_models/test_bulk.py, 7 spaces, relative difference <= 1e-12)."""


def _space_of(request: dict):
    from autosp.planner.request import resolve
    from autosp.planner.search.space import build_space

    req = PlanRequest(**request)
    r = resolve(req)
    return build_space(r.model, r.hardware, r.workload, allow_cross_node_sp=req.allow_cross_node_sp, profile=r.profile)


def _best(result):
    if result.best is None:
        raise InfeasibleError("nothing fits")
    return result.best, result.evaluations


def bulk_exhaustive(request: dict):
    """((candidate, estimate), evaluations) of the exhaustive search priced in bulk (planner/search/bulk_search.py)."""
    from autosp.planner.search.bulk_search import bulk_throughput
    from autosp.planner.search.evaluator import Evaluator

    space = _space_of(request)
    return _best(bulk_throughput(space, Evaluator(space)))


def scalar_exhaustive(request: dict):
    """((candidate, estimate), evaluations) of the exhaustive search with the scalar cost model -- every candidate
    priced by :func:`autosp.cost_models.estimate.estimate` -- or InfeasibleError when nothing fits."""
    from autosp.planner.search.evaluator import Evaluator
    from autosp.planner.search.exhaustive import exhaustive_throughput

    space = _space_of(request)
    return _best(exhaustive_throughput(space, Evaluator(space)))


def quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def report(rows: list[dict], seed: int) -> str:
    done = [r for r in rows if "ratio" in r]
    ratios = [r["ratio"] for r in done]
    searched = ("fast search (autosp-plan sweep's)" if SEARCH == "fast" else
                "default search" if TRIALS is None else f"Optuna search ({TRIALS} trials)")
    lines = [f"search quality: {searched} vs exhaustive ({'scalar' if SCALAR_REFERENCE else 'bulk'} cost model), "
             f"{len(rows)} random requests (seed {seed}), "
             f"{len(done)} feasible, {len(rows) - len(done)} infeasible"]
    lines.append(f"  ratio (default best / exhaustive best tokens/s): min {min(ratios):.4f}, "
                 f"p1 {quantile(ratios, 0.01):.4f}, p5 {quantile(ratios, 0.05):.4f}, "
                 f"p10 {quantile(ratios, 0.10):.4f}, median {statistics.median(ratios):.4f}")
    for bound in (0.99, 0.999, 1.0):
        share = sum(r >= bound - 1e-12 for r in ratios) / len(ratios)
        lines.append(f"  share >= {bound:<5}: {100 * share:5.1f}%  ({sum(r >= bound - 1e-12 for r in ratios)} of "
                     f"{len(ratios)})")
    for strategy in sorted({r["strategy"] for r in done}):
        group = [r for r in done if r["strategy"] == strategy]
        lines.append(f"  default used {strategy:<10}: {len(group):3d} requests, space {min(r['space_size'] for r in group):,}"
                     f"-{max(r['space_size'] for r in group):,} candidates, worst ratio "
                     f"{min(r['ratio'] for r in group):.4f}, median search {statistics.median(r['default_search_s'] for r in group):.2f} s")
    per_eval = statistics.median(r["exhaustive_eval_ms"] for r in done)
    optuna = [r for r in done if r["strategy"] == "optuna"]
    if optuna:
        per_trial = statistics.median(
            1000 * max(0.0, r["default_search_s"] - r["evaluations"] * per_eval / 1000) / max(1, r["trials"])
            for r in optuna)
        lines.append(f"  cost: one cost-model evaluation {per_eval:.3f} ms (median, exhaustive search); one Optuna "
                     f"trial {per_trial:.1f} ms beyond its evaluations = {per_trial / per_eval:.0f} evaluations; "
                     f"an Optuna search makes {statistics.median(r['evaluations'] for r in optuna):,.0f} cost-model "
                     f"calls (median; its trials at most one each)")
    worst = sorted(done, key=lambda r: r["ratio"])[:8]
    lines.append("  worst requests:")
    for r in worst:
        q = r["request"]
        extra = "".join(f" {k}={v}" for k, v in q.items() if k not in ("model", "ctx", "hw"))
        lines.append(f"    {r['ratio']:.4f}  {q['model']} ctx {q['ctx']:,} on {q['hw']}{extra}: {r['strategy']} "
                     f"({r['space_size']:,} candidates) {r['default']} vs {r['best']}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.search_quality", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=150, help="random requests (default 150)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the request generator (default 0)")
    parser.add_argument("--out", default=str(RESULTS / "search_quality"), help="results path without suffix")
    parser.add_argument("--report-only", action="store_true", help="print the summary of OUT.json again, plan nothing")
    parser.add_argument("--trials", type=int, help="plan with this many Optuna trials instead of the default search")
    parser.add_argument("--search", choices=("optuna", "fast"), default="optuna",
                        help="fast: the quick search of autosp-plan sweep instead of the default search")
    parser.add_argument("--scalar-reference", action="store_true",
                        help="price the exhaustive reference with the scalar model (slow) instead of in bulk")
    args = parser.parse_args(argv)
    global SCALAR_REFERENCE, TRIALS, SEARCH
    SCALAR_REFERENCE = args.scalar_reference
    TRIALS = args.trials
    SEARCH = args.search
    out = Path(args.out)
    if args.report_only:
        saved = json.loads(out.with_suffix(".json").read_text())
        print(report([r for r in saved["rows"] if "usage_error" not in r], saved["seed"]), end="")
        return 0
    rng = random.Random(args.seed)
    rows = []
    for i in range(args.n):
        request = random_request(rng)
        try:
            rows.append(one(request))
        except UsageError as err:  # e.g. a global batch no data-parallel degree divides: not a search question
            rows.append({"request": request, "usage_error": str(err)})
        r = rows[-1]
        shown = (f"ratio {r['ratio']:.4f} ({r['strategy']}, {r['space_size']:,})" if "ratio" in r
                 else "infeasible" if r.get("infeasible") else f"usage error: {r['usage_error'][:60]}")
        print(f"[{i + 1}/{args.n}] {request['model']} {request['ctx']:,} {request['hw']}: {shown}", flush=True)
    rows = [r for r in rows if "usage_error" not in r]
    text = report(rows, args.seed)
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"seed": args.seed, "n": args.n, "rows": rows}, indent=1) + "\n")
    out.with_suffix(".txt").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
