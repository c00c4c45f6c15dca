"""``autosp-plan --backend alst``: the best plan ALST can run, as an Accelerate config file.

ALST (Arctic Long Sequence Training) is DeepSpeed's Ulysses sequence parallelism inside Hugging Face
Accelerate: ``ParallelismConfig(sp_backend="deepspeed", sp_size=N)`` (``deepspeed.runtime.sequence_parallel
.ulysses_sp``). For users who stay on it, the plan is searched in autosp's space restricted to what that path
runs, with the planner's own pins (:mod:`autosp.planner.pins`, applied by ``SearchSpace.restrict``):

- Ulysses only: no ring attention (``ring=1``), no sequence chunks or chunk offload, no expert parallelism;
- no autosp-only knobs: no MLP or loss tiling done by autosp's passes, no all-to-all overlap schedule, no
  activation offload; checkpointing ``full`` (Hugging Face's ``gradient_checkpointing``) or ``none``;
- SP within the head count: DeepSpeed's ``UlyssesSPAttentionHF`` refuses an SP size that does not divide
  the attention heads, or whose KV heads neither divide nor are divided by it.

The same request is also planned without the restriction, and the report says what autosp's own plan gains.

Accelerate's field names (read from accelerate 1.16's ``commands/launch.py`` and ``parallelism_config.py``):
the config file's ``parallelism_config`` section holds ``parallelism_config_sp_size`` /
``parallelism_config_sp_backend`` (``deepspeed``: ALST) and ``parallelism_config_sp_seq_length_is_variable``
/ ``parallelism_config_sp_attn_implementation``; ``parallelism_config_cp_size`` / ``parallelism_config_cp_backend``
(``torch``) are the other spelling, torch's context parallelism, which Accelerate runs only under FSDP2, not
DeepSpeed. ``accelerate launch`` turns the section into ``PARALLELISM_CONFIG_SP_SIZE`` etc. for the script.
"""

from __future__ import annotations

import dataclasses
import json

from autosp.errors import InfeasibleError, UsageError

ALST_PINS = (("ring", 1), ("sequence_chunks", 1), ("offload_chunks", False), ("mlp_chunks", 1), ("loss_chunks", 1),
             ("overlap", "none"), ("offload_activations", False), ("ep", 1))
"""The knobs ALST has no counterpart for, pinned to their "off" values."""

CHECKPOINTING = ("none", "full")
"""The checkpointing policies the Hugging Face Trainer has (``gradient_checkpointing`` off / on)."""


def alst_sp_sizes(n_heads: int, n_kv_heads: int, world: int) -> list[int]:
    """The SP sizes ALST accepts on ``world`` processes, largest first (ulysses_sp.py's head checks)."""
    return [sp for sp in range(world, 0, -1) if world % sp == 0 and n_heads % sp == 0
            and (n_kv_heads % sp == 0 or sp % n_kv_heads == 0)]


def _pins(request, **extra) -> tuple:
    from autosp.planner.pins import parse_pins

    given = dict(parse_pins(request.fix))
    for name, value in (*ALST_PINS, *extra.items()):
        if name in given and given[name] != value:
            raise UsageError(f"--fix {name}={json.dumps(given[name])} is not something ALST can run "
                             f"(--backend alst needs {name}={json.dumps(value)})")
        given[name] = value
    return tuple(sorted(given.items()))


def _score(plan) -> float:
    return plan.workload.seq_len if plan.objective == "max-ctx" else plan.estimate.tokens_per_second


def plan_alst(request, plan_for, options):
    """(the best ALST plan, autosp's own plan) for ``request``; ``plan_for`` is the planner's entry point.

    ALST's space is autosp's with :data:`ALST_PINS` and checkpointing ``none`` or ``full``: one search per
    policy ALST has (the policy pinned, unless the request pins one), the best that fits wins. Pinning
    ``ring=1`` already keeps the SP sizes to those ALST accepts (the space's layout rule for a Ulysses degree
    is DeepSpeed's head check, :func:`alst_sp_sizes`). A policy under which nothing fits is no answer, but
    not the end of the search: an InfeasibleError only when no policy fits, naming the leanest ALST plan and
    what it would need; a UsageError when the request's pins leave ALST nothing to search."""
    _pins(request)  # a pin ALST cannot keep: one line, before any search
    given = dict(request.fix)
    # full first: when nothing fits, its leanest plan (the leanest ALST can run) is the one the error names
    policies = [given["checkpointing"]] if "checkpointing" in given else list(reversed(CHECKPOINTING))
    best, infeasible, refused = None, [], []
    for policy in policies:
        try:
            plan = plan_for(dataclasses.replace(request, fix=_pins(request, checkpointing=policy)), options)
        except InfeasibleError as err:
            infeasible.append(err)
            continue
        except UsageError as err:  # these pins leave nothing to search under this policy
            refused.append(err)
            continue
        if best is None or _score(plan) > _score(best):
            best = plan
    autosp_plan = _autosp_plan(request, plan_for, options)
    if best is not None:
        return best, autosp_plan or best
    if not infeasible:
        raise refused[0]
    theirs = (f"; autosp's own plan fits ({autosp_plan.candidate.short()}): run it with autosp-train or autosp.hf"
              if autosp_plan is not None else "")
    raise InfeasibleError(f"--backend alst: {infeasible[0]}{theirs}")


