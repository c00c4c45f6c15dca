"""``autosp-plan ... --emit slurm FILE`` / ``--emit hostfile FILE``: the job that runs a plan on its cluster.

- ``slurm``: an sbatch script. One task per node (``--ntasks-per-node=1``) runs ``autosp-train --nnodes K
  --node-rank $SLURM_NODEID --nproc-per-node G --master-addr <first node> --master-port P --plan PLAN``, which
  starts the node's G training processes; ``--signal=TERM@LEAD`` has Slurm send SIGTERM to every process of the
  job's steps LEAD seconds before the time limit (``B:TERM`` would signal only the batch shell, which does not
  pass it on to ``srun``), and autosp-train answers it by finishing the step and saving (with ``--save-dir``):
  LEAD is the plan's predicted step time plus two minutes for the save, in whole minutes, at least 120.
  Arguments given to ``sbatch FILE ...`` after the script are passed on to autosp-train.
- ``hostfile``: DeepSpeed's launcher's hostfile (``HOST slots=G`` per node) with placeholder host names, and
  in its comments the ``deepspeed`` command that uses it.

Both reference the plan by its absolute path: ``--plan-out`` when given, else a plan written beside the first
emitted file (``job.sbatch`` -> ``job.plan.json``). Every path is checked before the search starts.
"""

from __future__ import annotations

import os
import shlex
import sys

from autosp.errors import UsageError

__all__ = ["KINDS", "check_emits", "job_shape", "plan_path_for", "render", "signal_lead_s", "write_emits"]

KINDS = ("slurm", "hostfile")
MASTER_PORT = 29500  # torchrun's (and autosp-train's) default --master-port (the hostfile's command)
SAVE_ALLOWANCE_S = 120  # seconds allowed for the checkpoint a stopped run writes (edit the script for a slower disk)


