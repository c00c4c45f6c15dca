"""Gated DeltaNet layers (Qwen3-Next, Qwen3.5) under Ulysses sequence parallelism.

A hybrid model's ``linear_attention`` layers mix the sequence in two places only: a short depthwise causal
conv1d over the concatenated q/k/v channels and the chunked gated delta rule (a recurrence whose state per
value head is d_k x d_v). Everything else in the layer -- the projections, the gates ``b`` and ``a``, the
gated RMSNorm per head, ``out_proj`` -- is token-wise. The heads are independent (a v head reads only its
own conv channels, its own gates and its group's q/k head), so the layer becomes local exactly as Ulysses
makes softmax attention local:

1. the projections run on the rank's s = S/P tokens (transformers' own modules and, for Qwen3-Next, its
   ``fix_query_key_value_ordering``);
2. one ``autosp_ops::all_to_all`` turns the pre-conv q, k, v and the gate inputs b, a of every head
   [B, s, heads] into the whole sequence of this rank's heads [B, S, heads/P] (rank u: v heads
   ``u*Hv/P ..``, and the q/k heads of their group: q/k heads are sharded when P divides them, each
   replicated P/Hk times before the exchange when Hk divides P, as Ulysses does for GQA's key/value heads);
3. ``beta = sigmoid(b)`` and the decay ``g`` from this rank's slices of ``A_log`` / ``dt_bias`` (the layer's
   own formula), then :func:`gated_delta_core`: transformers' ``causal_conv1d_fn`` with this rank's slice of
   the conv weight and transformers' ``torch_chunk_gated_delta_rule`` (the names the modeling module binds:
   its torch fallback on CPU, the causal-conv1d / flash-linear-attention kernels where installed), over the
   whole sequence, per packed document;
4. a second all-to-all brings the output back to [B, s, Hv, d_v]; the layer's gated norm and ``out_proj``
   finish on the local tokens.

Parameters stay replicated (ZeRO partitions them as any other); a rank differentiates only the slices of the
conv weight, ``A_log`` and ``dt_bias`` that its heads read, so the data-parallel gradient sum over the SP
group (the rule of :mod:`autosp.compiler.runtime`) assembles each full gradient exactly; a replicated q/k
head's gradient is the sum over the ranks sharing it by the same rule.

**Why an opaque op for the core.** The conv and the recurrence must restart at every packed document, whose
places change with every batch while the graph does not (the op reads them when it runs, like
``span_attention``: :mod:`autosp.compiler.attention.documents`); the torch fallback's Python loop over 64-token
chunks would be unrolled into the graph (tens of thousands of nodes at 128k tokens); and the kernels of
flash-linear-attention are Triton autograd functions Dynamo should not trace. The op runs every document in
pieces (:data:`PIECE_TOKENS`), carrying the recurrent state and the conv's window across; it saves its inputs and
the state entering each piece, and its backward (:func:`gated_delta_core_backward`) recomputes the pieces, last
first, under autograd and differentiates them: one piece's intermediates at a time. Its outputs are classed as
attention's (``autosp/contract/op_classes.py``: kept by the selective and sequence checkpointing policies). The
all-to-alls stay graph nodes, counted and handled like attention's.

**Packed documents.** A document's conv window and recurrent state start empty at its first token (conv
zero-padding, ``initial_state=None``): each segment runs alone, exactly "each document run alone", the
reference :mod:`autosp.compiler.testing` and docs/design.md define. (transformers' own single-process model,
without flash-linear-attention, runs the conv and the recurrence straight across packed documents: its torch
fallback refuses ``cu_seqlens``, and the SDPA path passes none.) Pads the runtime appends (S % P != 0) come
after every real token, so neither the causal conv nor the recurrence carries them into a real token.

**Refused** (one line, before DeepSpeed is built): a ring (``ring`` > 1: the state and the conv tail
would have to pass from ring rank to ring rank in order, serialising the ring), sequence-chunked layers
(``sequence_chunks`` > 1: the same carry between chunks), Ulysses degrees that do not divide the value heads
or that neither divide nor are divided by the q/k heads, and layers other than the two layouts below.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from autosp.compiler import ops
from autosp.compiler.attention.documents import published
from autosp.compiler.autocast import cast_under_autocast
from autosp.errors import UsageError

CORE_FUNCTIONS = ("causal_conv1d_fn", "torch_chunk_gated_delta_rule", "apply_mask_to_padding_states")
"""What a layer's modeling module must define for autosp to run the layer (transformers 5: qwen3_next,
qwen3_5, qwen3_5_moe)."""


# --- which layers ----------------------------------------------------------------------------------------
def _layout(module) -> str | None:
    """``qkvz`` (Qwen3-Next: one q/k/v/z projection in per-k-head groups, one b/a projection), ``qkv``
    (Qwen3.5: separate q/k/v, z, b and a projections) or None (not a Gated DeltaNet autosp knows)."""
    if not type(module).__name__.endswith("GatedDeltaNet"):
        return None
    if hasattr(module, "in_proj_qkvz") and hasattr(module, "in_proj_ba") and hasattr(module, "fix_query_key_value_ordering"):
        return "qkvz"
    if all(hasattr(module, name) for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")):
        return "qkv"
    return None


def _modeling_module(module):
    for cls in type(module).__mro__:  # the SP subclass installed below lives beside transformers' class
        mod = sys.modules.get(cls.__module__)
        if mod is not None and all(hasattr(mod, f) for f in CORE_FUNCTIONS):
            return mod
    return None


def gated_deltanet_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The Gated DeltaNet modules of ``model`` (class name ending in ``GatedDeltaNet``), known layout or not."""
    return [(name, m) for name, m in model.named_modules() if type(m).__name__.endswith("GatedDeltaNet")]


