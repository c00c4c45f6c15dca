"""``autosp.compile``: from a model and a plan to a running sequence-parallel DeepSpeed engine.

The compiler imports nothing from the planner (``tests/project/test_layering.py`` checks it): what the two share
is the contract, ``autosp/contract/`` -- the Candidate and its admission rules, the plan file and its loader
(:func:`load_plan`), the DeepSpeed config builder, the op tables and the dtypes. A plan is the planner's output
and the compiler's input.
"""

from __future__ import annotations

import copy
import os

from autosp.compiler.options import CompileOptions
from autosp.contract.rules import candidate_reason
from autosp.contract.specs import Candidate
from autosp.errors import UsageError

RECOMPILE_LIMIT = 64


def load_plan(path):
    """The plan JSON at ``path`` (written by ``autosp-plan --plan-out``), read by the contract's loader."""
    from autosp.contract.plan import load_plan as read_plan

    return read_plan(path)


def resolve_candidate(plan=None, sp_size=None, world_size=None) -> tuple[Candidate, object]:
    """The candidate to run and the Plan it came from (or None): ``plan`` (a plan file path, a Plan or a Candidate;
    ``sp_size``, if given too, must agree with it), or for ``sp_size`` alone :func:`hand_made_candidate`."""
    if plan is None:
        if sp_size is None:
            raise UsageError("autosp.compile needs plan= (a plan file, a Plan or an autosp.Candidate) or sp_size=")
        return hand_made_candidate(sp_size, world_size), None
    source = None
    if isinstance(plan, (str, os.PathLike)):
        plan = load_plan(plan)
    if isinstance(plan, Candidate):
        candidate = plan
    elif hasattr(plan, "candidate") and isinstance(plan.candidate, Candidate):
        candidate, source = plan.candidate, plan
    else:
        raise UsageError("plan must be a path to a plan JSON, a Plan or an autosp.Candidate")
    if sp_size is not None and sp_size != candidate.sp:
        raise UsageError(f"sp_size={sp_size} contradicts the plan's sp={candidate.sp}")
    _refuse_impossible_combinations(candidate)
    return candidate, source


def hand_made_candidate(sp_size, world_size, **knobs) -> Candidate:
    """``Candidate(sp=sp_size, dp=world_size / sp_size, **knobs)``: the plan ``autosp.compile(model, sp_size=N)``
    runs, and a launcher's or trainer's flags filled in (knobs given as None keep the Candidate's defaults)."""
    if not isinstance(sp_size, int) or isinstance(sp_size, bool) or sp_size < 1:
        raise UsageError(f"sp_size must be a positive integer, got {sp_size!r}")
    knobs = {name: value for name, value in knobs.items() if value is not None}
    if "dp" not in knobs:
        if world_size is None or world_size % sp_size:
            raise UsageError(f"sp_size={sp_size} does not divide the {world_size} launched processes")
        knobs["dp"] = world_size // sp_size
    try:
        candidate = Candidate(sp=sp_size, **knobs)
    except ValueError as err:
        raise UsageError(str(err)) from None
    _refuse_impossible_combinations(candidate)
    return candidate


def _refuse_impossible_combinations(candidate: Candidate) -> None:
    """Knob combinations that mean nothing in the compiled graph: the planner's own admission rules
    (autosp.contract.rules), which a hand-made plan must meet too."""
    reason = candidate_reason(candidate)
    if reason:
        raise UsageError(reason)


def deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in (extra or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def deepspeed_config(candidate: Candidate, dtype: str, plan=None, model=None, gradient_clipping=None) -> dict:
    """The run's DeepSpeed config: :func:`autosp.contract.deepspeed_config.deepspeed_config`, the one
    builder ``autosp-plan --ds-config`` uses too. DeepSpeed sees all dp x sp ranks as data parallel (see
    autosp.compiler.runtime). The gradient bucket is sized for the plan's model (what its cost model
    charged) or else for ``model``'s parameters."""
    import torch

    from autosp.contract.deepspeed_config import deepspeed_config as run_config

    n_params = None
    if plan is not None and hasattr(getattr(plan, "model", None), "n_params"):
        n_params = plan.model.n_params()
    elif model is not None:
        n_params = sum(p.numel() for p in model.parameters())
    return run_config(candidate, dtype, n_params=n_params, gradient_clipping=gradient_clipping,
                      pin_memory=torch.cuda.is_available())


def _leaf_block_names(model) -> list[str]:
    """Children of every nn.ModuleList (the repeated decoder layers): ZeRO-3 leaf modules."""
    import torch

    names = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList):
            names.extend(f"{name}.{child}" if name else child for child, _ in module.named_children())
    return names


def _parameter_layers(model) -> dict:
    """{id(parameter): index of the decoder layer it belongs to}: the list index of the repeated block (a
    child of an ``nn.ModuleList``) holding it. Lets a pass name the layer of a ZeRO-3 layer graph."""
    out = {}
    for name in _leaf_block_names(model):
        index = name.rsplit(".", 1)[-1]
        if index.isdigit():
            for param in model.get_submodule(name).parameters():
                out[id(param)] = int(index)
    return out


_WINDOW_TYPES: dict = {}


def _distinct_window_layer_types(model, windows) -> None:
    """ZeRO-3 compiles each decoder layer from the layer's own frame, and Dynamo reuses one compiled layer
    graph for every layer of the same class: a windowed layer would run a global layer's attention (the
    window is a constant of the graph, and Hugging Face's window attribute is not guarded). Giving the
    windowed layers a subclass per window (same name, no new behaviour) makes Dynamo's type guard compile
    them apart. Their submodules too: a layer's frame can break inside it (transformers' output-recording
    hooks, which a mixture of experts' router loss installs, read a ContextVar Dynamo cannot trace), and the
    attention module's own frame is then the compiled one (gpt-oss)."""
    for name in _leaf_block_names(model):
        index = name.rsplit(".", 1)[-1]
        if not index.isdigit() or int(index) >= len(windows) or windows[int(index)] is None:
            continue
        for module in model.get_submodule(name).modules():
            base = type(module)
            key = (base, windows[int(index)])
            if key not in _WINDOW_TYPES:
                _WINDOW_TYPES[key] = type(base.__name__, (base,), {"__module__": base.__module__,
                                                                   "__qualname__": base.__qualname__})
            module.__class__ = _WINDOW_TYPES[key]


def keep_zero3_hooks_eager(model) -> None:
    """Make every module hook DeepSpeed's ZeRO-3 registered opaque to Dynamo.

    Some of them are ``torch.compiler.disable``d already, others (the post-forward hook, the hook that
    attaches the pre-backward autograd function) are not, and Dynamo then traces DeepSpeed's parameter
    coordinator, recompiling it on every grad-mode or output-type change. Either way each hook is a graph
    break; disabling all of them keeps them eager and out of the compiler's sight.
    """
    import torch

    for module in model.modules():
        for hooks in (module._forward_pre_hooks, module._forward_hooks):
            for key, hook in list(hooks.items()):
                if getattr(hook, "__module__", "").startswith("deepspeed.") and not getattr(hook, "_autosp_eager", False):
                    wrapped = torch._dynamo.disable(hook, recursive=True)
                    wrapped._autosp_eager = True
                    hooks[key] = wrapped


