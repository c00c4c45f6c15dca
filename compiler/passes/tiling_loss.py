"""Logits + loss tiling pass (plan knob ``loss_chunks``): the LM head and the cross-entropy run in N
token chunks and the full s x vocab logits never exist.

It runs after the loss pass, which has already made the loss ``cross_entropy(..., reduction='sum')``
(or ``nll_loss(log_softmax(...), reduction='sum')``) over this rank's tokens and built the exact
global mean from that sum (docs/design.md section 2). The pattern, walking back from the loss's input:

    F.linear(hidden, W, b)  [-> cap * tanh(. / cap)]  [-> .float() / .to(float32)]  [-> view / reshape / ...]

with no other use of the logits than the loss and the model's output. It becomes one
``autosp_ops::tiled_linear_cross_entropy(hidden, W, b, target, ignore_index, upcast, chunks, softcap)`` node,
the same token-loss sum, so the global mean, ``ignore_index`` and the padding the runtime adds are
handled exactly as without tiling. Gemma 2's final-logit soft-capping (``cap * tanh(logits / cap)`` between the
head and the loss) is recognised and applied to each chunk's logits (``softcap``), its derivative in the
backward. ``W`` may be the input embedding (tied embeddings): its gradient
from this op is added to the embedding's by autograd, as for any weight used twice.

``autosp_ops::tiled_linear_cross_entropy`` (a ``torch.library.custom_op``, opaque to AOTAutograd and
Inductor): the forward computes, for each of N chunks of the flattened tokens, the chunk's logits
(upcast to fp32 if the model did), its cross-entropy sum (fp32 accumulation), and frees them; the
autograd formula saves only ``hidden``, ``W``, ``b`` and the targets, and
``autosp_ops::tiled_linear_cross_entropy_backward`` recomputes each chunk's logits with autograd
enabled and back-propagates the chunk's loss into d(hidden) (written chunk by chunk) and d(W), d(b)
(accumulated in the weight dtype, each chunk's GEMM adding into them). Per token the arithmetic is the
untiled one. This is ALST's TiledFusedLogitsLoss, with the recompute inside the op.

**The logits are not available when tiled.** The model's output still has its ``logits`` field (the
graph's output structure is Dynamo's), but it holds an empty tensor: keeping the s x vocab logits
for the caller is exactly what tiling removes. The engine returns the loss only, as it always does.
"""

from __future__ import annotations

import operator
from typing import Optional

import torch
import torch.nn.functional as F
from torch import fx

from autosp.compiler.autocast import cast_under_autocast
from autosp.compiler.context import SPContext
from autosp.compiler.passes.common import (
    CE_ARGS,
    CE_DEFAULTS,
    CROSS_ENTROPY,
    LOG_SOFTMAX,
    NLL_LOSS,
    add_matmul_into,
    fail,
    is_call,
    is_method,
    normalized,
    shape,
)

LINEAR = {F.linear}
_SHAPE_METHODS = {"view", "reshape", "contiguous", "flatten"}
_SHAPE_FUNCTIONS = {torch.reshape, torch.flatten}


def capped(logits: torch.Tensor, softcap: float) -> torch.Tensor:
    """Gemma 2's final-logit soft-capping ``cap * tanh(logits / cap)`` (the identity for ``softcap`` 0)."""
    return torch.tanh(logits / softcap) * softcap if softcap else logits


def _loss_logits(hidden, weight, bias, upcast: bool, softcap: float) -> torch.Tensor:
    """The logits the cross-entropy reads: ``hidden @ W.T + b``, soft-capped, upcast if the model did."""
    logits = capped(F.linear(hidden.reshape(-1, hidden.shape[-1]), weight, bias), softcap)
    return logits.float() if upcast else logits


def loss_reference(hidden, weight, bias, target, ignore_index: int, upcast: bool, softcap: float = 0.0) -> torch.Tensor:
    """The untiled computation: sum of the token cross-entropies of ``hidden @ W.T + b`` (soft-capped first)."""
    logits = _loss_logits(hidden, weight, bias, upcast, softcap)
    return F.cross_entropy(logits, target.reshape(-1), ignore_index=ignore_index, reduction="sum")


# Callables ``observe(logits, target, ignore_index)`` given each chunk's logits (as the loss reads them) and targets
# in the forward, while the chunk exists: the only place the tiled logits can be read (autosp.hf's per-token
# metrics, TRL's entropy and token accuracy). Whoever appends one removes it after its call.
LOGIT_OBSERVERS: list = []