def check_architecture(model, where: str = "autosp.compile") -> None:
    """The shared architecture check (:func:`autosp.cost_models.architectures.check_config`), except that a
    text model whose linear-attention layers are all Gated DeltaNet layers of a layout this module runs is
    compiled, not refused as a hybrid."""
    from autosp.cost_models.architectures import check_config, config_dict

    config = getattr(model, "config", None)
    layers = gated_deltanet_layers(model) if isinstance(model, torch.nn.Module) else []
    if layers and not isinstance(config_dict(config or {}).get("vision_config"), dict):
        unknown = [f"{name} ({type(m).__name__})" for name, m in layers
                   if _layout(m) is None or _modeling_module(m) is None]
        if unknown:
            raise UsageError(f"{where}: the linear-attention layer {unknown[0]} is not a Gated DeltaNet layout autosp "
                             "knows (transformers' Qwen3-Next or Qwen3.5); autosp does not support it")
        return
    check_config(config, where)


def check_plan(model, candidate) -> None:
    """Refuse, in one line, the knobs and SP degrees under which a model's Gated DeltaNet layers cannot run."""
    layers = gated_deltanet_layers(model)
    if not layers:
        return
    name, layer = layers[0]
    what = f"{type(layer).__name__} layers (Gated DeltaNet linear attention)"
    if candidate.ring > 1:
        raise UsageError(f"ring={candidate.ring}: the model's {what} carry a recurrent state along the sequence that "
                         "autosp does not pass around a ring; use ring=1 (Ulysses only: sp must divide the linear "
                         "value heads)")
    if candidate.sequence_chunks > 1:
        raise UsageError(f"sequence_chunks={candidate.sequence_chunks}: the model's {what} carry a recurrent state "
                         "from chunk to chunk, which sequence-chunked layers do not; re-plan with sequence_chunks=1")
    heads_reason = split_reason(layer.num_k_heads, layer.num_v_heads, candidate.ulysses)
    if heads_reason:
        raise UsageError(f"sp={candidate.sp}: {heads_reason} of {name}; pick an SP degree that divides them")
    if getattr(layer.conv1d, "bias", None) is not None:
        raise UsageError(f"{name}: a conv1d with a bias is not the Gated DeltaNet layout autosp runs")


