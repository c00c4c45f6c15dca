"""What turns a Hugging Face ``Trainer`` (or TRL ``SFTTrainer``) into a sequence-parallel one.

Design. autosp's SP runtime goes *inside* the Trainer's own data-parallel wrapper instead of replacing it:
the model's ``forward`` is compiled as autosp's SP graph (:func:`autosp.compiler.api.attach_sp`, the same
passes ``autosp.compile`` runs) and each micro-batch is sharded by the same runtime
(:class:`autosp.compiler.runtime.SPEngine`, here around the Trainer's wrapped model). Everything else, the
optimizer, scheduler, gradient clipping, DeepSpeed or DDP, checkpoints, callbacks and logging, stays the
Trainer's. This is exact for the reason ``autosp.compile`` is (compiler/runtime.py: "Gradient reduction"):
the wrapper sees all dp x sp ranks as data parallel and averages their gradients, and the compiled loss gives
each rank W x d(local token-loss sum) / N, whose average is the one-process gradient. DeepSpeed (plan ZeRO
>= 1) or DDP (ZeRO 0) both average over all W ranks.

What the Trainer is told:

- data: every rank loads the *whole* micro-batch of the dp data-parallel replicas (``per_device_train_batch_size
  x dp`` sequences, unsharded, in the one-process Trainer's order, checked identical across ranks each
  step); the runtime takes this rank's rows and tokens. Evaluation likewise.
- loss: the compiled loss is the micro-batch's exact global token mean; it is rescaled to the Trainer's
  convention (``num_items_in_batch``: tokens of the whole accumulated step, counted once, not once per rank), so
  the logged ``loss`` is the step's true token-weighted mean and gradient accumulation is token-weighted as in
  transformers >= 4.46.
- evaluation returns the loss only (no logits: under SP each rank holds a shard of them), not gathered across
  ranks (each holds the same global value) and weighted by the batch's examples (:meth:`_sp_gather_loss`).
- mixture of experts: the experts run through autosp's expert op, unsharded (``ep`` = 1: the Trainer's wrapper
  reduces them as any parameter), and the router's load-balancing loss is the whole micro-batch's
  (compiler/router_loss.py), weighted in each micro-step's loss as the base trainer weighs it
  (:meth:`_sp_aux_weight`), not as the token loss is rescaled.
"""

from __future__ import annotations

import dataclasses

from autosp.errors import UsageError

# batch keys the SP runtime takes; the others are derived from position_ids (TRL's and transformers'
# padding-free collators send them for FlashAttention's varlen kernels) and dropped
_TAKEN = ("input_ids", "labels", "attention_mask", "position_ids")
_DERIVED = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx", "use_cache",
            "num_items_in_batch")


class _Target:
    """What the SP runtime calls: the Trainer's (wrapped) model of the current step. Gives the runtime the
    innermost model (its forward's signature) and the device; ``observe(output, inputs)``, when set, sees the
    model's output of this rank's shard and the shard's inputs (the SFTTrainer's token metrics)."""

    def __init__(self, module, device):
        self.module = module
        self.device = device
        self.call = None
        self.observe = None
        self.aux_loss = None  # the last call's router load-balancing loss (MoE), part of the returned loss

    def __call__(self, **inputs):
        import torch

        out = self.call(**inputs)
        aux = out.get("aux_loss") if isinstance(out, dict) else getattr(out, "aux_loss", None)
        self.aux_loss = aux if isinstance(aux, torch.Tensor) else None
        if self.observe is not None:
            self.observe(out, inputs)
        return out