def _out_dtype(hidden, weight, upcast):
    return torch.float32 if upcast else torch.promote_types(hidden.dtype, weight.dtype)


@torch.library.custom_op("autosp_ops::tiled_linear_cross_entropy", mutates_args=())
def tiled_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                               target: torch.Tensor, ignore_index: int, upcast: bool, chunks: int,
                               softcap: float = 0.0) -> torch.Tensor:
    flat, flat_target = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)
    dtype = _out_dtype(hidden, weight, upcast)
    total = torch.zeros((), dtype=torch.promote_types(dtype, torch.float32), device=hidden.device)
    for hc, tc in zip(torch.tensor_split(flat, chunks), torch.tensor_split(flat_target, chunks)):
        if hc.shape[0]:
            logits = _loss_logits(hc, weight, bias, upcast, softcap)
            total += F.cross_entropy(logits, tc, ignore_index=ignore_index, reduction="sum")
            for observe in LOGIT_OBSERVERS:
                observe(logits, tc, ignore_index)
            del logits  # else this chunk's logits are still alive at the next chunk's peak
    return total.to(dtype)


@tiled_linear_cross_entropy.register_fake
def _tiled_fake(hidden, weight, bias, target, ignore_index, upcast, chunks, softcap=0.0):
    return hidden.new_empty((), dtype=_out_dtype(hidden, weight, upcast))


@torch.library.custom_op("autosp_ops::tiled_linear_cross_entropy_backward", mutates_args=())
def tiled_linear_cross_entropy_backward(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor,
                                        bias: Optional[torch.Tensor], target: torch.Tensor, ignore_index: int,
                                        upcast: bool, chunks: int, softcap: float = 0.0) -> list[torch.Tensor]:
    """[d hidden, d weight, (d bias)].

    Chunk by chunk: recompute the chunk's logits and log-softmax, then the backward with the kernels
    autograd runs for ``cross_entropy`` (nll_loss_backward, _log_softmax_backward_data) and the linear
    (mm), so every token's arithmetic is the untiled one; d W, d b accumulate over chunks.
    """
    flat, flat_target = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)
    acc_w = torch.zeros_like(weight)  # in the weight dtype, as the tiled MLP (tiling_mlp.tiled_mlp_backward)
    acc_b = None if bias is None else torch.zeros_like(bias)
    d_hidden = torch.empty_like(flat)
    start = 0
    for hc, tc in zip(torch.tensor_split(flat, chunks), torch.tensor_split(flat_target, chunks)):
        n = hc.shape[0]
        if not n:
            continue
        logits = F.linear(hc, weight, bias)
        if softcap:  # keep tanh(logits / cap): the cap's derivative is 1 - tanh^2
            tanh = torch.tanh(logits / softcap)
            logits = tanh * softcap
        z = logits.float() if upcast else logits
        logp = torch.log_softmax(z, dim=-1)
        del z
        _, total_weight = torch.ops.aten.nll_loss_forward(logp, tc, None, 2, ignore_index)
        d_logp = torch.ops.aten.nll_loss_backward(grad.to(logp.dtype), logp, tc, None, 2, ignore_index, total_weight)
        d_z = torch.ops.aten._log_softmax_backward_data(d_logp, logp, -1, logp.dtype)
        del d_logp, logp
        d_logits = d_z.to(logits.dtype)
        del d_z, logits
        if softcap:
            d_logits = d_logits * (1 - tanh * tanh)
            del tanh
        add_matmul_into(acc_w, d_logits.t(), hc)
        if acc_b is not None:
            acc_b.add_(d_logits.sum(0))
        d_hidden[start:start + n].copy_(d_logits.mm(weight))
        del d_logits  # else this tile's logit gradient is still alive at the next tile's peak
        start += n
    return [d_hidden.view(hidden.shape), acc_w, *([acc_b] if bias is not None else [])]


@tiled_linear_cross_entropy_backward.register_fake
def _tiled_backward_fake(grad, hidden, weight, bias, target, ignore_index, upcast, chunks, softcap=0.0):
    return [torch.empty_like(hidden), torch.empty_like(weight), *([torch.empty_like(bias)] if bias is not None else [])]