def attach_sp(module, candidate: Candidate, layout, *, grad_world_size: int, windows=None, packed: bool = False,
              backend: str = "inductor", ignore_index: int = -100, pad_token_id: int | None = None, ds_engine=None,
              moe: bool = False):
    """Compile ``module.forward`` as the sequence-parallel graph of ``candidate`` and return its
    :class:`SPContext` and the pad token. ``grad_world_size``: the ranks whose gradients the data-parallel
    wrapper averages (all dp x sp of them). ``ds_engine``: the DeepSpeed engine holding ``module``, when it
    exists already (ZeRO-3's hooks are then made opaque to Dynamo here, and with ``loss_chunks > 1`` the LM
    head made resident; otherwise the caller does both with :func:`keep_zero3_hooks_eager` and
    :func:`autosp.compiler.zero3.persist_lm_head` once its wrapper registered them, before the first
    forward). Used by :func:`compile_model` and by the Hugging Face trainers (:mod:`autosp.hf`), whose own
    DeepSpeed or DDP wrapper averages the gradients. ``moe``: the model's experts run through autosp's op
    (:func:`autosp.compiler.experts.prepare_experts`), so its router loss is made global here."""
    import torch

    from autosp.compiler.backend import make_backend
    from autosp.compiler.context import SPContext, unique_key

    if pad_token_id is None:
        pad_token_id = getattr(getattr(module, "config", None), "pad_token_id", None)
        if not isinstance(pad_token_id, int) or pad_token_id < 0:
            pad_token_id = 0
    windows = windows or []
    router_key = ""
    from autosp.compiler.sinks import use_sink_attention
    from autosp.compiler.softcapping import use_capped_attention

    use_capped_attention(module)  # Gemma 2: its soft-capped eager attention as one op the passes shard
    use_sink_attention(module)  # gpt-oss: its eager attention with sinks, likewise
    if moe:
        from autosp.compiler.router_loss import patch_router_loss

        if patch_router_loss(module):  # the router's load-balancing loss over the whole batch
            router_key = unique_key("router")
    param_layers = {}
    if windows and len(set(windows)) > 1:
        param_layers = _parameter_layers(module)
        if candidate.zero_stage == 3:
            _distinct_window_layer_types(module, windows)
    ctx = SPContext(candidate=candidate, sp_rank=layout.sp_rank, sp_group=layout.sp_group.group_name,
                    world_group=layout.world_group.group_name, grad_world_size=grad_world_size,
                    ignore_index=ignore_index,
                    ulysses_group=layout.ulysses_group.group_name if layout.ulysses_group is not None else None,
                    ring_group=layout.ring_group.group_name if layout.ring_group is not None else None,
                    rule=unique_key("engine") if packed or windows else "", layer_windows=windows,
                    router_key=router_key, param_layers=param_layers)
    from autosp.compiler.linear_attention import install as install_linear_attention

    install_linear_attention(module, ctx)  # Gated DeltaNet layers: head all-to-alls around conv + recurrence
    # Compile the model's forward, not the module call: DeepSpeedEngine.compile() wraps the module's
    # __call__, which includes DeepSpeed's own forward pre/post hooks (timers calling time.time(), the
    # flops profiler), a graph break that fullgraph=True rejects. The hooks stay eager around the graph.
    import deepspeed.utils.nvtx

    if ctx.fragments and candidate.loss_chunks > 1:
        from autosp.compiler.zero3 import lm_head_module, persist_lm_head

        if lm_head_module(module) is None:  # the LM head must be traced inline with the loss
            raise UsageError("loss_chunks > 1 under ZeRO-3 needs the model's LM head (get_output_embeddings() or "
                             "an lm_head module); re-plan with loss_chunks=1 or zero_stage<=2")
        if ds_engine is not None:  # else the caller, once its wrapper built the engine (autosp.hf)
            persist_lm_head(ds_engine)
    if ctx.fragments and ds_engine is not None:
        keep_zero3_hooks_eager(module)

    deepspeed.utils.nvtx.enable_nvtx = False  # as DeepSpeedEngine.compile does: NVTX ranges break graphs
    # Each distinct (padded) sequence length is one static-shape compilation; allow a training run's worth
    # (pad_to_multiple_of bounds how many there are).
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    # A PEFT model's LoRA layers live inside its own model; compile that model's forward (PEFT's wrapper
    # forward stays eager around it and passes every argument through).
    target = module.get_base_model() if hasattr(module, "get_base_model") else module
    target.forward = torch.compile(target.forward, backend=make_backend(ctx, backend), dynamic=False,
                                   fullgraph=not ctx.fragments)
    return ctx, pad_token_id


