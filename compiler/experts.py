"""Expert parallelism for Hugging Face mixture-of-experts blocks (Qwen3-MoE, Mixtral, OLMoE, ...).

transformers 5 stores a MoE block's experts as one module with two 3-D parameters, ``gate_up_proj`` [E, 2I, H]
and ``down_proj`` [E, H, I], called as ``experts(hidden [T, H], top_k_index [T, k], top_k_weights [T, k])``
through its ``ExpertsInterface`` (``config._experts_implementation`` picks the function). autosp registers
one more implementation there, ``"autosp_ep"``, which calls :func:`moe_experts`, a custom op.

The expert function is a parameter of the op, not a fork of it. Qwen3-MoE, Mixtral and OLMoE: ``down(act(gate) *
up)`` with ``gate_up`` = [gate; up] (``act``: the config's ``hidden_act``). gpt-oss (``GptOssExperts``) differs in
three ways, each an argument: its weights are stored transposed ([E, H, 2I] and [E, I, H], ``transposed``), both
projections carry a bias (``gate_up_bias`` [E, 2I], ``down_bias`` [E, H]), and its gate is its own
``_apply_gate``: gate and up interleaved in one tensor (columns 0, 2, 4, ... and 1, 3, 5, ...), a clamped SwiGLU
``(clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g)`` with ``g = clamp(gate, max=7)``. A module whose class has its
own ``_apply_gate`` is run with that method itself (transformers' code, registered under a key the op's ``act``
names: :func:`gate_key`), so the op computes exactly what the module's eager loop does. Its router (a linear
layer with a bias, top-k of the logits then a softmax over the k) runs outside the op, traced as any layer:
the op receives its indices and weights.

- with expert parallelism (``ep`` > 1) each rank of an EP group of ``ep`` ranks keeps only its E/ep experts
  (rank r: experts ``r*E/ep .. (r+1)*E/ep - 1``); the op sends every (token, chosen expert) row to the rank
  that owns the expert (``all_to_all_single`` with the exact per-rank counts, exchanged first: no capacity,
  no token dropped), runs each local expert on the rows it received, sends the results back the same way and
  adds them, weighted by the router, into the token's output;
- with ``ep`` = 1 it runs the same computation locally: one op instead of Hugging Face's eager loop over the
  experts that were hit, whose ``nonzero()`` is a data-dependent graph break.

The op is opaque to Dynamo, AOTAutograd and Inductor (its row counts depend on the routing, so no static
graph could hold them). Its gradient is a second op that recomputes the forward under autograd (including
the two exchanges, whose gradients are the reverse exchanges) and differentiates it: every EP rank runs the
same layers in the same order, so the collectives of the recomputation pair up.

Which ranks form an EP group. Every rank of the dp x sp world holds distinct tokens (SP ranks different
positions, DP ranks different rows), so an EP group may be any ``ep`` of them: DeepSpeed's expert groups
(``deepspeed.utils.groups._create_expert_and_data_parallel``) take consecutive ranks, which with autosp's
SP-major layout keeps an EP group inside an SP group (a node) whenever ``ep`` divides ``sp``. The
*expert-data-parallel* group of a rank is the world/ep ranks holding the same experts.

Gradients and ZeRO. The expert parameters are DeepSpeed MoE parameters (``allreduce=False``, ``group_name``):
DeepSpeed reduces them over the expert-data-parallel group and divides by the whole data-parallel world W
(ZeRO 0: ``_reduce_expert_gradients``; ZeRO 1/2: the MoE optimizer groups; ZeRO 3: the AutoEP
``autoep_expert`` placement, partitioned over the expert-data-parallel group, so a rank never gathers other
ranks' experts). That is exact here: the loss pass makes each rank's gradient W * d(its token-loss sum) / N,
an expert's gradient on its owner is that summed over the EP group's tokens routed to it, and the sum over
the expert-data-parallel group covers every token of the world once; / W leaves d(loss)/d(expert).
DeepSpeed only enables its MoE code paths for models holding a ``deepspeed.moe`` or AutoEP layer, so each
sharded experts module is given a class that is also an ``AutoEPMoELayer`` (no behaviour taken from it but
``set_deepspeed_parallelism``, which binds the EP group).
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from autosp.compiler.autocast import cast_under_autocast
from autosp.compiler.ops import CALLS, _group, _needs_fp32_transport
from autosp.errors import UsageError

IMPLEMENTATION = "autosp_ep"


_GATES: dict = {}
_GATE_KEYS = itertools.count()


def gate_key(module) -> str:
    """Register ``module._apply_gate`` (its class's own gate: gpt-oss's clamped SwiGLU on interleaved gate/up
    columns) and return the key the op's ``act`` names it by (``"gate:N"``)."""
    key = f"gate:{next(_GATE_KEYS)}"
    _GATES[key] = module._apply_gate
    return key


