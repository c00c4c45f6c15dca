"""``autosp-plan explain``: price ONE given configuration, no search.

The knobs come from ``--fix KNOB=VALUE`` (the others take the plan's defaults: ZeRO 0, micro-batch 1, no
checkpointing, no tiling, no offload, no overlap; ``sp`` or ``dp`` must be pinned) or from a plan / DeepSpeed
config file (``--fix`` then changes some of its knobs; ``--model``, ``--hw``, ``--ctx`` ... re-target it). The
answer is the plan table ``autosp-plan`` prints (:func:`autosp.planner.cli.report.render`), its memory breakdown
and step time, and a verdict: it fits (exit 0), or it does not and by how much (exit 3, the table still on
stdout). A configuration the compiler cannot run here (a rule of the search space, :mod:`autosp.planner.search.space`)
is one line, exit 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, fields

from autosp.cost_models.specs import Candidate
from autosp.errors import UsageError
from autosp.planner.cli.args import ArgParser, check_output_path, request_fields

EXIT_DOES_NOT_FIT = 3

EPILOG = """\
examples:
  autosp-plan explain --model llama-3.1-8b --ctx 1M --hw h100x8 --fix sp=8 --fix zero_stage=3 \\
                      --fix checkpointing=full --fix loss_chunks=16
  autosp-plan explain plan.json                          # a committed plan, priced by today's cost model
  autosp-plan explain ds_config.json --ctx 2M --fix offload_optimizer=true

exit codes:
  0  the configuration fits
  2  bad input, or a configuration that is not valid on this model and cluster (one line says why)
  3  it does not fit (the table shows by how much)