def compile_model(model, plan=None, *, sp_size: int | None = None, options: CompileOptions | None = None):
    """Build the sequence-parallel DeepSpeed engine for ``model``.

    Args:
        model: an unmodified causal LM (``nn.Module``) whose ``forward(input_ids=..., labels=...)`` computes
            the loss with ``F.cross_entropy`` and attention with ``F.scaled_dot_product_attention``.
        plan: what runs -- a plan file path, a :class:`~autosp.contract.plan.Plan` or a
            :class:`~autosp.contract.specs.Candidate`, whose fields are every knob: ``sp`` x ``dp`` ranks,
            ``ring`` (2-D sequence parallelism: Ulysses all-to-alls over sp / ring ranks, ring attention over
            ``ring`` ranks), ``zero_stage``, ``micro_batch`` (sequences per DP rank per call: every rank passes
            dp x micro_batch sequences), ``grad_accum`` (calls per optimizer step; each call's loss is that
            micro-batch's exact global mean), ``offload_optimizer``, ``ep`` (experts spread over groups of ``ep``
            ranks, :mod:`autosp.compiler.experts`), checkpointing, tiling and the other memory knobs.
        sp_size: instead of ``plan``: ``Candidate(sp=sp_size, dp=world / sp_size)``, every other knob at its
            default (given with ``plan``, it must equal the plan's ``sp``).
        options: how it runs -- a :class:`~autosp.compiler.options.CompileOptions` (optimizer, learning rate and
            schedule, dtype, backend, DeepSpeed overrides, padding, packed documents); default
            ``CompileOptions()``.
    """
    import torch.distributed as dist

    if options is None:
        options = CompileOptions()
    elif not isinstance(options, CompileOptions):
        raise UsageError(f"options must be an autosp.CompileOptions, got {type(options).__name__}")
    plan = load_plan(plan) if isinstance(plan, (str, os.PathLike)) else plan  # its workload's dtype is the default
    dtype, windows = _checked_model(model, plan, options.dtype)
    import deepspeed

    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend=options.dist_backend or _default_dist_backend())
    candidate, source_plan = resolve_candidate(plan, sp_size, dist.get_world_size())
    from autosp.compiler.linear_attention import check_plan

    check_plan(model, candidate)  # Gated DeltaNet layers: no ring, heads over the Ulysses ranks

    from autosp.compiler.groups import make_layout
    from autosp.compiler.runtime import SPEngine

    layout = make_layout(candidate)
    config = deep_merge(deepspeed_config(candidate, dtype, source_plan, model, options.gradient_clipping),
                        options.ds_config or {})
    if candidate.zero_stage == 3:
        _mark_zero3_leaves(model, options.z3_leaf_modules)

    from autosp.compiler.experts import prepare_experts

    moe = prepare_experts(model, candidate.ep)  # MoE: experts through autosp's op; ep > 1: this rank's experts only
    optimizer, lr_scheduler = _optimizer_and_scheduler(model, candidate, config, options)
    ds_engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, lr_scheduler=lr_scheduler)
    if ds_engine.dp_world_size != candidate.world_size:
        raise UsageError(f"DeepSpeed's data-parallel world is {ds_engine.dp_world_size} ranks, expected all "
                         f"{candidate.world_size} (remove sequence_parallel_size / mpu settings)")

    ctx, pad_token_id = attach_sp(ds_engine.module, candidate, layout, grad_world_size=ds_engine.dp_world_size,
                                  windows=windows, packed=options.packed, backend=options.backend,
                                  ignore_index=options.ignore_index, pad_token_id=options.pad_token_id,
                                  ds_engine=ds_engine, moe=moe)
    return SPEngine(ds_engine, layout, ctx, candidate, ignore_index=options.ignore_index, pad_token_id=pad_token_id,
                    pad_to_multiple_of=options.pad_to_multiple_of, dtype=dtype, backend=options.backend)