def _gate(act: str):
    """The gate of the op's ``act``: a registered module gate (:func:`gate_key`), else ``act(gate) * up`` on
    ``[gate; up]`` with transformers' activation of that name."""
    if act in _GATES:
        return _GATES[act]
    from transformers.activations import ACT2FN

    fn = ACT2FN[act]

    def gated(gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return fn(gate) * up

    return gated


def _project(rows, weight, bias, transposed: bool):
    """One expert's linear layer: ``weight`` [out, in] (or [in, out] when ``transposed``), ``bias`` [out] or None."""
    out = rows @ weight if transposed else torch.nn.functional.linear(rows, weight)
    return out if bias is None else out + bias


class _ExchangeRows(torch.autograd.Function):
    """Rows of ``x`` sent to the ranks of ``group`` by ``send`` counts, ``recv`` counts arriving; the gradient
    goes back the reverse way."""

    @staticmethod
    def forward(ctx, x, send, recv, pg):
        ctx.send, ctx.recv, ctx.pg = send, recv, pg
        return _exchange(x, send, recv, pg)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad.contiguous(), ctx.recv, ctx.send, ctx.pg), None, None, None


def _exchange(x: torch.Tensor, send: list[int], recv: list[int], pg) -> torch.Tensor:
    CALLS["moe_all_to_all"] += 1
    wire = x.float() if _needs_fp32_transport(x) else x
    out = wire.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, wire.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=pg)
    return out.to(x.dtype)


def _local_experts(x: torch.Tensor, expert: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, gate,
                   biases=(None, None), transposed: bool = False) -> torch.Tensor:
    """Each row of ``x`` through its local expert (``expert``: index into ``gate_up`` / ``down``), Hugging
    Face's gated MLP: down(gate(gate_up(x))), with the projections' biases (``biases``: gate_up's and down's,
    or None) and weights stored [in, out] when ``transposed``."""
    order = torch.argsort(expert, stable=True)
    counts = torch.bincount(expert, minlength=gate_up.shape[0]).tolist()
    # one view per expert, made once: autograd then stacks the experts' weight gradients into one tensor. Indexing
    # (gate_up[e]) made every expert's backward a zero tensor of all the experts' size, added up one by one: E
    # passes over the whole weight per layer (forward + backward of 64 small experts 2.5x slower on this CPU:
    # python -m studies.moe_experts_speed)
    gate_ups, downs = gate_up.unbind(0), down.unbind(0)
    gate_up_biases, down_biases = (b.unbind(0) if b is not None else itertools.repeat(None) for b in biases)
    parts, start = [], 0
    for e, (n, gate_up_bias, down_bias) in enumerate(zip(counts, gate_up_biases, down_biases)):
        if n:
            rows = x.index_select(0, order[start:start + n]).to(gate_up.dtype)  # under autocast: bf16 weights
            inner = gate(_project(rows, gate_ups[e], gate_up_bias, transposed))
            parts.append(_project(inner, downs[e], down_bias, transposed))
        start += n
    if not parts:  # no row here: an output connected to every weight (zero gradients, not none)
        unused = sum(t.sum() for t in (gate_up, down, *biases) if t is not None)
        return x.new_zeros((0, down.shape[2] if transposed else down.shape[1])) + 0 * unused
    out = torch.cat(parts)
    return out.index_select(0, torch.argsort(order))  # back to the rows' order