def split_reason(n_k: int, n_v: int, ulysses: int) -> str | None:
    """Why ``ulysses`` ranks cannot split a Gated DeltaNet layer's heads (None: they can). The value heads
    must divide; the q/k heads must divide, or divide the ranks (each then replicated); a rank's v heads
    must share q/k heads with no other rank's unless replicated (``n_v`` is a multiple of ``n_k``)."""
    if n_v % ulysses:
        return f"{ulysses} Ulysses ranks do not divide the {n_v} linear value heads"
    if n_k % ulysses and ulysses % n_k:
        return (f"{ulysses} Ulysses ranks and the {n_k} linear key heads: one must divide the other")
    return None


# --- the SP layer ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadSlice:
    """This rank's heads of a Gated DeltaNet layer: q/k heads ``k0..k1``, v heads ``v0..v1``;
    ``replicas``: copies of each q/k head sent (P / n_k when the ranks outnumber the q/k heads, else 1)."""

    group: str       # the Ulysses group's name ('' when it is one rank: no all-to-all)
    ranks: int
    k0: int
    k1: int
    v0: int
    v1: int
    replicas: int


def head_slice(n_k: int, n_v: int, ranks: int, rank: int, group: str) -> HeadSlice:
    v_per = n_v // ranks
    if n_k % ranks == 0:
        k_per = n_k // ranks
        return HeadSlice(group, ranks, rank * k_per, (rank + 1) * k_per, rank * v_per, (rank + 1) * v_per, 1)
    replicas = ranks // n_k
    k = rank // replicas
    return HeadSlice(group, ranks, k, k + 1, rank * v_per, (rank + 1) * v_per, replicas)