"""


def build_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="autosp-plan explain", formatter_class=argparse.RawDescriptionHelpFormatter,
                  description="Price one configuration with the cost model (no search): the plan table with its "
                              "memory breakdown and step time, and why it fits or does not.", epilog=EPILOG)
    p.add_argument("file", nargs="?", metavar="PLAN_OR_DS_CONFIG", help="take the knobs (and the target) from an "
                                                                       "autosp plan or DeepSpeed config file")
    p.add_argument("--fix", action="append", metavar="KNOB=VALUE", help="a knob of the configuration (repeatable)")
    p.add_argument("--model", metavar="M")
    p.add_argument("--hw", metavar="H")
    p.add_argument("--ctx", metavar="C")
    p.add_argument("--nodes", metavar="K")
    p.add_argument("--global-batch", metavar="N")
    p.add_argument("--dtype", choices=("bf16", "fp32"))
    p.add_argument("--no-cross-node-sp", dest="allow_cross_node_sp", action="store_const", const=False,
                   help="keep every SP group inside one node")
    p.add_argument("--json", action="store_true", help="print the priced plan JSON instead of the table")
    p.add_argument("--plan-out", metavar="PATH", help="write the priced plan JSON (only when it fits)")
    p.add_argument("--ds-config", metavar="PATH", help="write its DeepSpeed config (only when it fits)")
    return p


RETARGET = ("hw", "nodes", "global_batch")
"""Flags that re-target a plan file to other GPUs or another batch: its dp and grad_accum then follow the new
target; without them the file's own values are priced (and validated) as they are, exactly as ``check``
does."""


def _target(args):
    """(the resolved request, the knobs the configuration starts from, whether a flag re-targets the file)."""
    from autosp.planner.request import PlanRequest, resolve

    given = request_fields(args, given_only=True)
    given.pop("fix", None)
    if args.file:
        from autosp.planner.artifacts import load_artifact
        from autosp.planner.reprice import target_request

        art = load_artifact(args.file)
        if "allow_cross_node_sp" not in given and art.search.get("allow_cross_node_sp") is None:
            given["allow_cross_node_sp"] = True
        request = target_request(art, given, search_from_plan=False)
        return (resolve(PlanRequest(model=request.model, hw=request.hw, nodes=request.nodes, ctx=request.ctx,
                                    global_batch=request.global_batch, dtype=request.dtype,
                                    allow_cross_node_sp=request.allow_cross_node_sp)), asdict(art.candidate),
                any(name in given for name in RETARGET))
    missing = [flag for flag, name in (("--model", "model"), ("--ctx", "ctx"), ("--hw", "hw")) if name not in given]
    if missing:
        raise UsageError(f"missing {', '.join(missing)} (or give a plan file): autosp-plan explain --model llama "
                         f"--ctx 200k --hw h100x8 --fix sp=8")
    return resolve(PlanRequest(**given)), {}, True


def configuration(resolved, start: dict, pins, retarget: bool = True) -> Candidate:
    """The Candidate of ``start`` (a plan's knobs, or none) with ``pins`` applied. dp and grad_accum follow from
    the cluster and the global batch unless pinned, where ``retarget`` (no file, or a flag that moves it to
    other GPUs or another batch) or a pin changes what they follow from; otherwise a file's own values stay,
    for :func:`autosp.planner.reprice.invalid_here` to judge as ``check`` does."""
    hw, gb = resolved.hardware, resolved.workload.global_batch
    pinned = dict(pins)
    knobs = {f.name: start[f.name] for f in fields(Candidate) if f.name in start}
    knobs.update(pinned)
    if "sp" not in pinned and "dp" in pinned:
        if hw.world_size % pinned["dp"]:
            raise UsageError(f"--fix dp={pinned['dp']}: dp must divide the {hw.world_size} GPUs of {hw.name}")
        knobs["sp"] = hw.world_size // pinned["dp"]
    if "sp" not in knobs:
        raise UsageError("give the SP degree: --fix sp=N (or --fix dp=N), or a plan file")
    if "dp" not in pinned and (retarget or "sp" in pinned or "dp" not in knobs):
        knobs["dp"] = max(1, hw.world_size // knobs["sp"])
    if "grad_accum" not in pinned and (retarget or {"sp", "dp", "micro_batch"} & set(pinned)
                                       or "grad_accum" not in knobs):
        share = knobs["dp"] * knobs.get("micro_batch", 1)
        knobs["grad_accum"] = gb // share if gb is not None and share and gb % share == 0 else 1
    try:
        return Candidate(**knobs)
    except (TypeError, ValueError) as err:
        raise UsageError(f"not a valid configuration: {err}") from None


def price_plan(resolved, cand: Candidate, pins, started: float):
    """(the Plan of ``cand`` on the request, priced; UsageError when a rule of the space forbids it)."""
    from autosp.planner.search.evaluator import Evaluator
    from autosp.planner.plan import Plan
    from autosp.planner.search.space import SPACE_VERSION, build_space, padding
    from autosp.planner.versions import code_version, cost_model_version

    from autosp.planner.reprice import invalid_here

    r = resolved
    reason = invalid_here(r, cand)  # the validation check and select apply
    if reason:
        raise UsageError(f"this configuration cannot run on {r.hardware.name}: {reason}")
    space = build_space(r.model, r.hardware, r.workload, allow_cross_node_sp=r.request.allow_cross_node_sp,
                        profile=r.profile)
    est = Evaluator(space)(cand)
    pad_tokens, pad_fraction = padding(r.workload.seq_len, cand.sp, cand.ring)
    search = {"strategy": "explain", "evaluations": 1, "space_version": SPACE_VERSION,
              "cost_model_version": cost_model_version(), "code_version": code_version(),
              "allow_cross_node_sp": r.request.allow_cross_node_sp, "padding_tokens": pad_tokens,
              "padding_fraction": round(pad_fraction, 6), "wall_time_s": round(time.perf_counter() - started, 4),
              "cache": "off"}
    if pins:
        search["fixed"] = dict(pins)
    return Plan(model=r.model, hardware=r.hardware, workload=r.workload, candidate=cand, estimate=est,
                objective="throughput", search=search)


def verdict(plan) -> str:
    """Why it fits or does not, on one line."""
    from autosp.planner.shortfall import memory_shortfall
    from autosp.units import format_gib

    e = plan.estimate
    mem, cap = e.memory.total, e.capacity_bytes
    if e.fits:
        return f"fits: {format_gib(mem)} of the usable {format_gib(cap)} per GPU ({format_gib(cap - mem)} headroom)"
    parts = {"parameters": e.memory.parameters, "gradients": e.memory.gradients,
             "optimizer states": e.memory.optimizer_states, "activations": e.memory.activations,
             "logits + loss": e.memory.logits_loss, "comm buffers": e.memory.comm_buffers,
             "expert states": e.memory.expert_states}
    biggest = max(parts, key=parts.get)
    if mem != mem or mem == float("inf"):
        return f"does not fit: {memory_shortfall(e)}"
    return (f"does not fit: needs {format_gib(mem)} > the usable {format_gib(cap)} per GPU (over by "
            f"{format_gib(mem - cap)}); the largest part is {biggest} ({format_gib(parts[biggest])}); "
            f"autosp-plan --fix with the knobs you must keep searches the rest")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from autosp.planner.pins import parse_pins

    pins = parse_pins(args.fix)
    for path, flag in ((args.plan_out, "--plan-out"), (args.ds_config, "--ds-config")):
        if path is not None:
            check_output_path(path, flag)
    started = time.perf_counter()
    resolved, start, retarget = _target(args)
    plan = price_plan(resolved, configuration(resolved, start, pins, retarget), pins, started)
    fits = plan.estimate.fits
    written = []
    if fits:
        from autosp.planner.plan import write_outputs

        written = write_outputs(plan, args.plan_out, args.ds_config)
    if args.json:
        sys.stdout.write(plan.to_json())
    else:
        from autosp.planner.cli.report import render

        text = render(plan, tuple(written), getattr(sys.stdout, "encoding", None))
        sys.stdout.write(text + f"Verdict  {verdict(plan)}\n")
        if not fits and (args.plan_out or args.ds_config):
            sys.stdout.write("Not written: the configuration does not fit\n")
    return 0 if fits else EXIT_DOES_NOT_FIT


__all__ = ["EXIT_DOES_NOT_FIT", "build_parser", "configuration", "main", "price_plan", "verdict"]