def _forward(hidden, top_k_index, top_k_weights, gate_up, down, group: str, act: str, biases=(None, None),
             transposed: bool = False) -> torch.Tensor:
    k = top_k_index.shape[1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)        # assignments grouped by expert, hence by owner rank
    token = order // k
    chosen = flat.index_select(0, order)
    x = hidden.index_select(0, token)
    n_local = gate_up.shape[0]
    if group:
        pg = _group(group)
        ep = dist.get_world_size(group=pg)
        owner = chosen // n_local
        send_counts = torch.bincount(owner, minlength=ep)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=pg)
        send, recv = send_counts.tolist(), recv_counts.tolist()
        x = _ExchangeRows.apply(x, send, recv, pg)
        local = _exchange(chosen - owner * n_local, send, recv, pg)
        y = _ExchangeRows.apply(_local_experts(x, local, gate_up, down, _gate(act), biases, transposed), recv, send, pg)
    else:
        y = _local_experts(x, chosen, gate_up, down, _gate(act), biases, transposed)
    weights = top_k_weights.reshape(-1).index_select(0, order)
    weighted = (y * weights.unsqueeze(-1)).to(hidden.dtype)
    return torch.zeros_like(hidden).index_add(0, token, weighted)


def _token_chunks(chunks: int, *tensors):
    """The tokens in ``chunks`` pieces (plan knob ``mlp_chunks``: the MLP tiling pass sets it on this op, which
    then dispatches, computes and combines one piece at a time; every rank holds as many tokens, so every rank
    runs as many exchanges). Pieces may be empty: the exchanges then carry no rows."""
    return zip(*(torch.tensor_split(t, max(1, chunks)) for t in tensors))


@torch.library.custom_op("autosp_ops::moe_experts", mutates_args=())
def moe_experts(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, gate_up: torch.Tensor,
                down: torch.Tensor, group: str, act: str, chunks: int = 1, gate_up_bias: torch.Tensor | None = None,
                down_bias: torch.Tensor | None = None, transposed: bool = False) -> torch.Tensor:
    """The experts' weighted output for every token ([T, H]); ``group``: the EP group's name ('' = no EP);
    ``act``: the gate (an activation name, or a module's own gate: :func:`gate_key`); ``chunks``: token pieces run
    one after the other (the expert intermediates of one piece at a time); ``gate_up_bias`` / ``down_bias``: the
    projections' biases (gpt-oss); ``transposed``: weights stored [E, in, out] (gpt-oss)."""
    with torch.no_grad():
        return torch.cat([_forward(h, i, w, gate_up, down, group, act, (gate_up_bias, down_bias), transposed)
                          for h, i, w in _token_chunks(chunks, hidden, top_k_index, top_k_weights)])


@moe_experts.register_fake
def _moe_experts_fake(hidden, top_k_index, top_k_weights, gate_up, down, group, act, chunks=1, gate_up_bias=None,
                      down_bias=None, transposed=False):
    return torch.empty_like(hidden)