def _projections(layer, hidden_states):
    """q, k [B, s, Hk, dk], v, z [B, s, Hv, dv], b, a [B, s, Hv]: the layer's own projections, before the conv."""
    batch, seq = hidden_states.shape[:2]
    if _layout(layer) == "qkvz":
        q, k, v, z, b, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(hidden_states),
                                                             layer.in_proj_ba(hidden_states))
        return q, k, v, z, b, a
    q, k, v = torch.split(layer.in_proj_qkv(hidden_states), [layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
    q = q.reshape(batch, seq, -1, layer.head_k_dim)
    k = k.reshape(batch, seq, -1, layer.head_k_dim)
    v = v.reshape(batch, seq, -1, layer.head_v_dim)
    z = layer.in_proj_z(hidden_states).reshape(batch, seq, -1, layer.head_v_dim)
    return q, k, v, z, layer.in_proj_b(hidden_states), layer.in_proj_a(hidden_states)


def _to_heads(part: HeadSlice, q, k, v, b, a):
    """[B, s, heads...] of every head -> [B, S, features] of this rank's heads: one all-to-all of the five
    tensors side by side (rank j's slot holds its q/k heads (replicated if need be), v heads, b and a)."""
    batch, seq = q.shape[:2]
    if part.replicas > 1:
        q, k = (t.repeat_interleave(part.replicas, dim=2) for t in (q, k))
    slots = torch.cat([t.reshape(batch, seq, part.ranks, -1) for t in (q, k, v, b, a)], dim=-1)
    if part.ranks > 1:
        slots = ops.all_to_all(slots, 2, 1, part.group)
    return slots.squeeze(2)


def _sp_forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
    """The Gated DeltaNet forward under Ulysses (module docstring); training only (no cache)."""
    if cache is not None:
        raise UsageError("autosp trains Gated DeltaNet layers without a cache: pass use_cache=False")
    part: HeadSlice = self._autosp_heads
    modeling = _modeling_module(self)
    hidden_states = modeling.apply_mask_to_padding_states(hidden_states, attention_mask)
    batch, seq = hidden_states.shape[:2]
    q, k, v, z, b, a = _projections(self, hidden_states)
    n_k, n_v = part.k1 - part.k0, part.v1 - part.v0
    dk, dv = self.head_k_dim, self.head_v_dim
    local = _to_heads(part, q, k, v, b, a)
    qkv, b, a = torch.split(local, [2 * n_k * dk + n_v * dv, n_v, n_v], dim=-1)
    # this rank's conv channels, in the layer's order (q heads | k heads | v heads), and its decay parameters
    weight = self.conv1d.weight.squeeze(1)
    weight = torch.cat([weight[part.k0 * dk:part.k1 * dk],
                        weight[self.key_dim + part.k0 * dk:self.key_dim + part.k1 * dk],
                        weight[2 * self.key_dim + part.v0 * dv:2 * self.key_dim + part.v1 * dv]])
    beta = b.sigmoid()
    g = -self.A_log[part.v0:part.v1].float().exp() * F.softplus(a.float() + self.dt_bias[part.v0:part.v1])
    core, _ = gated_delta_core(qkv, weight, g, beta, n_k, dk, self.activation, modeling.__name__,
                               self._autosp_ctx.rule, PIECE_TOKENS)
    if part.ranks > 1:
        core = ops.all_to_all(core, 1, 2, part.group)  # [B, S, Hv/P, dv] -> [B, s, Hv, dv]
    out = self.norm(core.reshape(-1, dv), z.reshape(-1, dv))
    return self.out_proj(out.reshape(batch, seq, -1))


_SP_CLASSES: dict = {}


def _sp_class(base: type) -> type:
    if base not in _SP_CLASSES:
        _SP_CLASSES[base] = type(base.__name__, (base,), {"__module__": base.__module__,
                                                          "__qualname__": base.__qualname__, "forward": _sp_forward})
    return _SP_CLASSES[base]


def install(model: torch.nn.Module, ctx) -> int:
    """Run every Gated DeltaNet layer of ``model`` under the SP of ``ctx`` (an
    :class:`~autosp.compiler.context.SPContext`; the documents' rule is read from it when the layer is traced).
    Returns the number of layers (0: no linear attention)."""
    layers = gated_deltanet_layers(model)
    if not layers:
        return 0
    check_plan(model, ctx.candidate)
    group = ctx.ulysses_group if ctx.candidate.ulysses > 1 else ""
    rank = 0
    if group:
        import torch.distributed as dist

        rank = dist.get_rank(group=ops._group(group))
    for _, layer in layers:
        layer._autosp_heads = head_slice(layer.num_k_heads, layer.num_v_heads, ctx.candidate.ulysses, rank, group)
        layer._autosp_ctx = ctx
        layer.__class__ = _sp_class(type(layer))
    return len(layers)


# --- the sequence-mixing core ------------------------------------------------------------------------------
PIECE_TOKENS = 4096
"""The core runs a document in pieces of at most this many tokens (cut at multiples of it along the sequence),
passing the recurrent state from piece to piece and giving each piece the conv's last K-1 input tokens before it:
the recomputation in the backward then holds one piece's intermediates at a time, not the whole sequence's.
(transformers' torch fallback keeps its recurrent state once per 64-token chunk, and more: ~48 KB per token
for 4 value heads of 128 x 128, ``python -m studies.gated_delta_memory``.) The op keeps the state entering
each piece (fp32, heads x d_k x d_v) for its backward."""


def _segments(rule: str, batch: int, length: int):
    """(rows, document span) to run alone: every packed document of every row (rows with the same documents
    together), or whole rows."""
    from autosp.compiler.attention.local import _row_groups

    rows_documents = published(rule, batch) if rule else (None,) * batch
    for rows, documents in _row_groups(rows_documents):
        for span in documents or ((0, length),):
            yield rows, span


def _pieces(span, piece: int):
    """A document's pieces [(start, stop, slot)]: cut where a multiple of ``piece`` falls inside it; ``slot``:
    index j of the boundary j * piece the piece starts at (None for the document's first piece)."""
    a, b = span
    cuts = [a, *range((a // piece + 1) * piece, b, piece), b]
    return [(p0, p1, None if p0 == a else p0 // piece - 1) for p0, p1 in zip(cuts, cuts[1:])]


def _run_piece(modeling, qkv, weight, g, beta, n_k: int, dk: int, activation: str, halo: int, state, final: bool):
    """transformers' conv (+ activation) and chunked gated delta rule over one piece: ``qkv`` holds the piece's
    tokens after ``halo`` earlier tokens of its document (the conv's window), ``state`` the recurrent state
    entering it (None: the document's start). Returns the output and, with ``final``, the state leaving it."""
    batch = qkv.shape[0]
    mixed = modeling.causal_conv1d_fn(qkv.transpose(1, 2), weight, None, activation=activation).transpose(1, 2)
    mixed = mixed[:, halo:]
    seq = mixed.shape[1]
    q, k, v = torch.split(mixed, [n_k * dk, n_k * dk, mixed.shape[-1] - 2 * n_k * dk], dim=-1)
    return modeling.torch_chunk_gated_delta_rule(
        q.reshape(batch, seq, n_k, dk), k.reshape(batch, seq, n_k, dk), v.reshape(batch, seq, g.shape[-1], -1),
        g=g, beta=beta, initial_state=state, output_final_state=final, use_qk_l2norm_in_kernel=True)


def _shapes(qkv, g, n_k: int, dk: int, piece: int):
    dv = (qkv.shape[-1] - 2 * n_k * dk) // g.shape[-1]
    out = (*g.shape, dv)
    states = (qkv.shape[0], max(0, (qkv.shape[1] - 1) // piece), g.shape[-1], dk, dv)
    return out, states


@torch.library.custom_op("autosp_ops::gated_delta_core", mutates_args=())
def gated_delta_core(qkv: torch.Tensor, weight: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, n_k: int,
                     dk: int, activation: str, modeling: str, rule: str,
                     piece: int = PIECE_TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    """Conv + gated delta rule of this rank's heads over the whole sequence: ``qkv`` [B, S, C] pre-conv channels
    (q heads | k heads | v heads), ``weight`` [C, K] their depthwise conv weights, ``g`` (fp32) and ``beta``
    [B, S, Hv]. Returns the output [B, S, Hv, dv] and the states entering the pieces (:data:`PIECE_TOKENS`)
    [B, (S - 1) // piece, Hv, dk, dv] fp32 (for the backward). ``modeling``: the transformers module whose
    functions run it; ``rule``: the engine whose published packed documents restart the state ('' = whole
    rows)."""
    ops.CALLS["gated_delta_core"] += 1
    mod = importlib.import_module(modeling)
    out_shape, states_shape = _shapes(qkv, g, n_k, dk, piece)
    out = qkv.new_empty(out_shape)
    states = g.new_zeros(states_shape, dtype=torch.float32)
    with torch.no_grad():
        for rows, span in _segments(rule, qkv.shape[0], qkv.shape[1]):
            state = None
            for p0, p1, slot in _pieces(span, piece):
                if slot is not None:
                    states[rows, slot] = state
                halo = min(weight.shape[-1] - 1, p0 - span[0])
                out[rows, p0:p1], state = _run_piece(mod, qkv[rows, p0 - halo:p1], weight, g[rows, p0:p1],
                                                     beta[rows, p0:p1], n_k, dk, activation, halo, state,
                                                     final=p1 < span[1])
    return out, states


@gated_delta_core.register_fake
def _gated_delta_core_fake(qkv, weight, g, beta, n_k, dk, activation, modeling, rule, piece=PIECE_TOKENS):
    out_shape, states_shape = _shapes(qkv, g, n_k, dk, piece)
    return qkv.new_empty(out_shape), g.new_empty(states_shape, dtype=torch.float32)


@torch.library.custom_op("autosp_ops::gated_delta_core_backward", mutates_args=())
def gated_delta_core_backward(grad: torch.Tensor, qkv: torch.Tensor, weight: torch.Tensor, g: torch.Tensor,
                              beta: torch.Tensor, states: torch.Tensor, n_k: int, dk: int, activation: str,
                              modeling: str, rule: str,
                              piece: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`gated_delta_core` for qkv, weight, g and beta: the pieces of each document, last
    first, recomputed under autograd from the state that entered them and differentiated alone (the gradient
    of that state passed on to the piece before)."""
    from autosp.compiler.chunked_layer import _autograd_inside_op

    ops.CALLS["gated_delta_core_backward"] += 1
    mod = importlib.import_module(modeling)
    d_qkv, d_g, d_beta = torch.zeros_like(qkv), torch.zeros_like(g), torch.zeros_like(beta)
    d_weight = torch.zeros_like(weight)
    for rows, span in _segments(rule, qkv.shape[0], qkv.shape[1]):
        d_state = None  # the gradient of the state leaving the piece being differentiated
        for p0, p1, slot in reversed(_pieces(span, piece)):
            halo = min(weight.shape[-1] - 1, p0 - span[0])
            leaves = [t.detach().requires_grad_(True)
                      for t in (qkv[rows, p0 - halo:p1], weight, g[rows, p0:p1], beta[rows, p0:p1])]
            state = None if slot is None else states[rows, slot].detach().requires_grad_(True)
            with _autograd_inside_op():
                out, final = _run_piece(mod, *leaves, n_k, dk, activation, halo, state, final=d_state is not None)
                outputs, grads = [out], [grad[rows, p0:p1]]
                if d_state is not None:
                    outputs.append(final)
                    grads.append(d_state)
                inputs = leaves + ([state] if state is not None else [])
                got = torch.autograd.grad(outputs, inputs, grads, allow_unused=True)
            for acc, piece_grad, a, b in ((d_qkv, got[0], p0 - halo, p1), (d_g, got[2], p0, p1),
                                          (d_beta, got[3], p0, p1)):
                if piece_grad is not None:
                    acc[rows, a:b] += piece_grad
            if got[1] is not None:
                d_weight.add_(got[1])
            d_state = got[4] if state is not None else None
    return d_qkv, d_weight, d_g, d_beta


@gated_delta_core_backward.register_fake
def _gated_delta_core_backward_fake(grad, qkv, weight, g, beta, states, n_k, dk, activation, modeling, rule, piece):
    return torch.empty_like(qkv), torch.empty_like(weight), torch.empty_like(g), torch.empty_like(beta)


def _setup(ctx, inputs, output):
    qkv, weight, g, beta, ctx.n_k, ctx.dk, ctx.activation, ctx.modeling, ctx.rule, ctx.piece = inputs
    ctx.save_for_backward(qkv, weight, g, beta, output[1])


def _backward(ctx, grad, _d_states):
    qkv, weight, g, beta, states = ctx.saved_tensors
    grads = gated_delta_core_backward(grad.contiguous(), qkv, weight, g, beta, states, ctx.n_k, ctx.dk,
                                      ctx.activation, ctx.modeling, ctx.rule, ctx.piece)
    return (*grads, None, None, None, None, None, None)


gated_delta_core.register_autograd(_backward, setup_context=_setup)
# under autocast: the conv in the autocast dtype (conv1d is on autocast's lower-precision list); the recurrence
# upcasts to fp32 itself, and g stays fp32 as the layer computes it
cast_under_autocast(torch.ops.autosp_ops.gated_delta_core.default, cast=(0, 1))

__all__ = ["HeadSlice", "PIECE_TOKENS", "check_architecture", "check_plan", "gated_delta_core",
           "gated_delta_core_backward", "gated_deltanet_layers", "head_slice", "install", "split_reason"]
