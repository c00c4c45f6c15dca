"""The command line ``autosp-plan sweep``: lists of models, clusters and contexts in, one table (or CSV, JSON)
and optionally a PNG plot out; the logic is :mod:`autosp.planner.sweep`."""

from __future__ import annotations

import argparse
import sys
import time

from autosp.errors import UsageError
from autosp.planner.cli.args import ArgParser, check_output_path

EPILOG = """\
lists: each of --model, --hw and --ctx takes several values, comma-separated or space-separated (so the
shell's braces work: --hw h100x{1,2,4,8}); the sweep plans every combination.

examples:
  autosp-plan sweep --model llama-3.1-8b,llama-3.1-70b --hw h100x8,h100x32 --ctx 128k,1M
  autosp-plan sweep --model llama-3.2-1b,llama-3.1-8b,llama-3.1-70b --hw h100x{1,2,4,8,16,32,64,128} \\
                    --objective max-ctx --plot max_ctx.png
  autosp-plan sweep --model llama-3.1-8b --hw h100x8 --ctx 32k,128k,512k,2M --fix zero_stage=3 --csv > s.csv

search: --search fast (the default here) scores a few hundred candidates per request by branch and bound over
the structure families (no sampler); --search optuna is autosp-plan's default search, exhaustive the optimum.
Every row is the plan autosp-plan prints for that request; identical requests come from the plan cache.
exit codes: 0 the sweep ran (rows without a plan say why), 2 bad input (before any search).
"""


def build_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="autosp-plan sweep", formatter_class=argparse.RawDescriptionHelpFormatter,
                  description="Plan many requests in one call (models x clusters x contexts, or the longest "
                              "context with --objective max-ctx) and print one table, CSV or JSON, and a plot.",
                  epilog=EPILOG)
    p.add_argument("--model", nargs="+", metavar="M", required=True, help="models: presets, config.json paths, ...")
    p.add_argument("--hw", nargs="+", metavar="H", required=True, help="clusters: catalog names (h100x8) or files")
    p.add_argument("--ctx", nargs="+", metavar="C", help="context lengths (200k, 1M, 128Ki); with max-ctx: the "
                                                          "least context accepted (one value)")
    p.add_argument("--objective", default="throughput", choices=("throughput", "max-ctx"))
    p.add_argument("--nodes", metavar="K", help="number of nodes (overrides every --hw's node count)")
    p.add_argument("--global-batch", metavar="N", help="sequences per optimizer step")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--no-cross-node-sp", dest="allow_cross_node_sp", action="store_false", default=True,
                   help="keep every SP group inside one node")
    p.add_argument("--fix", action="append", metavar="KNOB=VALUE", help="pin a plan knob in every request "
                                                                       "(repeatable; see autosp-plan --help)")
    p.add_argument("--search", default="fast", choices=("fast", "optuna", "exhaustive"),
                   help="fast (default): no sampler, for many requests; optuna: autosp-plan's default")
    p.add_argument("--trials", metavar="N", help="Optuna trials (--search optuna)")
    p.add_argument("--seed", metavar="S", type=int, default=0)
    p.add_argument("--jobs", metavar="N", type=int, default=None,
                   help="plan in N forked processes at once (default: the CPUs this process may use, at most 8; "
                        "1 plans in this process)")
    cache = p.add_mutually_exclusive_group()
    cache.add_argument("--cache", metavar="PATH|URL", help="plan cache (default: as autosp-plan)")
    cache.add_argument("--no-cache", action="store_true", help="neither read nor write the plan cache")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the rows as one JSON object instead of the table")
    out.add_argument("--csv", action="store_true", help="print the rows as CSV instead of the table")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the sweep into a PNG (needs matplotlib: the [plot] extra): the "
                                                     "longest context against GPUs with max-ctx, else tokens/s "
                                                     "against context")
    return p


def default_jobs() -> int:
    """The CPUs this process may use, at most 8 (each process plans whole requests; the rows do not depend on it)."""
    import os

    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


MAX_REQUESTS = 10_000
"""The most requests one sweep plans (a typo such as a 5-digit list should not start an hour of work)."""


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from autosp.planner.request import PlanRequest
    from autosp.planner.sweep import check_inputs, requests, run, split_list

    models, hardware = split_list(args.model, "--model"), split_list(args.hw, "--hw")
    contexts = split_list(args.ctx, "--ctx") if args.ctx else [None]
    if args.objective != "max-ctx" and contexts == [None]:
        raise UsageError("autosp-plan sweep needs --ctx (one or more lengths), or --objective max-ctx")
    if args.jobs is None:
        args.jobs = default_jobs()
    if args.jobs < 1:
        raise UsageError(f"--jobs must be a positive integer, got {args.jobs}")
    if args.plot is not None:
        if not args.plot.lower().endswith(".png"):
            raise UsageError(f"--plot {args.plot}: the plot is a PNG; give a file name ending in .png")
        check_output_path(args.plot, "--plot")
        from autosp.planner.cli.sweep_output import require_matplotlib

        require_matplotlib()
    base = PlanRequest(model=models[0], hw=hardware[0], ctx=contexts[0], nodes=args.nodes, objective=args.objective,
                       global_batch=args.global_batch, dtype=args.dtype, allow_cross_node_sp=args.allow_cross_node_sp,
                       search=args.search, trials=args.trials, seed=args.seed, fix=args.fix or ())
    for c in contexts[1:]:
        PlanRequest(model=models[0], hw=hardware[0], ctx=c)  # every length checked now
    reqs = requests(base, models, hardware, contexts)
    if len(reqs) > MAX_REQUESTS:
        raise UsageError(f"the sweep has {len(reqs):,} requests, more than {MAX_REQUESTS:,}; sweep fewer values")
    check_inputs(models, hardware, args.nodes)
    started = time.perf_counter()
    rows = run(reqs, cache=None if args.no_cache else (args.cache or True), jobs=args.jobs)
    wall = time.perf_counter() - started

    from autosp.planner.cli import sweep_output

    if args.plot is not None:
        from autosp.files import write_bytes

        write_bytes(args.plot, sweep_output.plot_png(rows), "--plot")
    if args.json:
        settings = {"models": models, "hardware": hardware, "contexts": contexts, "objective": args.objective,
                    "search": args.search, "fix": dict(base.fix), "requests": len(reqs)}
        sys.stdout.write(sweep_output.to_json(rows, wall, settings))
    elif args.csv:
        sys.stdout.write(sweep_output.to_csv(rows))
    else:
        sys.stdout.write(sweep_output.table(rows, wall))
        if args.plot is not None:
            sys.stdout.write(f"Wrote {args.plot}\n")
    return 0


__all__ = ["MAX_REQUESTS", "build_parser", "default_jobs", "main"]