@torch.library.custom_op("autosp_ops::moe_experts_backward", mutates_args=())
def moe_experts_backward(grad: torch.Tensor, hidden: torch.Tensor, top_k_index: torch.Tensor,
                         top_k_weights: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, group: str,
                         act: str, chunks: int = 1, gate_up_bias: torch.Tensor | None = None,
                         down_bias: torch.Tensor | None = None, transposed: bool = False) -> list[torch.Tensor]:
    """Gradients of :func:`moe_experts` for hidden, top_k_weights, gate_up and down, then gate_up_bias and
    down_bias when given: the forward recomputed under autograd (its exchanges included) and differentiated, one
    token piece at a time (the expert weights' gradients summed over the pieces)."""
    from autosp.compiler.chunked_layer import _autograd_inside_op

    params = [t for t in (gate_up, down, gate_up_bias, down_bias) if t is not None]
    d_hidden, d_weights, d_params = [], [], [None] * len(params)
    for h, i, w, g in _token_chunks(chunks, hidden, top_k_index, top_k_weights, grad):
        leaves = [t.detach().requires_grad_(True) for t in (h, w, *params)]
        biases = _bias_leaves(leaves[4:], gate_up_bias, down_bias)
        with _autograd_inside_op():
            out = _forward(leaves[0], i, leaves[1], leaves[2], leaves[3], group, act, biases, transposed)
            grads = torch.autograd.grad(out, leaves, g, allow_unused=True)
        grads = [torch.zeros_like(leaf) if gr is None else gr for gr, leaf in zip(grads, leaves)]
        d_hidden.append(grads[0])
        d_weights.append(grads[1])
        # the first piece's expert-weight gradients are the sums' buffers (no zero-filled copy of the weights beside
        # them); later pieces add into them
        d_params = [new if old is None else old.add_(new) for old, new in zip(d_params, grads[2:])]
        del grads
    return [torch.cat(d_hidden).contiguous(), torch.cat(d_weights).contiguous(), *d_params]


def _bias_leaves(leaves, gate_up_bias, down_bias) -> tuple:
    """(gate_up's bias leaf or None, down's bias leaf or None) from the leaves made of the biases given."""
    given = iter(leaves)
    return tuple(next(given) if b is not None else None for b in (gate_up_bias, down_bias))


@moe_experts_backward.register_fake
def _moe_experts_backward_fake(grad, hidden, top_k_index, top_k_weights, gate_up, down, group, act, chunks=1,
                               gate_up_bias=None, down_bias=None, transposed=False):
    return [torch.empty_like(t) for t in (hidden, top_k_weights, gate_up, down, gate_up_bias, down_bias)
            if t is not None]


def _setup(ctx, inputs, output):
    (hidden, top_k_index, top_k_weights, gate_up, down, ctx.group, ctx.act, ctx.chunks, gate_up_bias, down_bias,
     ctx.transposed) = inputs
    ctx.save_for_backward(hidden, top_k_index, top_k_weights, gate_up, down, gate_up_bias, down_bias)


def _backward(ctx, grad):
    hidden, top_k_index, top_k_weights, gate_up, down, gate_up_bias, down_bias = ctx.saved_tensors
    dh, dw, dgu, dd, *d_biases = moe_experts_backward(grad.contiguous(), hidden, top_k_index, top_k_weights, gate_up,
                                                      down, ctx.group, ctx.act, ctx.chunks, gate_up_bias, down_bias,
                                                      ctx.transposed)
    dgub, ddb = _bias_leaves(d_biases, gate_up_bias, down_bias)
    return dh, None, dw, dgu, dd, None, None, None, dgub, ddb, None


moe_experts.register_autograd(_backward, setup_context=_setup)
# under autocast: the experts' linears in the autocast dtype (their weights cast, the rows cast to them in
# _local_experts), the weighted sum in the hidden states' dtype, as in Hugging Face's experts
cast_under_autocast(torch.ops.autosp_ops.moe_experts.default, cast=(3, 4, 8, 9))  # gate_up, down and their biases


# --- Hugging Face integration ----------------------------------------------------------------------------
def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The ``ExpertsInterface`` function (``config._experts_implementation = "autosp_ep"``). The biases and the
    layout go as keywords (the MLP tiling pass sets ``chunks`` as one)."""
    layout = {}
    if getattr(self, "has_bias", False):
        layout.update(gate_up_bias=self.gate_up_proj_bias, down_bias=self.down_proj_bias)
    if getattr(self, "is_transposed", False):
        layout["transposed"] = True
    return moe_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj,
                       getattr(self, "_autosp_ep_group", ""), self._autosp_act, **layout)


def _register() -> None:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if IMPLEMENTATION not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION, experts_forward)


def experts_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The Hugging Face experts modules of ``model`` (transformers' ``use_experts_implementation`` classes
    holding 3-D ``gate_up_proj`` / ``down_proj``)."""
    found = []
    for name, module in model.named_modules():
        gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
        if hasattr(module, "_apply_gate") and isinstance(gate_up, torch.nn.Parameter) and gate_up.dim() == 3 \
                and isinstance(down, torch.nn.Parameter) and down.dim() == 3:
            found.append((name, module))
    return found


