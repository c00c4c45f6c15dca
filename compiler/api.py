"""``autosp.compile``: from a model and a plan to a running sequence-parallel DeepSpeed engine.

The compiler imports nothing from the planner (``tests/project/test_layering.py`` checks it): what the two share
is the contract, ``autosp/contract/`` -- the Candidate and its admission rules, the plan file and its loader
(:func:`load_plan`), the DeepSpeed config builder, the op tables and the dtypes. A plan is the planner's output
and the compiler's input.
"""

from __future__ import annotations

import copy
import os

from autosp.contract.rules import candidate_reason
from autosp.contract.specs import DTYPES, Candidate
from autosp.errors import UsageError

RECOMPILE_LIMIT = 64


def load_plan(path):
    """The plan JSON at ``path`` (written by ``autosp-plan --plan-out``), read by the contract's loader."""
    from autosp.contract.plan import load_plan as read_plan

    return read_plan(path)


def resolve_candidate(plan=None, sp_size=None, world_size=None, *, dp_size=None, zero_stage=None, micro_batch=None,
                      grad_accum=None, offload_optimizer=None, ring_size=None, ep_size=None
                      ) -> tuple[Candidate, object]:
    """The candidate to run and the Plan it came from (or None). Plain values fill a hand-made plan."""
    overrides = {k: v for k, v in (("dp", dp_size), ("zero_stage", zero_stage), ("micro_batch", micro_batch),
                                   ("grad_accum", grad_accum), ("offload_optimizer", offload_optimizer),
                                   ("ring", ring_size), ("ep", ep_size))
                 if v is not None}
    source = None
    if plan is not None:
        if isinstance(plan, (str, os.PathLike)):
            plan = load_plan(plan)
        if isinstance(plan, Candidate):
            candidate = plan
        elif hasattr(plan, "candidate") and isinstance(plan.candidate, Candidate):
            candidate, source = plan.candidate, plan
        else:
            raise UsageError("plan must be a path to a plan JSON, a Plan or a Candidate")
        if sp_size is not None and sp_size != candidate.sp:
            raise UsageError(f"sp_size={sp_size} contradicts the plan's sp={candidate.sp}")
        for key, value in overrides.items():
            if getattr(candidate, key) != value:
                raise UsageError(f"{key}={value} contradicts the plan's {key}={getattr(candidate, key)}")
    else:
        if sp_size is None:
            raise UsageError("autosp.compile needs plan= (a plan file or Plan) or sp_size=")
        if not isinstance(sp_size, int) or sp_size < 1:
            raise UsageError(f"sp_size must be a positive integer, got {sp_size!r}")
        if "dp" not in overrides:
            if world_size is None or world_size % sp_size:
                raise UsageError(f"sp_size={sp_size} does not divide the {world_size} launched processes")
            overrides["dp"] = world_size // sp_size
        try:
            candidate = Candidate(sp=sp_size, **overrides)
        except ValueError as err:
            raise UsageError(str(err)) from None
    _refuse_impossible_combinations(candidate)
    return candidate, source


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


