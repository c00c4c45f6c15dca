"""The command lines ``autosp-plan check FILE`` and ``autosp-plan select --candidates FILES``: arguments in,
one report (or ``--json``) and one exit code out; the logic is :mod:`autosp.planner.check`."""

from __future__ import annotations

import argparse
import json
import sys

from autosp.planner.check import CHECK_EXIT_CODES, SELECT_EXIT_CODES, check, select
from autosp.planner.cli.check_report import render_check, render_select
from autosp.planner.cli.args import ArgParser, check_output_path, request_fields


def _target_flags(p) -> None:
    g = p.add_argument_group("target (default: what the plan was made for)")
    g.add_argument("--model", metavar="M", help="preset, config.json or package.module:function to check against")
    g.add_argument("--hw", metavar="H", help="cluster to check against (catalog name or file)")
    g.add_argument("--nodes", metavar="K", help="number of nodes (overrides the hardware's)")
    g.add_argument("--ctx", metavar="C", help="context length to check at")
    g.add_argument("--global-batch", metavar="N", help="sequences per optimizer step ('none': one micro-batch per "
                                                       "replica)")
    g.add_argument("--dtype", choices=("bf16", "fp32"))
    cross = g.add_mutually_exclusive_group()
    cross.add_argument("--allow-cross-node-sp", dest="allow_cross_node_sp", action="store_const", const=True,
                       help="let SP groups span nodes (default: as the plan was made)")
    cross.add_argument("--no-cross-node-sp", dest="allow_cross_node_sp", action="store_const", const=False,
                       help="keep every SP group inside one node")
    s = p.add_argument_group("the search for the best plan now")
    s.add_argument("--search", choices=("optuna", "exhaustive", "fast"), help="default: the plan's own, else optuna")
    s.add_argument("--trials", metavar="N", help="Optuna trials (default: the plan's)")
    s.add_argument("--seed", metavar="S", type=int, help="default: the plan's")
    c = s.add_mutually_exclusive_group()
    c.add_argument("--cache", metavar="PATH|URL", help="plan cache (default: as autosp-plan)")
    c.add_argument("--no-cache", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object (for CI) instead of the report")


def _codes(codes: dict) -> str:
    return "exit codes:\n" + "\n".join(f"  {c}  {m}" for c, m in sorted(codes.items()))


def build_check_parser():
    p = ArgParser(prog="autosp-plan check", formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Verify a committed plan (or the DeepSpeed config autosp-plan --ds-config wrote) "
                            "against the current model, hardware and autosp: still valid, still fits, within "
                            "--tolerance of the best plan found now, made by this search space and cost model?",
                epilog=_codes(CHECK_EXIT_CODES) + "\n\nexamples:\n  autosp-plan check plans/llama-200k.json\n"
                       "  autosp-plan check ds_config.json --tolerance 2% --json\n"
                       "  autosp-plan check plans/llama-200k.json --hw h200x8 --best-out new-plan.json\n")
    p.add_argument("file", metavar="PLAN_OR_DS_CONFIG")
    p.add_argument("--tolerance", default="5%", help="how far (tokens/s; context for max-ctx plans) behind the best "
                                                     "plan found now still passes (default 5%%)")
    p.add_argument("--ignore-versions", action="store_true",
                   help="a plan made by another search space / cost model / autosp version passes if it is still "
                        "feasible and within tolerance (the change is reported as a note)")
    p.add_argument("--best-out", metavar="PATH", help="write the best plan found now to PATH")
    _target_flags(p)
    return p


def build_select_parser():
    p = ArgParser(prog="autosp-plan select", formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Re-price candidate plans (plan JSONs or DeepSpeed configs from autosp-plan) on the "
                            "current model and hardware and pick the fastest one that is valid and fits.",
                epilog=_codes(SELECT_EXIT_CODES) + "\n\nexamples:\n"
                       "  autosp-plan select --candidates plans/*.json --plan-out plan.json --ds-config ds.json\n"
                       "  autosp-plan select --candidates plans/ --hw h100x16 --tolerance 5% --json\n")
    p.add_argument("--candidates", nargs="+", required=True, metavar="FILE",
                   help="plan/config files, directories (their *.json) or quoted glob patterns")
    p.add_argument("--tolerance", help="also search the best plan now and exit 4 if the selected one is more than "
                                       "this behind it (e.g. 5%%)")
    p.add_argument("--plan-out", metavar="PATH", help="write the selected plan, re-priced, to PATH")
    p.add_argument("--ds-config", metavar="PATH", help="write its DeepSpeed config to PATH")
    _target_flags(p)
    return p


def target_of(args) -> dict:
    """The target overrides given on the command line (``--global-batch none``: one micro-batch per replica)."""
    target = request_fields(args, given_only=True)
    if target.get("global_batch") == "none":
        target["global_batch"] = None
    return target


def _json_safe(value):
    """``--json`` output that strict parsers (jq) read: infinite or NaN figures become null."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def main(sub: str, argv: list[str]) -> int:
    if sub == "check":
        args = build_check_parser().parse_args(argv)
        if args.best_out is not None:
            check_output_path(args.best_out, "--best-out")
        result = check(args.file, tolerance=args.tolerance, ignore_versions=args.ignore_versions,
                       best_out=args.best_out, cache=None if args.no_cache else (args.cache or True), **target_of(args))
        render = render_check
    else:
        args = build_select_parser().parse_args(argv)
        for path, flag in ((args.plan_out, "--plan-out"), (args.ds_config, "--ds-config")):
            if path is not None:
                check_output_path(path, flag)
        result = select(args.candidates, tolerance=args.tolerance, plan_out=args.plan_out, ds_config=args.ds_config,
                        cache=None if args.no_cache else (args.cache or True), **target_of(args))
        render = render_select
    if args.json:
        sys.stdout.write(json.dumps(_json_safe(result), indent=2) + "\n")
    else:
        sys.stdout.write(render(result))
    return result["exit_code"]


__all__ = ["build_check_parser", "build_select_parser", "main", "target_of"]