def signal_lead_s(plan) -> int:
    """How long before the time limit Slurm must send SIGTERM: the step in progress finishes (up to the plan's
    predicted step time) and a checkpoint is written; whole minutes, at least two (Slurm's own resolution is a
    minute)."""
    need = plan.estimate.time.step + SAVE_ALLOWANCE_S
    return max(120, 60 * -(-int(need) // 60))


def plan_path_for(emits: list, plan_out: str | None) -> str:
    """The plan file the emitted job reads: ``--plan-out``, else ``<first emitted file's stem>.plan.json``."""
    if plan_out:
        return plan_out
    first = emits[0][1]
    stem = os.path.splitext(first)[0] if os.path.splitext(first)[1] else first
    return f"{stem}.plan.json"


def check_emits(emits: list | None, plan_out: str | None, ds_config: str | None) -> list:
    """``--emit KIND FILE`` pairs checked before any search: known kinds, writable regular-file paths, no path
    given twice. Returns them as (kind, path) tuples."""
    from autosp.planner.cli.args import check_output_path

    pairs = [tuple(pair) for pair in emits or ()]
    for kind, path in pairs:
        if kind not in KINDS:
            raise UsageError(f"--emit {kind}: unknown kind; use --emit slurm FILE (an sbatch script) or --emit "
                             "hostfile FILE (the deepspeed launcher's hostfile)")
        check_output_path(path, f"--emit {kind}")
    if not pairs:
        return pairs
    plan_path = plan_path_for(pairs, plan_out)
    if not plan_out:
        check_output_path(plan_path, "the plan beside --emit (or give --plan-out)")
    seen = {}
    for flag, path in [(f"--emit {k}", p) for k, p in pairs] + [("the plan", plan_path), ("--ds-config", ds_config)]:
        if path is None:
            continue
        real = os.path.realpath(path)
        if real in seen:
            raise UsageError(f"{flag} and {seen[real]} name the same file {path}; give each its own path")
        seen[real] = flag
    return pairs


def job_shape(plan) -> tuple[int, int]:
    """(nodes, processes per node) of the plan's sp x dp processes on its cluster's nodes."""
    world, per_node = plan.candidate.sp * plan.candidate.dp, plan.hardware.devices_per_node
    if world <= per_node:
        return 1, world
    nodes = -(-world // per_node)
    if world % nodes:
        raise UsageError(f"the plan's {world} processes (sp {plan.candidate.sp} x dp {plan.candidate.dp}) do not "
                         f"split evenly over nodes of {per_node} devices; pin sp/dp (--fix) to a multiple of {per_node}")
    return nodes, world // nodes


def _train_command() -> str:
    """autosp-train beside this Python (the venv's; compute nodes need not have it on PATH), else by name."""
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "autosp-train")
    return beside if os.access(beside, os.X_OK) else "autosp-train"


def _summary(plan) -> str:
    nodes, per_node = job_shape(plan)
    est = plan.estimate
    return (f"{plan.model.name} at {plan.workload.seq_len:,} tokens per sequence on {plan.hardware.name} ({nodes} "
            f"node(s) x {per_node} processes); plan {plan.candidate.short()}; predicted {est.time.step:.3g} s per "
            f"step, {est.tokens_per_second:,.0f} tokens/s")


def slurm_script(plan, plan_path: str, path: str) -> str:
    nodes, per_node = job_shape(plan)
    lead = signal_lead_s(plan)
    # the plan uses every GPU of each node: take whole nodes, so no other job shares their CPUs or the port
    exclusive = "\n#SBATCH --exclusive" if per_node == plan.hardware.devices_per_node else ""
    job = "".join(c if c.isalnum() or c in "-_." else "-" for c in f"autosp-{plan.model.name}")
    return f"""#!/bin/bash
# Slurm job written by autosp-plan: {_summary(plan)}.
# Submit it with:  sbatch {shlex.quote(os.path.basename(path))} [autosp-train flags, e.g. --steps 1000 --data corpus.jsonl --save-dir ckpt]
# Add your site's partition, account and time limit as further #SBATCH lines (--partition, --account, --time).
#SBATCH --job-name={job}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={per_node}{exclusive}
#SBATCH --signal=TERM@{lead}
#SBATCH --output=autosp-%j.out
#
# One task per node: autosp-train starts the node's {per_node} training processes itself and meets the other
# nodes at the first one (torchrun's static rendezvous). {lead} s before the time limit (a step of
# {plan.estimate.time.step:,.0f} s predicted, and {SAVE_ALLOWANCE_S} s for the save) Slurm sends SIGTERM to every process of the job step:
# training finishes its step, saves a checkpoint when --save-dir is given and exits 0; submit the job
# again with --resume to continue.

set -e  # not pipefail: head closing the pipe early would fail scontrol with SIGPIPE
PLAN={shlex.quote(os.path.abspath(plan_path))}
AUTOSP_TRAIN="${{AUTOSP_TRAIN:-{_train_command()}}}"
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"
[ -n "$MASTER_ADDR" ] || {{ echo "autosp job: no node names from scontrol show hostnames" >&2; exit 2; }}
MASTER_PORT="${{MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}}"  # from the job id: not another job's port

# One task per node with all the node's CPUs (its {per_node} training processes share them; without --cpus-per-task a
# task may be bound to one CPU). The single quotes leave $SLURM_NNODES and $SLURM_NODEID to each node's own shell.
srun --kill-on-bad-exit=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" bash -c 'exec "$0" --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" \\
    --nproc-per-node {per_node} --master-addr "$1" --master-port "$2" --plan "$3" "${{@:4}}"' \\
    "$AUTOSP_TRAIN" "$MASTER_ADDR" "$MASTER_PORT" "$PLAN" "$@"
"""


def hostfile(plan, plan_path: str, path: str) -> str:
    nodes, per_node = job_shape(plan)
    hosts = [f"node-{i}" for i in range(nodes)]
    command = (f"deepspeed --hostfile {shlex.quote(os.path.abspath(path))} --master_addr {hosts[0]} --master_port "
               f"{MASTER_PORT} {shlex.quote(_train_command())} --plan {shlex.quote(os.path.abspath(plan_path))}")
    lines = [f"# DeepSpeed hostfile written by autosp-plan: {_summary(plan)}.",
             f"# Replace {hosts[0]}{' ... ' + hosts[-1] if nodes > 1 else ''} with your machines' host names, one per "
             "line, as the first one reaches them by ssh without a password",
             "# (inside a Slurm allocation: scontrol show hostnames \"$SLURM_JOB_NODELIST\" | sed "
             f"'s/$/ slots={per_node}/' > hosts); slots = training processes on that machine.",
             "# Then, on the first machine (environment variables the others need go in ~/.deepspeed_env, "
             "one NAME=VALUE a line):",
             f"#   {command} [autosp-train flags]"]
    return "\n".join(lines + [f"{host} slots={per_node}" for host in hosts]) + "\n"


def render(kind: str, plan, plan_path: str, path: str) -> str:
    return slurm_script(plan, plan_path, path) if kind == "slurm" else hostfile(plan, plan_path, path)


def write_emits(pairs: list, plan, plan_path: str) -> list:
    """Write each emitted file (the plan itself is written by the caller); the paths written."""
    from autosp.files import write_text

    for kind, path in pairs:
        write_text(path, render(kind, plan, plan_path, path), f"--emit {kind}")
    return [path for _, path in pairs]
