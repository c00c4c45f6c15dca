"""Which plan an :mod:`autosp.hf` trainer runs, and the DeepSpeed config its Trainer must use for it.

A trainer takes ``plan=`` (a plan file, a Plan or a Candidate), or ``sp_size=`` / ``ring_size=`` for a
hand-made plan whose batch sizes and ZeRO settings are the TrainingArguments' own, or neither: then it plans
with :func:`autosp.plan` for the model's config, the sequence length and the launched world.

The Trainer's batch sizes must be the plan's (``per_device_train_batch_size`` = micro-batch per
data-parallel replica, ``gradient_accumulation_steps`` = grad_accum): the plan priced memory for them. Its
DeepSpeed config (``TrainingArguments(deepspeed=...)``, or ``accelerate launch``'s DeepSpeed plugin) must
agree with the plan's ZeRO stage and offloads; without one, a plan that needs ZeRO gets the plan's own config
(:func:`plan_ds_config`), and a ZeRO-0 plan runs under the Trainer's DDP. Every disagreement is one
:class:`~autosp.errors.UsageError`.
"""

from __future__ import annotations

import json
import os
import tempfile

from autosp.errors import UsageError

# Accelerator names in torch.cuda.get_device_name() and the hardware catalog entry they are
# (cost_models/catalog/hardware.toml); the default plan needs one of them, or plan_hw=.
_DEVICE_NAMES = (("gh200", "gh200"), ("h200", "h200"), ("h100", "h100"), ("b200", "b200"), ("mi300x", "mi300x"),
                 ("a100", None))


def detect_hardware(world: int) -> str:
    """The catalog name of this machine's accelerator times the launched world (``h100x8``)."""
    import torch

    if not torch.cuda.is_available():
        raise UsageError("no GPU to plan for: pass plan= (a plan file from autosp-plan), sp_size=, or plan_hw= "
                         "(a cluster the planner knows, e.g. 'h100x8')")
    name = torch.cuda.get_device_name(0).lower().replace(" ", "")
    for key, entry in _DEVICE_NAMES:
        if key in name:
            if entry is None:  # A100 in two memory sizes
                gib = torch.cuda.get_device_properties(0).total_memory / 2**30
                entry = "a100-80g" if gib > 60 else "a100-40g"
            return f"{entry}x{world}"
    raise UsageError(f"the planner has no hardware entry for {torch.cuda.get_device_name(0)!r}: pass plan_hw= "
                     f"(a cluster .toml, see autosp-plan --help) or plan= / sp_size=")


def model_spec_of(model):
    """The planner's ModelSpec of a Hugging Face model object (or a PEFT model around one), from its
    config: the analytic formulas, no tracing."""
    from autosp.cost_models.catalog.models import model_from_hf_config

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise UsageError("cannot plan for a model without a Hugging Face config; pass plan= or sp_size=")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "config.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config.to_dict(), f, default=str)
        return model_from_hf_config(path)


def sequence_length(args, dataset, explicit=None) -> int:
    """The context to plan for: ``plan_ctx=``, else TRL's ``max_length``, else the longest example among the
    first thousand of the training set."""
    if explicit is not None:
        return int(explicit)
    if getattr(args, "max_length", None):
        return int(args.max_length)
    if dataset is not None and hasattr(dataset, "__len__") and len(dataset):
        longest = 0
        for i in range(min(len(dataset), 1000)):
            ids = dataset[i].get("input_ids") if hasattr(dataset[i], "get") else None
            longest = max(longest, len(ids) if ids is not None else 0)
        if longest:
            return longest
    raise UsageError("cannot tell the sequence length to plan for: pass plan_ctx= (or plan= / sp_size=)")


def trainer_zero(args) -> dict | None:
    """The ZeRO settings of the Trainer's own DeepSpeed config, or None when it has none: ``{"stage",
    "offload_optimizer", "offload_param"}``. Read from ``TrainingArguments(deepspeed=...)`` or from the
    environment ``accelerate launch --use_deepspeed`` sets."""
    config = None
    if getattr(args, "hf_deepspeed_config", None) is not None:
        config = args.hf_deepspeed_config.config
    elif os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        path = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
        if path and path != "none":
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        else:
            env = os.environ.get
            return {"stage": int(env("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")),
                    "offload_optimizer": env("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "none") not in ("none", ""),
                    "offload_param": env("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "none") not in ("none", "")}
    if config is None:
        return None
    zero = config.get("zero_optimization", {}) or {}

    def offloaded(key):
        return (zero.get(key) or {}).get("device", "none") not in ("none", None)

    return {"stage": int(zero.get("stage", 0)), "offload_optimizer": offloaded("offload_optimizer"),
            "offload_param": offloaded("offload_param")}


def check_agreement(candidate, args, zero: dict | None, dtype: str | None) -> None:
    """One clear error when the TrainingArguments or the Trainer's DeepSpeed config contradict the plan."""
    if args.per_device_train_batch_size != candidate.micro_batch:
        raise UsageError(f"per_device_train_batch_size={args.per_device_train_batch_size} contradicts the plan's "
                         f"micro_batch={candidate.micro_batch} (sequences per data-parallel replica per micro-step)")
    if args.gradient_accumulation_steps != candidate.grad_accum:
        raise UsageError(f"gradient_accumulation_steps={args.gradient_accumulation_steps} contradicts the plan's "
                         f"grad_accum={candidate.grad_accum}")
    if zero is not None:
        for key, planned in (("stage", candidate.zero_stage), ("offload_optimizer", candidate.offload_optimizer),
                             ("offload_param", getattr(candidate, "offload_param", False))):
            if zero[key] != planned:
                name = "zero_stage" if key == "stage" else key
                raise UsageError(f"the Trainer's DeepSpeed config has ZeRO {key}={zero[key]} but the plan has "
                                 f"{name}={planned}; drop the DeepSpeed config (the plan's is used) or re-plan "
                                 f"with --fix {name}={json.dumps(zero[key])}")
    if dtype is not None:
        trainer_dtype = "bf16" if args.bf16 else ("fp16" if args.fp16 else "fp32")
        if trainer_dtype != dtype:
            raise UsageError(f"the plan trains in {dtype} but the TrainingArguments in {trainer_dtype}; set "
                             f"{'bf16=True' if dtype == 'bf16' else 'bf16=False'} or re-plan with --dtype "
                             f"{trainer_dtype}")


def plan_ds_config(candidate, dtype: str, n_params=None, pin_memory: bool = False) -> dict:
    """The plan's DeepSpeed config for the Trainer: autosp's (the ZeRO stage, buckets and offloads the cost
    model priced) with the batch sizes, clipping and precision left "auto" for the Trainer to fill from its
    TrainingArguments (which :func:`check_agreement` checked against the plan), and ZeRO-3 checkpoints saved
    as whole 16-bit weights so ``from_pretrained`` loads them."""
    from autosp.contract.deepspeed_config import deepspeed_config

    config = deepspeed_config(candidate, dtype, n_params=n_params, pin_memory=pin_memory)
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "gradient_clipping"):
        config[key] = "auto"
    config["bf16"] = {"enabled": "auto"}
    if candidate.zero_stage == 3:
        config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    return config


__all__ = ["check_agreement", "detect_hardware", "model_spec_of", "plan_ds_config", "sequence_length",
           "trainer_zero"]