def run_dtype(plan, dtype: str | None) -> str:
    """The dtype a run computes in: the caller's (CompileOptions checked it), else the plan's workload's (a Plan, or
    the plan file at a path, whose loader checked it), else fp32 (a Candidate carries none)."""
    if dtype is not None:
        return dtype
    if isinstance(plan, (str, os.PathLike)):
        plan = load_plan(plan)
    return getattr(getattr(plan, "workload", None), "dtype", None) or "fp32"


def _checked_model(model, plan, dtype):
    """The run's dtype (default the plan's, else fp32) and the model's per-layer attention windows; refuses an
    object or a model architecture that autosp cannot compile."""
    import torch

    dtype = run_dtype(plan, dtype)
    if not isinstance(model, torch.nn.Module):
        raise UsageError("autosp.compile needs a torch.nn.Module")
    from autosp.compiler.linear_attention import check_architecture
    from autosp.compiler.windows import layer_windows

    check_architecture(model)  # the planner's list (both refuse the same models), Gated DeltaNet hybrids admitted
    return dtype, layer_windows(getattr(model, "config", None))


def _default_dist_backend() -> str:
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def _mark_zero3_leaves(model, z3_leaf_modules) -> None:
    """ZeRO-3: the modules gathered as one unit (default: the children of every ``nn.ModuleList``)."""
    from autosp.compiler.zero3 import set_leaf_modules

    names = list(z3_leaf_modules) if z3_leaf_modules is not None else _leaf_block_names(model)
    if names:
        set_leaf_modules(model, names)  # with the hook that keeps a frozen-input layer's gradients (PEFT)


def _optimizer_and_scheduler(model, candidate: Candidate, config: dict, options: CompileOptions):
    """The optimizer and LR scheduler to hand DeepSpeed (see :class:`CompileOptions`' ``optimizer``, ``optim`` and
    ``lr_scheduler``); an offloaded optimizer without one of the caller's gets DeepSpeed's CPU AdamW in
    ``config`` (which this updates in place) on CUDA."""
    import torch

    from autosp.compiler.experts import optimizer_param_groups

    optimizer, optim, lr_scheduler = options.optimizer, options.optim, options.lr_scheduler
    # DeepSpeed's MoE support needs the expert parameters in optimizer groups of their own
    # (the trainable parameters only: a PEFT (LoRA) model's frozen base weights have no optimizer state)
    params = optimizer_param_groups(model) if candidate.ep > 1 else [p for p in model.parameters() if p.requires_grad]
    if candidate.ep > 1 and isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError("with ep > 1 pass optimizer as a callable (params -> optimizer): autosp shards the experts "
                         "and builds the optimizer over the parameters each rank keeps")
    offload = config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none") != "none"
    from autosp.compiler.training.schedule import OptimizerOptions, make_optimizer, scheduler_factory

    adamw = optim if optim is not None else OptimizerOptions()
    if lr_scheduler is None and optim is not None:
        lr_scheduler = scheduler_factory(optim)
    if optimizer is None and "optimizer" not in config:
        if offload and torch.cuda.is_available():  # DeepSpeed's CPU Adam runs the offloaded step
            config["optimizer"] = {"type": "AdamW", "params": {"lr": adamw.lr, "weight_decay": adamw.weight_decay}}
        else:
            optimizer = make_optimizer(adamw, params)
    elif optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = optimizer(params)
    if offload and optimizer is not None:
        config.setdefault("zero_force_ds_cpu_optimizer", False)  # a torch optimizer steps the host copy
    return optimizer, lr_scheduler


__all__ = ["CompileOptions", "attach_sp", "compile_model", "deepspeed_config", "hand_made_candidate",
           "keep_zero3_hooks_eager", "load_plan", "resolve_candidate"]