def innermost(model):
    """The Hugging Face model inside a PEFT wrapper (whose LoRA layers are injected into it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


class SPTrainerMixin:
    """Mixed in before ``transformers.Trainer`` (or ``trl.SFTTrainer``); see the module doc."""

    def __init__(self, *args, plan=None, sp_size=None, ring_size=None, plan_hw=None, plan_ctx=None,
                 backend: str = "inductor", pad_to_multiple_of: int = 1, **kwargs):
        import torch

        model = kwargs.get("model", args[0] if args else None)
        targs = kwargs.get("args", args[1] if len(args) > 1 else None)
        if targs is None:
            raise UsageError("autosp.hf trainers need args= (TrainingArguments / SFTConfig)")
        if getattr(targs, "parallelism_config", None) is not None and (targs.parallelism_config.sp_size or 1) > 1:
            raise UsageError("parallelism_config with sp_size > 1 is ALST's sequence parallelism; autosp.hf runs its "
                             "own: drop parallelism_config (or use transformers.Trainer for ALST)")
        self._sp_candidate, self._sp_dtype = self._resolve_plan(model, targs, kwargs.get("train_dataset"), plan,
                                                                sp_size, ring_size, plan_hw, plan_ctx)
        c = self._sp_candidate
        from autosp.hf import plan as planning

        zero = planning.trainer_zero(targs)
        planning.check_agreement(c, targs, zero, self._sp_dtype)
        changes = {}
        if zero is None and c.zero_stage > 0:
            n_params = sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else None
            changes["deepspeed"] = planning.plan_ds_config(c, self._sp_dtype or "fp32", n_params,
                                                           torch.cuda.is_available())
        # transformers >= 5 spells it activation_checkpointing (gradient_checkpointing its deprecated alias)
        flags = [f.name for f in dataclasses.fields(targs)
                 if f.name in ("activation_checkpointing", "gradient_checkpointing")]
        if any(getattr(targs, name) for name in flags):
            # The plan owns activation checkpointing: autosp's passes recompute inside the SP graph they build
            # (compiler/passes), while Hugging Face's checkpoint wrappers would hide each layer's attention from
            # them (TRL's SFTConfig turns gradient_checkpointing on by default). A hand-made plan recomputes
            # whole layers, as the Trainer's option asked; a planned one keeps the policy it was priced with.
            changes.update(dict.fromkeys(flags, False))
            if plan is None and sp_size is not None and c.checkpointing == "none":
                self._sp_candidate = c = dataclasses.replace(c, checkpointing="full")
        if changes:
            targs = dataclasses.replace(targs, **changes)
            if args and len(args) > 1:
                args = (args[0], targs, *args[2:])
            else:
                kwargs["args"] = targs
        if c.zero_stage == 3 and model is not None and hasattr(model, "named_modules"):
            from autosp.compiler.api import _leaf_block_names
            from autosp.compiler.zero3 import set_leaf_modules

            # each decoder layer gathered and traced as one graph (compiler/runtime.py: ZeRO-3)
            set_leaf_modules(model, _leaf_block_names(model))
        self._sp_backend, self._sp_pad_multiple = backend, pad_to_multiple_of
        super().__init__(*args, **kwargs)
        self.loss_is_scaled_for_ga = True  # compute_loss divides by the accumulated step's tokens itself
        self._attach()

    # -- set-up ------------------------------------------------------------------------------------
    @staticmethod
    def _resolve_plan(model, args, dataset, plan, sp_size, ring_size, plan_hw, plan_ctx):
        from autosp.compiler.api import hand_made_candidate, resolve_candidate

        world = args.world_size
        dtype = None
        if plan is None and sp_size is None:
            import autosp
            from autosp.hf import plan as planning

            if model is None or isinstance(model, str):
                raise UsageError("plan the run from a model object, or pass plan= / sp_size=")
            zero = planning.trainer_zero(args)
            fix = [f"micro_batch={args.per_device_train_batch_size}",
                   f"grad_accum={args.gradient_accumulation_steps}", "ep=1"]  # experts unsharded: see _attach
            if zero is not None:
                fix += [f"zero_stage={zero['stage']}", f"offload_optimizer={str(zero['offload_optimizer']).lower()}"]
            dtype = "bf16" if args.bf16 else "fp32"
            plan = autosp.plan(planning.model_spec_of(model), planning.sequence_length(args, dataset, plan_ctx),
                               plan_hw or planning.detect_hardware(world), dtype=dtype, fix=fix,
                               global_batch=None)
        if plan is not None:
            candidate, source = resolve_candidate(plan, sp_size, world)
            if ring_size is not None and ring_size != candidate.ring:
                raise UsageError(f"ring_size={ring_size} contradicts the plan's ring={candidate.ring}")
            dtype = getattr(getattr(source, "workload", None), "dtype", dtype)
            if candidate.world_size != world:
                raise UsageError(f"the plan needs dp x sp = {candidate.dp} x {candidate.sp} = {candidate.world_size} "
                                 f"processes but {world} were launched")
            return candidate, dtype
        from autosp.hf import plan as planning

        zero = planning.trainer_zero(args) or {"stage": 0, "offload_optimizer": False}
        candidate = hand_made_candidate(sp_size, world, ring=ring_size, micro_batch=args.per_device_train_batch_size,
                                        grad_accum=args.gradient_accumulation_steps, zero_stage=zero["stage"],
                                        offload_optimizer=zero["offload_optimizer"])
        return candidate, None

    def _attach(self):
        import torch
        import torch.distributed as dist

        from autosp.compiler.api import attach_sp
        from autosp.compiler.experts import prepare_experts
        from autosp.compiler.groups import make_layout
        from autosp.compiler.runtime import SPEngine
        from autosp.compiler.windows import layer_windows

        if not dist.is_initialized():
            raise UsageError("autosp.hf needs torch.distributed: launch with torchrun, accelerate launch or deepspeed")
        # Under DDP Dynamo would split the compiled graph at DDP's bucket boundaries (DDPOptimizer); autosp's
        # passes need each forward whole, and DDP's gradient hooks work as well on one graph.
        torch._dynamo.config.optimize_ddp = False
        c = self._sp_candidate
        model = innermost(self.model)
        windows = layer_windows(getattr(model, "config", None))
        if c.ep > 1:
            raise UsageError(f"autosp.hf trains a mixture of experts with ep=1 (each rank holds every expert; the "
                             f"Trainer's DDP or DeepSpeed engine reduces them as dense parameters), the plan has "
                             f"ep={c.ep}: re-plan with --fix ep=1, or train with autosp.compile / autosp-train")
        self._sp_layout = make_layout(c)
        moe = prepare_experts(model, 1)  # MoE: experts through autosp's op, the router loss made global by attach_sp
        ctx, pad = attach_sp(model, c, self._sp_layout, grad_world_size=dist.get_world_size(), windows=windows,
                             backend=self._sp_backend, moe=bool(moe))
        self._sp_target = _Target(model, self.args.device)
        self._sp_engine = SPEngine(self._sp_target, self._sp_layout, ctx, c, ignore_index=-100, pad_token_id=pad,
                                   pad_to_multiple_of=self._sp_pad_multiple, dtype=self._sp_dtype or "fp32",
                                   backend=self._sp_backend)
        self._sp_engine.fixed_batch = False  # an epoch's last batch may be shorter (any multiple of dp)

    @property
    def sp_engine(self):
        """The SP runtime (its ``stats`` say what the passes did)."""
        return self._sp_engine

    # -- data: every rank loads the whole micro-batch -----------------------------------------------
    def _get_dataloader(self, dataset, description, batch_size, *args, **kwargs):
        accelerator = self.accelerator
        accelerator.prepare = self._prepare_unsharded
        try:
            return super()._get_dataloader(dataset, description, batch_size * self._sp_candidate.dp, *args, **kwargs)
        finally:
            del accelerator.prepare

    def _prepare_unsharded(self, dataloader):
        """What ``accelerator.prepare`` gives the one-process Trainer, on every rank: Accelerate's wrapping for
        one process, not sharded. Its seedable sampler reseeds each epoch with ``data_seed`` (or torch's initial
        seed, which the Trainer sets from ``seed``) + the epoch, as the one-process run does (a generator of
        our own, drawing on across epochs, gave other batches from the second epoch on). Seedable even where
        the user turned it off, since every rank must draw the same order."""
        from accelerate.data_loader import prepare_data_loader

        accelerator = self.accelerator
        return prepare_data_loader(dataloader, accelerator.device, num_processes=1, process_index=0,
                                   split_batches=accelerator.split_batches, put_on_device=accelerator.device_placement,
                                   rng_types=[], dispatch_batches=False, even_batches=accelerator.even_batches,
                                   use_seedable_sampler=True, data_seed=accelerator.dataloader_config.data_seed,
                                   non_blocking=accelerator.non_blocking,
                                   use_stateful_dataloader=accelerator.use_stateful_dataloader)

    def get_total_train_batch_size(self, args) -> int:
        return args.per_device_train_batch_size * args.gradient_accumulation_steps * self._sp_candidate.dp

    # -- tokens and the loss ----------------------------------------------------------------------
    def _get_num_items_in_batch(self, batch_samples, device):
        """The targets of the whole accumulated step, counted once (every rank holds all of them)."""
        import torch

        if not batch_samples or "labels" not in batch_samples[0]:
            return None
        count = sum(int((b["labels"][..., 1:] != -100).sum()) for b in batch_samples)
        return torch.tensor(count, device=device)

    def _track_num_input_tokens(self, inputs):
        before = self.state.num_input_tokens_seen
        super()._track_num_input_tokens(inputs)  # gathers every rank's count: W copies of the same batch
        added = self.state.num_input_tokens_seen - before
        self.state.num_input_tokens_seen = before + added // self.args.world_size

    def _check_same_batch(self, ids):
        """Every rank must hold the same batch (the runtime takes its rows and tokens from it)."""
        import torch
        import torch.distributed as dist

        weights = torch.arange(1, ids.numel() + 1, dtype=torch.float64, device=ids.device)
        mark = (ids.flatten().to(torch.float64) * weights.remainder(1009)).sum()
        both = torch.stack([mark, -mark, torch.tensor(float(ids.numel()), dtype=torch.float64, device=ids.device)])
        seen = both.clone()
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        if not torch.equal(seen[:2], both[:2]) or seen[2] != both[2]:
            raise UsageError("the ranks loaded different batches; autosp.hf needs every rank to load the whole "
                             "batch in one order (a custom dataloader or sampler must not shard or reshuffle per rank)")

    def _sp_loss(self, model, inputs):
        """The micro-batch's exact global mean loss through the SP runtime."""
        unknown = sorted(k for k in inputs if k not in _TAKEN and k not in _DERIVED)
        if unknown:
            raise UsageError(f"autosp.hf cannot shard the batch keys {', '.join(unknown)} over the sequence; the "
                             f"SP runtime takes {', '.join(_TAKEN)}")
        if "labels" not in inputs:
            raise UsageError("autosp.hf trains on labels: the collator must return labels")
        batch = {k: inputs[k] for k in _TAKEN if k in inputs}
        if "position_ids" not in batch and "cu_seq_lens_q" in inputs:
            batch["cu_seq_lens"] = inputs["cu_seq_lens_q"]
        self._check_same_batch(batch["input_ids"])
        if self._sp_candidate.zero_stage == 3 and self.is_deepspeed_enabled:
            from autosp.compiler.api import keep_zero3_hooks_eager

            if self._sp_candidate.loss_chunks > 1 and self.deepspeed is not None:
                from autosp.compiler.zero3 import persist_lm_head

                # the tiled loss traces the LM head inline: resident and unhooked in the Trainer's engine, as
                # autosp.compile does in its own (compiler/zero3.py); done again it changes nothing
                persist_lm_head(self.deepspeed)
            # the hooks DeepSpeed registered when the Trainer wrapped the model (again for each new engine:
            # evaluation before training builds one, training another); hooks already made eager are skipped
            keep_zero3_hooks_eager(self.model)
        self._sp_target.call = model
        return self._sp_engine(**batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = self._sp_loss(model, inputs)
        step_scaled = num_items_in_batch is not None and self.model.training
        if step_scaled:
            # the compiled loss is sum / N_micro; the Trainer's convention is sum / N_step for each micro-step
            n_micro = int((inputs["labels"][..., 1:] != -100).sum())
            scale = n_micro / max(float(num_items_in_batch), 1.0)
        else:
            scale = 1.0 / self.current_gradient_accumulation_steps if self.model.training else 1.0
        loss = loss * scale
        aux = self._sp_target.aux_loss
        if aux is not None:
            # MoE: the model added coef x aux to its token mean, so the line above scaled it as a token loss;
            # it gets the weight the base trainer gives it instead
            coef = _model_aux_coef(innermost(self.model))
            loss = loss + aux * (self._sp_aux_weight(step_scaled, scale, coef) - coef * scale)
        return (loss, None) if return_outputs else loss

    def _sp_aux_weight(self, step_scaled: bool, scale: float, model_coef: float) -> float:
        """The weight of the router's load-balancing loss in one micro-step's loss, as ``transformers.Trainer``
        gives it: the model's own ``model_coef x aux`` inside its loss, which, normalised by the step's tokens
        (``step_scaled``), the Trainer neither rescales nor divides by the gradient accumulation: each micro-step
        adds ``model_coef x aux`` (else the whole loss is scaled by ``scale``: 1 / the accumulation, or 1 in
        evaluation). ``autosp.hf.SFTTrainer`` weighs it as TRL does."""
        return model_coef if step_scaled else model_coef * scale

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        import torch

        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            loss = self._sp_loss(model, inputs)
        self._sp_eval_rows = self._eval_batch_examples()
        return loss.detach(), None, None

    def _eval_batch_examples(self) -> int:
        """The dataset examples in this evaluation batch as the one-process loop weighs it: the batch size, or
        at the end of the data the remainder Accelerate's gather_for_metrics keeps. Not the batch's rows: a
        padding-free batch (TRL's) is one row of all its examples."""
        state = self.accelerator.gradient_state
        if state.end_of_dataloader and state.remainder > 0:
            return state.remainder
        return self.args.eval_batch_size * self._sp_candidate.dp

    def _sp_gather_loss(self, losses):
        """The evaluation loop's gather of ``loss.repeat(eval_batch_size)``: every rank holds the same global
        loss of the same whole batch, so nothing is gathered (Accelerate's gather would count it once per
        rank), and the loss is weighted by the batch's examples: eval_loss is the example-weighted mean of each
        batch's token mean, as the one-process Trainer computes it."""
        return losses[:1].repeat(self._sp_eval_rows)

    def evaluation_loop(self, *args, **kwargs):
        if self._sp_candidate.zero_stage == 3 and self.is_deepspeed_enabled and self.deepspeed is None:
            # measured: the training engine DeepSpeed builds after this evaluation's inference engine has no
            # ZeRO-3 parameter hooks on the model's modules, so training would read unfetched weights
            raise UsageError("evaluation before training is not supported under ZeRO-3 (DeepSpeed's inference "
                             "engine leaves the later training engine without its parameter hooks); evaluate "
                             "after train() or with eval_strategy, or re-plan with --fix zero_stage=2")
        self.gather_function = self._sp_gather_loss  # the loop resets it to gather_for_metrics at its end
        try:
            return super().evaluation_loop(*args, **kwargs)
        finally:
            if not self.is_in_train and not self.is_deepspeed_enabled and self.model_wrapped is self.model:
                # An evaluation before training "prepares" the bare model for evaluation, and Accelerate then
                # marks it prepared: train() would get it back without DDP and every rank would step on its
                # own gradients (found by the exactness test; a plain multi-process Trainer has the same trap).
                self.model.__dict__.pop("_is_accelerate_prepared", None)
                if self.model in self.accelerator._models:
                    self.accelerator._models.remove(self.model)


def _model_aux_coef(model) -> float:
    """The coefficient a Hugging Face MoE model's forward multiplies its load-balancing loss by."""
    coef = getattr(model, "router_aux_loss_coef", None)
    return float(coef if coef is not None else getattr(model.config, "router_aux_loss_coef", 0.0))


__all__ = ["SPTrainerMixin", "innermost"]