def _setup(ctx, inputs, output):
    hidden, weight, bias, target, ctx.ignore_index, ctx.upcast, ctx.chunks, ctx.softcap = inputs
    ctx.save_for_backward(hidden, weight, bias, target)  # no logits


def _backward(ctx, grad):
    hidden, weight, bias, target = ctx.saved_tensors
    grads = tiled_linear_cross_entropy_backward(grad, hidden, weight, bias, target, ctx.ignore_index, ctx.upcast,
                                                ctx.chunks, ctx.softcap)
    return grads[0], grads[1], (grads[2] if bias is not None else None), None, None, None, None, None


tiled_linear_cross_entropy.register_autograd(_backward, setup_context=_setup)
# under autocast: the LM head in the autocast dtype, the cross-entropy in fp32 (upcast, argument 5), as autocast
# runs the untiled linear and cross_entropy
cast_under_autocast(torch.ops.autosp_ops.tiled_linear_cross_entropy.default, replaced={5: True})

TILED_LOSS = torch.ops.autosp_ops.tiled_linear_cross_entropy.default


# --- the pass ----------------------------------------------------------------------------------------------
def _is_upcast(node: fx.Node) -> bool:
    if node.op != "call_method":
        return False
    if node.target == "float":
        return len(node.args) == 1 and not node.kwargs
    if node.target == "to":
        dtypes = [a for a in (*node.args[1:], *node.kwargs.values()) if isinstance(a, torch.dtype)]
        others = [a for a in node.args[1:] if not isinstance(a, (torch.dtype, torch.device, str))]
        return dtypes == [torch.float32] and not others
    return False


def _is_shape_only(node: fx.Node) -> bool:
    return ((node.op == "call_method" and node.target in _SHAPE_METHODS)
            or (node.op == "call_function" and node.target in _SHAPE_FUNCTIONS))


def _is_device_move(node: fx.Node) -> bool:
    """``.to(device)`` / ``.to('cpu')``: a no-op on the logits' own device (HF moves labels so)."""
    if node.op != "call_method" or node.target != "to":
        return False
    args = [*node.args[1:], *node.kwargs.values()]
    return bool(args) and all(isinstance(a, (torch.device, str)) for a in args)


def match_logits_loss(loss: fx.Node) -> dict:
    """{head, hidden, weight, bias, upcast, softcap, chain} for the loss node, or a UsageError saying what is in the
    way."""
    args = normalized(loss, CE_ARGS, CE_DEFAULTS)
    node = args["input"]
    if is_call(loss, NLL_LOSS):
        if not (isinstance(node, fx.Node) and is_call(node, LOG_SOFTMAX)):
            fail("loss tiling needs nll_loss's input to be log_softmax(logits)", loss)
        dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
        if dim not in (-1, 1):
            fail("loss tiling needs log_softmax over the vocabulary (dim=-1)", node)
        chain, node = [node], node.args[0]
    else:
        chain = []
    upcast, softcap = False, 0.0
    while isinstance(node, fx.Node) and node.op != "placeholder" and not is_call(node, LINEAR):
        cap = _softcap_chain(node)
        if cap and not softcap:  # cap * tanh(logits / cap): the three nodes join the chain
            softcap = cap[0]
            chain.extend(cap[1][:-1])
            node = cap[1][-1]
        elif _is_shape_only(node) or _is_device_move(node):
            pass
        elif _is_upcast(node):
            upcast = True
        else:
            fail(f"loss_chunks: the logits reach the loss through {node.target!r}; loss tiling supports only the LM "
                 f"head (F.linear), an fp32 upcast and reshapes before the cross-entropy; re-plan with "
                 f"loss_chunks=1", node)
        chain.append(node)
        node = node.args[0]
    if not isinstance(node, fx.Node) or node.op == "placeholder":
        fail("loss_chunks: the logits enter the loss's graph as an input (the LM head ran in another graph, e.g. "
             "behind ZeRO-3's module hooks), so they exist in full before the loss; loss tiling needs the LM head "
             "and the loss in one graph; re-plan with loss_chunks=1", loss)
    head = node
    hidden, weight = head.kwargs.get("input", head.args[0]), head.kwargs.get("weight", head.args[1])
    bias = head.kwargs.get("bias", head.args[2] if len(head.args) > 2 else None)
    return dict(head=head, hidden=hidden, weight=weight, bias=bias, upcast=upcast, softcap=softcap, chain=chain)


