"""The DeepSpeed config of a plan: ``deepspeed_config(plan) -> dict`` (``autosp-plan --ds-config PATH``).

Batch sizes — what they mean here. autosp launches one process per GPU, ``dp x sp`` processes in all,
and hands DeepSpeed **all of them as its data-parallel world**: every rank of an SP group feeds
DeepSpeed one shard of the same sequence, and the compiler scales the loss (sum over the valid targets
of all shards / number of valid targets of the whole sequence, docs/design.md section 2) so the gradients
DeepSpeed averages over the ``dp x sp`` ranks are exactly the single-process ones. DeepSpeed checks

    train_batch_size == train_micro_batch_size_per_gpu x gradient_accumulation_steps x world_size

with ``world_size = dp x sp``, so ``train_batch_size`` counts *sequence shards*, sp per sequence:

- ``train_micro_batch_size_per_gpu`` = the plan's micro-batch (sequences per micro-step per SP group);
- ``gradient_accumulation_steps`` = the plan's grad_accum;
- ``train_batch_size`` = micro_batch x grad_accum x dp x sp = sp x (sequences per optimizer step).

The number of *sequences* per optimizer step is ``micro_batch x grad_accum x dp``; it is written, with
the tokens per step and every SP knob (``sp`` and its split ``ulysses`` x ``ring``), in the ``autosp``
section. DeepSpeed's parser ignores unknown top-level keys (checked against DeepSpeed 0.19.8 in
tests/planner/test_ds_config.py), so the section rides along in the same file; ``autosp-plan check`` and
the compiler read it. The config deliberately has no ``sequence_parallel_size`` key: with it (and no mpu)
DeepSpeed would divide its world size by sp and reject these batch sizes.

Everything but the ``autosp`` section comes from :func:`autosp.contract.deepspeed_config.deepspeed_config`,
the one builder ``autosp.compile`` uses too (its module doc lists the defaults, gradient clipping at 1.0
among them, and how to override them): the same bucket sizes the cost model charges memory and time for,
ZeRO-Offload of the optimizer when the plan asks for it (DeepSpeed then insists on its CPU Adam,
``deepspeed.ops.adam.DeepSpeedCPUAdam``). The optimizer itself is not in the config: the caller (or
``autosp.compile``) passes it to DeepSpeed.
"""

from __future__ import annotations

import json

from autosp.contract.plan import save_plan
from autosp.files import write_text

from autosp.contract.knobs import KNOBS
from autosp.contract.deepspeed_config import deepspeed_config as run_config


def deepspeed_config(plan) -> dict:
    """A DeepSpeed config dict for launching ``plan`` on ``dp x sp`` processes (see the module doc)."""
    c, w = plan.candidate, plan.workload
    world = c.dp * c.sp
    sequences = c.micro_batch * c.grad_accum * c.dp
    knobs = {}
    for knob in KNOBS:  # the table's knobs with a key here (ZeRO stage, micro-batch, grad accum are DeepSpeed's)
        if knob.ds_key:
            knobs[knob.ds_key] = getattr(c, knob.name)
        if knob.name == "sp":
            knobs["ulysses"] = c.ulysses
        elif knob.name == "dp":
            knobs.update(seq_len=w.seq_len, sequences_per_step=sequences, tokens_per_step=sequences * w.seq_len)
    return {
        **run_config(c, w.dtype, n_params=plan.model.n_params()),
        "autosp": {
            "note": ("DeepSpeed's data-parallel world here is all dp*sp ranks; train_batch_size counts "
                     "sequence shards (sp per sequence). Sequences per optimizer step: "
                     "sequences_per_step."),
            "world_size": world,
            **knobs,
            "dtype": w.dtype,
            "model": plan.model.name,
            "model_fingerprint": plan.model.fingerprint(),
            "hardware": plan.hardware.name,
            "hardware_fingerprint": plan.hardware.fingerprint(),
            "autosp_version": plan.autosp_version,
            # what `autosp-plan check` needs to re-price this config without the plan file
            "global_batch": w.global_batch,
            "objective": plan.objective,
            "allow_cross_node_sp": bool(plan.search.get("allow_cross_node_sp", False)),
            "space_version": plan.search.get("space_version"),
            "cost_model_version": plan.search.get("cost_model_version"),
            **({"doc_lens": [list(p) for p in w.doc_lens]} if w.doc_lens else {}),  # packed documents
            **({"compile_backend": w.compile_backend} if w.compile_backend != "inductor" else {}),
        },
    }


def deepspeed_config_json(plan) -> str:
    return json.dumps(deepspeed_config(plan), indent=2) + "\n"


def write_outputs(plan: Plan, plan_out=None, ds_config=None) -> list:
    """Write the plan JSON (``plan_out``) and its DeepSpeed config (``ds_config``) when asked; the paths
    written, in that order (for the report's "written" line)."""
    written = []
    if plan_out:
        save_plan(plan, plan_out, "--plan-out")
        written.append(plan_out)
    if ds_config:
        write_text(ds_config, deepspeed_config_json(plan), "--ds-config")
        written.append(ds_config)
    return written


__all__ = ["deepspeed_config", "deepspeed_config_json", "write_outputs"]
