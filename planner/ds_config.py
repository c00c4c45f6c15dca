"""The DeepSpeed config of a plan: ``deepspeed_config(plan) -> dict`` (``autosp-plan --ds-config PATH``).

Batch sizes — what they mean here. autosp launches one process per GPU, ``dp x sp`` processes in all,
and hands DeepSpeed **all of them as its data-parallel world**: every rank of an SP group feeds
DeepSpeed one shard of the same sequence, and the compiler scales the loss (sum over the valid targets
of all shards / number of valid targets of the whole sequence, design.md section 2) so the gradients
DeepSpeed averages over the ``dp x sp`` ranks are exactly the single-process ones. DeepSpeed checks

    train_batch_size == train_micro_batch_size_per_gpu x gradient_accumulation_steps x world_size

with ``world_size = dp x sp``, so ``train_batch_size`` counts *sequence shards*, sp per sequence:

- ``train_micro_batch_size_per_gpu`` = the plan's micro-batch (sequences per micro-step per SP group);
- ``gradient_accumulation_steps`` = the plan's grad_accum;
- ``train_batch_size`` = micro_batch x grad_accum x dp x sp = sp x (sequences per optimizer step).

The number of *sequences* per optimizer step is ``micro_batch x grad_accum x dp``; it is written, with
the tokens per step and every SP knob (``sp`` and its split ``ulysses`` x ``ring``), in the ``autosp``
section. DeepSpeed's parser ignores unknown top-level keys (checked against DeepSpeed 0.19.8 in
tests/test_ds_config.py), so the section rides along in the same file; the compiler reads it. The
config deliberately has no ``sequence_parallel_size`` key: with it (and no mpu) DeepSpeed would divide
its world size by sp and reject these batch sizes.

The ``zero_optimization`` section is :func:`autosp.cost_models.deepspeed_buffers.zero_config_fields`:
the same bucket sizes and overlap settings the cost model charges communication-buffer memory and time
for, so the prediction and the run agree.
The optimizer is not in the config: the caller (or ``autosp.compile``) passes it to DeepSpeed. With
``offload_optimizer`` the section gets ``offload_optimizer: {device: cpu, pin_memory: true}``
(ZeRO-Offload), and DeepSpeed insists on its CPU Adam (``deepspeed.ops.adam.DeepSpeedCPUAdam``).
"""

from __future__ import annotations

import json

GRADIENT_CLIPPING = 1.0
STEPS_PER_PRINT = 10


def _zero_section(stage: int, offload_optimizer: bool, n_params: float | None = None) -> dict:
    from autosp.cost_models.deepspeed_buffers import zero_config_fields

    section = dict(zero_config_fields(stage, n_params))
    if offload_optimizer:
        # ZeRO-Offload: DeepSpeed then requires its CPU Adam (DeepSpeedCPUAdam) as the optimizer
        section["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return section


def deepspeed_config(plan) -> dict:
    """A DeepSpeed config dict for launching ``plan`` on ``dp x sp`` processes (see the module doc)."""
    c, w = plan.candidate, plan.workload
    world = c.dp * c.sp
    sequences = c.micro_batch * c.grad_accum * c.dp
    return {
        "train_batch_size": c.micro_batch * c.grad_accum * world,
        "train_micro_batch_size_per_gpu": c.micro_batch,
        "gradient_accumulation_steps": c.grad_accum,
        "gradient_clipping": GRADIENT_CLIPPING,
        "steps_per_print": STEPS_PER_PRINT,
        "wall_clock_breakdown": False,
        "bf16": {"enabled": w.dtype == "bf16"},
        "zero_optimization": _zero_section(c.zero_stage, c.offload_optimizer, plan.model.n_params()),
        "autosp": {
            "note": ("DeepSpeed's data-parallel world here is all dp*sp ranks; train_batch_size counts "
                     "sequence shards (sp per sequence). Sequences per optimizer step: "
                     "sequences_per_step."),
            "world_size": world,
            "sp": c.sp,
            "ulysses": c.ulysses,
            "ring": c.ring,
            "dp": c.dp,
            "seq_len": w.seq_len,
            "sequences_per_step": sequences,
            "tokens_per_step": sequences * w.seq_len,
            "checkpointing": c.checkpointing,
            "mlp_chunks": c.mlp_chunks,
            "loss_chunks": c.loss_chunks,
            "offload_activations": c.offload_activations,
            "overlap": c.overlap,
            "offload_optimizer": c.offload_optimizer,
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
        },
    }


def deepspeed_config_json(plan) -> str:
    return json.dumps(deepspeed_config(plan), indent=2) + "\n"