def _autosp_plan(request, plan_for, options):
    """autosp's own plan for ``request`` (the gain line's other side), or None when nothing fits it either."""
    try:
        return plan_for(request, options)
    except InfeasibleError:
        return None


def gain_line(alst, autosp_plan) -> str:
    """What autosp's own plan gains over the ALST one, in the request's objective."""
    if alst.objective == "max-ctx":
        ratio, what = autosp_plan.workload.seq_len / alst.workload.seq_len, "longer context"
    else:
        ratio, what = autosp_plan.estimate.tokens_per_second / alst.estimate.tokens_per_second, "faster"
    if ratio <= 1.0 + 1e-9:
        return "autosp's own plan: no gain over the ALST plan for this request"
    return (f"autosp's own plan: {ratio:.2f}x {what} ({autosp_plan.candidate.short()} vs ALST "
            f"{alst.candidate.short()})")


def deepspeed_json(plan) -> dict:
    """The DeepSpeed config the Accelerate config points at: the plan's ZeRO stage, offloads and buckets
    (the builder ``autosp.compile`` uses), with the batch sizes and clipping ``auto`` for the Trainer to fill
    from its arguments (:func:`sft_arguments`)."""
    from autosp.contract.deepspeed_config import deepspeed_config

    c, w = plan.candidate, plan.workload
    ds = deepspeed_config(c, w.dtype, n_params=plan.model.n_params())
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "gradient_clipping"):
        ds[key] = "auto"
    return ds


def accelerate_config(plan, deepspeed_file: str) -> dict:
    """The Accelerate config (``accelerate launch --config_file``) that runs ``plan`` with ALST: DeepSpeed
    with the config in ``deepspeed_file`` and ``parallelism_config`` with the plan's SP size."""
    c = plan.candidate
    # no mixed_precision key: with deepspeed_config_file Accelerate refuses one (the precision is the JSON's)
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "num_machines": plan.hardware.nodes,
        "num_processes": c.dp * c.sp,
        "machine_rank": 0,
        "deepspeed_config": {"deepspeed_config_file": deepspeed_file},
        "parallelism_config": {
            "parallelism_config_dp_shard_size": c.dp,
            "parallelism_config_sp_size": c.sp,
            "parallelism_config_sp_backend": "deepspeed",
            "parallelism_config_sp_seq_length_is_variable": True,
            "parallelism_config_sp_attn_implementation": "sdpa",
        },
    }


def write_accelerate_config(plan, path: str, flag: str = "--accelerate-config") -> list[str]:
    """Write the DeepSpeed JSON (``PATH`` with ``.deepspeed.json`` for its suffix) and then the Accelerate
    config that names it, each atomically; the paths written. The Accelerate config is written as JSON,
    which is also YAML: Accelerate reads a ``.json`` file with ``json`` and any other with ``yaml.safe_load``."""
    import os

    from autosp.files import write_text

    ds_path = os.path.splitext(path)[0] + ".deepspeed.json"
    write_text(ds_path, json.dumps(deepspeed_json(plan), indent=2) + "\n", flag)
    write_text(path, json.dumps(accelerate_config(plan, os.path.abspath(ds_path)), indent=2) + "\n", flag)
    return [ds_path, path]


def sft_arguments(plan) -> dict:
    """The TRL ``SFTConfig`` arguments that match ``plan`` under ALST."""
    c, w = plan.candidate, plan.workload
    return {"per_device_train_batch_size": c.micro_batch, "gradient_accumulation_steps": c.grad_accum,
            "max_length": w.seq_len, "pad_to_multiple_of": c.sp, "gradient_checkpointing": c.checkpointing == "full",
            "bf16": w.dtype == "bf16"}


def main_alst(args, request, plan_for, options) -> int:
    """``autosp-plan --backend alst``: plan, write what was asked, print the report and the gain line."""
    import sys

    from autosp.planner.cli.args import check_output_path
    from autosp.planner.ds_config import write_outputs
    from autosp.planner.cli.report import render

    if args.backend != "alst":
        raise UsageError("--accelerate-config and --sft-args describe an ALST run: add --backend alst")
    for path, flag in ((args.accelerate_config, "--accelerate-config"), (args.sft_args, "--sft-args")):
        if path not in (None, "-"):
            check_output_path(path, flag)
    plan, autosp_plan = plan_alst(request, plan_for, options)
    written = write_outputs(plan, args.plan_out, args.ds_config)
    if args.accelerate_config:
        written += write_accelerate_config(plan, args.accelerate_config)
    sft = json.dumps(sft_arguments(plan), indent=2) + "\n"
    if args.sft_args not in (None, "-"):
        from autosp.files import write_text

        write_text(args.sft_args, sft, "--sft-args")
        written.append(args.sft_args)
    if args.json:
        sys.stdout.write(plan.to_json())
        return 0
    sys.stdout.write(render(plan, tuple(written), getattr(sys.stdout, "encoding", None)))
    sys.stdout.write(gain_line(plan, autosp_plan) + "\n")
    if args.sft_args == "-":
        sys.stdout.write("TRL SFTConfig arguments for this plan:\n" + sft)
    return 0


__all__ = ["ALST_PINS", "accelerate_config", "alst_sp_sizes", "deepspeed_json", "gain_line", "plan_alst",
           "main_alst", "sft_arguments", "write_accelerate_config"]