def compile_model(model, plan=None, sp_size=None, *, ring_size=None, dp_size=None, zero_stage=None, micro_batch=None,
                  grad_accum=None, offload_optimizer=None, optimizer=None, lr: float = 1e-4, dtype: str | None = None,
                  backend: str = "inductor", ds_config: dict | None = None, ignore_index: int = -100,
                  pad_token_id: int | None = None, pad_to_multiple_of: int = 1, dist_backend: str | None = None,
                  z3_leaf_modules=None, gradient_clipping: float | None = None, packed: bool = False,
                  optim=None, lr_scheduler=None, ep_size: int | None = None):
    """Build the sequence-parallel DeepSpeed engine for ``model``.

    Args:
        model: an unmodified causal LM (``nn.Module``) whose ``forward(input_ids=..., labels=...)`` computes
            the loss with ``F.cross_entropy`` and attention with ``F.scaled_dot_product_attention``.
        plan: a plan file path, a :class:`~autosp.contract.plan.Plan` or a
            :class:`~autosp.contract.specs.Candidate`; or give ``sp_size`` (and optionally ``ring_size``,
            ``dp_size``, ``zero_stage``, ``micro_batch``, ``grad_accum``, ``offload_optimizer``) for a
            hand-made plan.
        ring_size: 2-D sequence parallelism: the SP group of ``sp_size`` = U x R ranks runs Ulysses all-to-alls
            over U = sp_size / ring_size ranks and ring attention over R = ring_size ranks (default 1: plain
            Ulysses; ``ring_size=sp_size``: pure ring attention). A plan carries it as its candidate's ``ring``.
            ``micro_batch`` sequences per DP rank per call (the full batch every rank passes is dp x
            micro_batch sequences); ``grad_accum`` calls per optimizer step (DeepSpeed accumulates and
            steps at the boundary; each call's loss is that micro-batch's exact global mean).
        optimizer: a ``torch.optim.Optimizer`` over ``model.parameters()``, a callable ``params -> optimizer``,
            or None: DeepSpeed's ``optimizer`` section of ``ds_config`` if there is one, else
            ``torch.optim.AdamW(lr=lr)`` (a torch optimizer needs no CUDA extension build).
        optim: an :class:`autosp.compiler.training.schedule.OptimizerOptions` (lr, min_lr, warmup, schedule
            constant/linear/cosine, total_steps, weight_decay): the default AdamW gets its lr and weight decay
            (``lr`` is then ignored) and, unless ``lr_scheduler`` is given, its learning-rate schedule.
        lr_scheduler: a torch LR scheduler, or a callable ``optimizer -> scheduler``; handed to DeepSpeed,
            which steps it at every optimizer step and saves it in its checkpoints.
        dtype: ``"fp32"`` or ``"bf16"`` (DeepSpeed bf16: bf16 weights, fp32 master weights); default the plan's.
        backend: ``"inductor"`` (default) or ``"aot_eager"``.
        ds_config: DeepSpeed config entries merged over the generated config
            (:func:`autosp.contract.deepspeed_config.deepspeed_config`, the same one ``autosp-plan
            --ds-config`` writes).
        gradient_clipping: the maximum global gradient norm (default 1.0,
            :data:`autosp.contract.deepspeed_config.GRADIENT_CLIPPING`; 0 turns clipping off).
        ignore_index, pad_token_id: the label to ignore and the token used to pad S to a multiple of P
            (default the model config's pad_token_id, else 0; pads are masked by causality and ignored).
        pad_to_multiple_of: also pad S to a multiple of this (bounds the number of distinct compiled lengths).
        dist_backend: process-group backend when torch.distributed is not initialised yet (default nccl on
            CUDA, gloo otherwise).
        z3_leaf_modules: ZeRO-3 only: module names gathered as one unit and traced as one graph (default:
            the children of every ``nn.ModuleList``).
        ep_size: expert parallelism for a mixture-of-experts model (a plan carries it as its candidate's
            ``ep``; default 1): each expert lives on one rank of every group of ``ep_size`` ranks, tokens travel
            to their experts by all-to-all (:mod:`autosp.compiler.experts`). It divides the experts and dp x sp.
        packed: the batches hold packed documents (``position_ids`` restarting at 0, or ``seq_lens`` /
            ``cu_seq_lens`` passed to the engine): compile attention restricted to documents. Not needed
            when the first batch is packed or the model has sliding-window layers (read from its config).
    """
    import torch.distributed as dist

    dtype, windows = _checked_model(model, plan, dtype)
    import deepspeed

    if not dist.is_initialized():
        if dist_backend is None:
            dist_backend = _default_dist_backend()
        deepspeed.init_distributed(dist_backend=dist_backend)
    candidate, source_plan = resolve_candidate(plan, sp_size, dist.get_world_size(), dp_size=dp_size,
                                               zero_stage=zero_stage, micro_batch=micro_batch, grad_accum=grad_accum,
                                               offload_optimizer=offload_optimizer, ring_size=ring_size,
                                               ep_size=ep_size)
    from autosp.compiler.linear_attention import check_plan

    check_plan(model, candidate)  # Gated DeltaNet layers: no ring, heads over the Ulysses ranks

    from autosp.compiler.groups import make_layout
    from autosp.compiler.runtime import SPEngine

    layout = make_layout(candidate)
    config = deep_merge(deepspeed_config(candidate, dtype, source_plan, model, gradient_clipping), ds_config or {})
    if candidate.zero_stage == 3:
        _mark_zero3_leaves(model, z3_leaf_modules)

    from autosp.compiler.experts import prepare_experts

    moe = prepare_experts(model, candidate.ep)  # MoE: experts through autosp's op; ep > 1: this rank's experts only
    optimizer, lr_scheduler = _optimizer_and_scheduler(model, candidate, config, optimizer, optim, lr, lr_scheduler)
    ds_engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, lr_scheduler=lr_scheduler)
    if ds_engine.dp_world_size != candidate.world_size:
        raise UsageError(f"DeepSpeed's data-parallel world is {ds_engine.dp_world_size} ranks, expected all "
                         f"{candidate.world_size} (remove sequence_parallel_size / mpu settings)")

    ctx, pad_token_id = attach_sp(ds_engine.module, candidate, layout, grad_world_size=ds_engine.dp_world_size,
                                  windows=windows, packed=packed, backend=backend, ignore_index=ignore_index,
                                  pad_token_id=pad_token_id, ds_engine=ds_engine, moe=moe)
    return SPEngine(ds_engine, layout, ctx, candidate, ignore_index=ignore_index, pad_token_id=pad_token_id,
                    pad_to_multiple_of=pad_to_multiple_of, dtype=dtype, backend=backend)