def _own_gate(module) -> bool:
    """Does the module's class define its own ``_apply_gate`` (gpt-oss), rather than transformers' default?"""
    from transformers.integrations.moe import _default_apply_gate

    return getattr(type(module), "_apply_gate", _default_apply_gate) is not _default_apply_gate


def _check_layout(name: str, module) -> None:
    """Refuse, in one line, an experts module the op does not compute: ungated experts (an up projection and an
    activation), a norm after each expert, a default gate on interleaved gate/up columns (transformers' default
    gate splits [gate; up]), biases without their tensors, or no activation to name."""
    has_bias = getattr(module, "has_bias", False)
    unsupported = [flag for flag, ok in (
        ("has_gate=False", getattr(module, "has_gate", True)),
        ("has_post_expert_norm", not getattr(module, "has_post_expert_norm", False)),
        ("is_concatenated=False with the default gate", getattr(module, "is_concatenated", True) or _own_gate(module)),
        ("has_bias without gate_up_proj_bias / down_proj_bias",
         not has_bias or all(isinstance(getattr(module, b, None), torch.nn.Parameter)
                             for b in ("gate_up_proj_bias", "down_proj_bias"))),
        ("no hidden_act", _own_gate(module) or isinstance(getattr(getattr(module, "config", None), "hidden_act", None),
                                                           str)))
        if not ok]
    if unsupported:
        raise UsageError(f"the experts at {name} ({type(module).__name__}: {', '.join(unsupported)}) are not a layout "
                         f"autosp's expert op computes (gated experts, with or without biases, [gate; up] or the "
                         f"module's own gate)")


_EP_CLASSES: dict = {}


def _ep_class(base: type) -> type:
    """``base`` that DeepSpeed also recognises as an AutoEP layer (see the module doc)."""
    from deepspeed.module_inject.auto_ep_layer import AutoEPMoELayer

    if base not in _EP_CLASSES:
        _EP_CLASSES[base] = type(base.__name__, (base, AutoEPMoELayer),
                                 {"__module__": base.__module__, "__qualname__": base.__qualname__,
                                  "forward": base.forward})
    return _EP_CLASSES[base]


def ep_group_name(ep: int) -> str:
    return f"ep_size_{ep}"