def _constant(a, b):
    """(the node, the number) of a binary op's two arguments when one is a node and the other a number."""
    if isinstance(a, fx.Node) and isinstance(b, (int, float)):
        return a, float(b)
    if isinstance(b, fx.Node) and isinstance(a, (int, float)):
        return b, float(a)
    return None, None


def _softcap_chain(node: fx.Node):
    """(cap, [mul, tanh, div]) when ``node`` is ``tanh(x / cap) * cap`` (Gemma 2's final-logit soft-capping, as
    transformers writes it), else None."""
    if not is_call(node, {operator.mul, torch.mul}):
        return None
    inner, cap = _constant(*node.args[:2])
    if inner is None or not cap or not (is_call(inner, {torch.tanh}) or is_method(inner, "tanh")) \
            or len(inner.users) != 1:
        return None
    divided = inner.args[0]
    if not (isinstance(divided, fx.Node) and is_call(divided, {operator.truediv, torch.div}) and len(divided.users) == 1):
        return None
    source, divisor = divided.args[0], divided.args[1]
    if not isinstance(source, fx.Node) or not isinstance(divisor, (int, float)) or float(divisor) != cap:
        return None
    return cap, [node, inner, divided]


def loss_tiling_pass(gm: fx.GraphModule, example_inputs, ctx: SPContext) -> None:
    chunks = ctx.candidate.loss_chunks
    if chunks <= 1:
        return
    graph = gm.graph
    losses = [n for n in graph.nodes if (is_call(n, CROSS_ENTROPY) or is_call(n, NLL_LOSS))]
    if not losses:
        return  # ZeRO-3 fragment without the loss; the loss pass insists on one loss overall
    loss = losses[0]
    args = normalized(loss, CE_ARGS, CE_DEFAULTS)
    if args["reduction"] != "sum" or args["weight"] is not None or args["label_smoothing"] not in (0, 0.0):
        fail("loss_chunks: expected the plain token cross-entropy the loss pass produced (no class weights, no "
             "label smoothing)", loss)
    m = match_logits_loss(loss)
    head, hidden_shape, target = m["head"], shape(m["hidden"]), args["target"]
    out_shape, target_shape = shape(head), shape(target)
    if hidden_shape is None or out_shape is None or target_shape is None:
        fail("loss_chunks: cannot read the shapes of the LM head and the targets", head)
    tokens = 1
    for d in out_shape[:-1]:
        tokens *= d
    if target_shape != (tokens,) and target_shape != tuple(out_shape[:-1]):
        fail(f"loss_chunks: the targets {target_shape} do not line up with the logits {out_shape}", loss)
    # the logits may feed only the loss chain and the graph's output (which then gets an empty tensor)
    chain = set(m["chain"]) | {head, loss}
    output = next(n for n in graph.nodes if n.op == "output")
    for node in (head, *m["chain"]):
        for user in node.users:
            if user not in chain and user is not output:
                fail(f"loss_chunks: the logits are also used by {user.target!r}; with loss tiling the full logits "
                     f"never exist, so nothing but the loss may read them; re-plan with loss_chunks=1", user)
    with graph.inserting_before(loss):
        fused = graph.call_function(TILED_LOSS, (m["hidden"], m["weight"], m["bias"], target, args["ignore_index"],
                                                 m["upcast"], chunks, m["softcap"]))
    fused.meta.update(loss.meta)
    loss.replace_all_uses_with(fused)
    graph.erase_node(loss)
    logits_in_output = [n for n in (head, *m["chain"]) if output in n.users]
    if logits_in_output:
        with graph.inserting_before(output):
            empty = graph.call_method("new_empty", (m["hidden"], (0,)), {"dtype": shape_dtype(head)})
        for node in logits_in_output:
            output.replace_input_with(node, empty)
    graph.eliminate_dead_code()
    ctx.stats.losses_tiled += 1


def shape_dtype(node: fx.Node) -> torch.dtype:
    value = node.meta.get("example_value", node.meta.get("val"))
    return value.dtype if isinstance(value, torch.Tensor) else torch.float32


__all__ = ["LOGIT_OBSERVERS", "loss_tiling_pass", "match_logits_loss", "tiled_linear_cross_entropy",
           "tiled_linear_cross_entropy_backward", "loss_reference", "TILED_LOSS"]
