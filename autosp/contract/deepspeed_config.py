"""The DeepSpeed config of a training run, built in one place for every entry point.

``autosp-plan --ds-config`` (:mod:`autosp.planner.ds_config`, which adds its ``autosp`` section) and
``autosp.compile`` / ``autosp-train`` (:mod:`autosp.compiler.api`, with a plan or a hand-made
``sp_size=``) all call :func:`deepspeed_config`, so a planned run and a hand-made one train with the same
settings, and the ZeRO buckets are those the cost model charges memory and time for
(:mod:`autosp.contract.deepspeed_buffers`). It lives in ``cost_models`` because both the planner and
the compiler may import the cost model, and neither may import the other's internals.

Defaults, and how to override them:

- ``gradient_clipping`` = :data:`GRADIENT_CLIPPING` (1.0: clip the global gradient norm to 1, the usual
  setting for LLM training, e.g. the Hugging Face Trainer's ``max_grad_norm``). ``0`` turns clipping
  off. Override: ``autosp.CompileOptions(gradient_clipping=x)``, or any DeepSpeed key through
  ``CompileOptions(ds_config={...})``, which is merged over this config; or edit the file
  ``--ds-config`` wrote.
- ``steps_per_print`` = :data:`STEPS_PER_PRINT` (DeepSpeed's own default).
- Batch keys: DeepSpeed's data-parallel world is all ``dp x sp`` ranks (every rank of an SP group feeds
  it one shard of the same sequence), so ``train_batch_size`` = micro-batch x grad-accum x dp x sp
  (:mod:`autosp.planner.ds_config` explains why).
- ``zero_optimization``: the stage, the bucket sizes of ``deepspeed_buffers``, ZeRO-Offload of the
  optimizer (``offload_optimizer: {device: cpu}``) and, at stage 3, of the parameters
  (``offload_param: {device: cpu}``, cost_models/param_offload.py) when the candidate asks for them, and at stage 3
  ``memory_efficient_linear: false`` so ``F.linear`` stays visible to the compiler's graph.
- ``zero_allow_untested_optimizer``: the compiler passes a torch optimizer (AdamW) to DeepSpeed.
"""

from __future__ import annotations

from autosp.contract.deepspeed_buffers import zero_config_fields
from autosp.errors import UsageError

GRADIENT_CLIPPING = 1.0
"""Maximum global gradient norm (DeepSpeed ``gradient_clipping``); 0 disables clipping."""

STEPS_PER_PRINT = 10
"""DeepSpeed's progress line every this many steps (its default)."""


def zero_section(stage: int, offload_optimizer: bool = False, n_params: float | None = None,
                 pin_memory: bool = True, offload_param: bool = False) -> dict:
    """``zero_optimization``: the cost model's bucket sizes, ZeRO-Offload, and what the compiler needs."""
    section = dict(zero_config_fields(stage, n_params))
    if offload_optimizer and stage >= 1:
        # ZeRO-Offload: master weights, optimizer states and the step on the host
        section["offload_optimizer"] = {"device": "cpu", "pin_memory": bool(pin_memory)}
    if offload_param and stage == 3:
        # ZeRO-3 parameter offload: each rank's weight partition on the host, fetched before each module
        section["offload_param"] = {"device": "cpu", "pin_memory": bool(pin_memory)}
    if stage == 3:
        section["memory_efficient_linear"] = False  # keep F.linear visible to the compiler
    return section


def deepspeed_config(candidate, dtype: str, *, n_params: float | None = None,
                     gradient_clipping: float | None = None, pin_memory: bool = True) -> dict:
    """The DeepSpeed config for training ``candidate`` (a :class:`~autosp.contract.specs.Candidate`) in
    ``dtype`` on ``dp x sp`` processes. ``n_params`` sizes the gradient bucket (never larger than the
    model); ``gradient_clipping`` None means :data:`GRADIENT_CLIPPING`; ``pin_memory`` for the host copy
    of an offloaded optimizer (page-locked memory needs a GPU)."""
    if gradient_clipping is None:
        gradient_clipping = GRADIENT_CLIPPING
    if isinstance(gradient_clipping, bool) or not isinstance(gradient_clipping, (int, float)) \
            or not gradient_clipping >= 0:
        raise UsageError(f"gradient_clipping must be a number >= 0 (0 turns clipping off), got {gradient_clipping!r}")
    c = candidate
    return {
        "train_batch_size": c.micro_batch * c.grad_accum * c.dp * c.sp,
        "train_micro_batch_size_per_gpu": c.micro_batch,
        "gradient_accumulation_steps": c.grad_accum,
        "gradient_clipping": float(gradient_clipping),
        "steps_per_print": STEPS_PER_PRINT,
        "wall_clock_breakdown": False,
        "bf16": {"enabled": dtype == "bf16"},
        "zero_optimization": zero_section(c.zero_stage, c.offload_optimizer, n_params, pin_memory,
                                          getattr(c, "offload_param", False)),
        "zero_allow_untested_optimizer": True,
    }


__all__ = ["GRADIENT_CLIPPING", "STEPS_PER_PRINT", "deepspeed_config", "zero_section"]