def prepare_experts(model: torch.nn.Module, ep: int) -> int:
    """Route every experts module of ``model`` through :func:`moe_experts`; with ``ep`` > 1 keep only this
    rank's experts and mark them as DeepSpeed MoE parameters of the EP group (created here, collectively).
    Returns the number of experts modules (0: not a MoE model; then ``ep`` must be 1)."""
    found = experts_modules(model)
    if not found:
        if ep > 1:
            raise UsageError(f"ep={ep} needs a mixture-of-experts model; this one has no experts module")
        return 0
    _register()
    install_output_capture(model)
    group = ""
    rank = 0
    if ep > 1:
        import deepspeed.comm
        from deepspeed.utils import groups

        if not deepspeed.comm.is_initialized():  # DeepSpeed's groups go through deepspeed.comm, which wraps the
            deepspeed.comm.init_distributed(dist_backend=dist.get_backend())  # running process group
        name = ep_group_name(ep)
        if name not in groups._get_expert_parallel_group_dict():
            groups._create_expert_and_data_parallel(expert_parallel_size_=ep, mp_size=1, pp_size=1, mp_mode="sp")
        pg = groups._get_expert_parallel_group(name)
        group, rank = pg.group_name, dist.get_rank(group=pg)
    configs = set()
    for name, module in found:
        _check_layout(name, module)
        n_experts = module.gate_up_proj.shape[0]
        if n_experts % ep:
            raise UsageError(f"ep={ep} does not divide the {n_experts} experts of {name}")
        module._autosp_act = gate_key(module) if _own_gate(module) else module.config.hidden_act
        configs.add(id(module.config))
        module.config._experts_implementation = IMPLEMENTATION
        if ep == 1:
            continue
        local = n_experts // ep
        for attr in ("gate_up_proj", "down_proj", *(("gate_up_proj_bias", "down_proj_bias")
                                                      if getattr(module, "has_bias", False) else ())):
            full = getattr(module, attr)
            param = torch.nn.Parameter(full.detach()[rank * local:(rank + 1) * local].clone(),
                                       requires_grad=full.requires_grad)
            param.allreduce = False                          # DeepSpeed MoE parameter: reduced over the
            param.group_name = ep_group_name(ep)             # expert-data-parallel group
            param.ds_zero_placement_family = "autoep_expert"  # ZeRO-3: partitioned over that group only
            param.ds_zero_partition_group_name = ep_group_name(ep)
            param.autosp_expert_group = group                # tests gather the full tensor over it
            setattr(module, attr, param)
        module._autosp_ep_group = group
        module.__class__ = _ep_class(type(module))
        module.ep_size, module.ep_rank, module.ep_group_name = ep, rank, ep_group_name(ep)
        module.num_local_experts = local
    return len(found)


def install_output_capture(model: torch.nn.Module) -> None:
    """Install transformers' output-recording hooks (``router_logits`` for the load-balancing loss) before the
    model is compiled: installed lazily on the first forward, under a ``threading.Lock`` that Dynamo cannot
    trace (a graph break, fatal at ZeRO 0-2). Once installed, the forward skips the lock."""
    try:
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY, maybe_install_capturing_hooks
    except ImportError:  # a transformers without output capturing has no lock either
        return
    for module in model.modules():
        if _CAN_RECORD_REGISTRY.get(module):
            maybe_install_capturing_hooks(module)


def global_grad_norm(parameters) -> torch.Tensor:
    """The 2-norm (fp32) of the whole model's gradient, one process's ``clip_grad_norm_`` norm, from the gradients
    DeepSpeed's ZeRO-0 reduction leaves: every rank holds the same reduced gradient of each dense parameter, and of
    each of its own experts (:func:`prepare_experts`: identical over the expert-data-parallel group, different
    across the EP group). The dense squares are summed here, each EP group's expert squares over that group (one
    scalar all-reduce per group; every rank calls it, in the same order)."""
    dense, experts, device = [], {}, None
    for p in parameters:
        device = device or p.device
        group = getattr(p, "autosp_expert_group", "")
        grads = experts.setdefault(group, []) if group else dense
        if p.grad is not None:
            grads.append(p.grad)

    def squares(grads):
        return torch.stack([g.detach().float().norm() for g in grads]).square().sum() if grads \
            else torch.zeros((), dtype=torch.float32, device=device)

    total = squares(dense)
    for group in sorted(experts):
        part = squares(experts[group])
        dist.all_reduce(part, op=dist.ReduceOp.SUM, group=_group(group))
        total = total + part
    return total.sqrt()


def optimizer_param_groups(model: torch.nn.Module) -> list[dict]:
    """The model's parameters as optimizer groups with the expert parameters apart (DeepSpeed's
    ``split_params_into_different_moe_groups_for_optimizer``), as its ZeRO 1/2 MoE support requires."""
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    return split_params_into_different_moe_groups_for_optimizer(
        {"params": [p for p in model.parameters()], "name": "dense"})


__all__ = ["IMPLEMENTATION", "experts_forward", "experts_modules", "global_grad_norm", "moe_experts",
           "moe_experts_backward", "optimizer_param_groups", "prepare_experts"]