def _checked_model(model, plan, dtype):
    """The run's dtype (default the plan's, else fp32) and the model's per-layer attention windows; refuses a
    dtype, an object or a model architecture that autosp cannot compile."""
    import torch

    if dtype is None:
        dtype = getattr(getattr(plan, "workload", None), "dtype", None) or "fp32"
    if dtype not in DTYPES:
        raise UsageError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
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


def _optimizer_and_scheduler(model, candidate: Candidate, config: dict, optimizer, optim, lr, lr_scheduler):
    """The optimizer and LR scheduler to hand DeepSpeed (see :func:`compile_model`'s ``optimizer``, ``optim`` and
    ``lr_scheduler``); an offloaded optimizer without one of the caller's gets DeepSpeed's CPU AdamW in
    ``config`` (which this updates in place) on CUDA."""
    import torch

    from autosp.compiler.experts import optimizer_param_groups

    # DeepSpeed's MoE support needs the expert parameters in optimizer groups of their own
    # (the trainable parameters only: a PEFT (LoRA) model's frozen base weights have no optimizer state)
    params = optimizer_param_groups(model) if candidate.ep > 1 else [p for p in model.parameters() if p.requires_grad]
    if candidate.ep > 1 and isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError("with ep > 1 pass optimizer as a callable (params -> optimizer): autosp shards the experts "
                         "and builds the optimizer over the parameters each rank keeps")
    offload = config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none") != "none"
    from autosp.compiler.training.schedule import OptimizerOptions, make_optimizer, scheduler_factory

    if optim is not None and not isinstance(optim, OptimizerOptions):
        raise UsageError("optim must be an autosp.compiler.training.schedule.OptimizerOptions")
    options = optim if optim is not None else OptimizerOptions(lr=lr)
    if lr_scheduler is None and optim is not None:
        lr_scheduler = scheduler_factory(optim)
    if optimizer is None and "optimizer" not in config:
        if offload and torch.cuda.is_available():  # DeepSpeed's CPU Adam runs the offloaded step
            config["optimizer"] = {"type": "AdamW", "params": {"lr": options.lr,
                                                               "weight_decay": options.weight_decay}}
        else:
            optimizer = make_optimizer(options, params)
    elif optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = optimizer(params)
    if offload and optimizer is not None:
        config.setdefault("zero_force_ds_cpu_optimizer", False)  # a torch optimizer steps the host copy
    return optimizer, lr_scheduler


__all__ = ["attach_sp", "compile_model", "keep_zero3_hooks_eager", "deepspeed_config", "load_plan", "resolve_candidate"]
