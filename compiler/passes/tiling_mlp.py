"""MLP tiling pass (plan knob ``mlp_chunks``): each layer's MLP runs in N sequence chunks.

Pattern (on the Dynamo graph, torch-level ops), with or without biases:

- gated (Llama, Mistral, Qwen2, the reference model): ``down(act(gate(x)) * up(x))``
- plain: ``down(act(up(x)))``

``gate``, ``up`` and ``down`` are ``F.linear`` calls, ``act`` is SiLU, GELU (exact or tanh) or ReLU,
and every intermediate has no other user. Each match becomes one ``autosp_ops::tiled_mlp`` node. A mixture of
experts' routed MLP, autosp's ``autosp_ops::moe_experts`` (compiler/experts.py), is tiled by its own ``chunks``
argument: it dispatches, computes and combines N token pieces one after the other.

``autosp_ops::tiled_mlp`` is a ``torch.library.custom_op``, opaque to AOTAutograd and Inductor, so the
chunks cannot be fused back into one s x ffn tensor:

- forward: under no-grad, for each of N chunks of the sequence dimension (``torch.tensor_split``: any
  length, the last chunks may be one token shorter) compute the MLP and write it into the output;
  only the chunk's intermediates are alive at a time;
- the autograd formula saves the MLP *input and the weights only* (no s x ffn tensor is saved for
  backward) and calls ``autosp_ops::tiled_mlp_backward``, which recomputes each chunk's forward with
  autograd enabled, back-propagates that chunk's output gradient, writes the chunk's input gradient
  and accumulates the weight gradients (in the weight dtype: see ``tiled_mlp_backward``). Per-token
  arithmetic is the same as untiled; weight gradients are sums over chunks instead of one matmul over all
  tokens (one rounding per chunk). This is ALST's TiledMLP, with the recompute inside the op instead of a
  checkpoint.

Memory (what docs/cost_model.md assumes): saved for backward drops from the MLP intermediates to the
MLP input; the live intermediates and their gradients in forward and backward drop to one chunk's
(4f/N and 3f/N per token). Cost: one more MLP forward per step.
"""

from __future__ import annotations

import operator
from typing import Optional

import torch
import torch.nn.functional as F
from torch import fx

from autosp.compiler.autocast import cast_under_autocast
from autosp.compiler.context import SPContext
from autosp.compiler.experts import moe_experts as _moe_experts  # noqa: F401  (registers autosp_ops::moe_experts)
from autosp.compiler.passes.common import SDPA, add_matmul_into, fail, is_call, shape

MOE_EXPERTS = torch.ops.autosp_ops.moe_experts.default

LINEAR = {F.linear}
_ACTIVATIONS = {
    F.silu: "silu", torch._C._nn.silu: "silu", torch.nn.functional.silu: "silu",
    F.relu: "relu", torch.relu: "relu",
    F.gelu: "gelu",
}
_MUL = {operator.mul, torch.mul}


def _act(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "silu":
        return F.silu(x)
    if name == "gelu":
        return F.gelu(x)
    if name == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu(x)
    raise RuntimeError(f"autosp_ops::tiled_mlp: unknown activation {name!r}")


def mlp_reference(x, up_w, up_b, gate_w, gate_b, down_w, down_b, act: str):
    """The untiled MLP the op computes: down(act(gate(x)) * up(x)), or down(act(up(x))) without a gate."""
    up = F.linear(x, up_w, up_b)
    inner = _act(act, F.linear(x, gate_w, gate_b)) * up if gate_w is not None else _act(act, up)
    return F.linear(inner, down_w, down_b)


def _seq_dim(x: torch.Tensor) -> int:
    return max(x.dim() - 2, 0)  # [B, s, h]: the sequence; [T, h]: the tokens


@torch.library.custom_op("autosp_ops::tiled_mlp", mutates_args=())
def tiled_mlp(x: torch.Tensor, up_w: torch.Tensor, up_b: Optional[torch.Tensor], gate_w: Optional[torch.Tensor],
              gate_b: Optional[torch.Tensor], down_w: torch.Tensor, down_b: Optional[torch.Tensor], act: str,
              chunks: int) -> torch.Tensor:
    dim = _seq_dim(x)
    dtype = torch.promote_types(x.dtype, down_w.dtype)
    out = x.new_empty((*x.shape[:-1], down_w.shape[0]), dtype=dtype)
    start = 0
    for xc in torch.tensor_split(x, chunks, dim=dim):
        n = xc.shape[dim]
        if n:
            out.narrow(dim, start, n).copy_(mlp_reference(xc, up_w, up_b, gate_w, gate_b, down_w, down_b, act))
        start += n
    return out


@tiled_mlp.register_fake
def _tiled_mlp_fake(x, up_w, up_b, gate_w, gate_b, down_w, down_b, act, chunks):
    return x.new_empty((*x.shape[:-1], down_w.shape[0]), dtype=torch.promote_types(x.dtype, down_w.dtype))


def _present(*tensors):
    return [t for t in tensors if t is not None]


def _act_backward(name: str, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """d act(x) given d output: the kernels autograd itself uses for these functions."""
    if name == "silu":
        return torch.ops.aten.silu_backward(grad, x)
    if name in ("gelu", "gelu_tanh"):
        return torch.ops.aten.gelu_backward(grad, x, approximate="tanh" if name == "gelu_tanh" else "none")
    if name == "relu":
        return torch.ops.aten.threshold_backward(grad, x, 0)
    raise RuntimeError(f"autosp_ops::tiled_mlp_backward: unknown activation {name!r}")


def _accumulate_weight_grad(grad2d, x2d, acc_w, acc_b):
    """Accumulate d W (and d b) of y = x W^T + b: one GEMM adding into the accumulator (no product tensor)."""
    add_matmul_into(acc_w, grad2d.t(), x2d)
    if acc_b is not None:
        acc_b.add_(grad2d.sum(0))


def _linear_backward(grad2d, x2d, w, acc_w, acc_b):
    """:func:`_accumulate_weight_grad`, then return d x."""
    _accumulate_weight_grad(grad2d, x2d, acc_w, acc_b)
    return grad2d.mm(w)


@torch.library.custom_op("autosp_ops::tiled_mlp_backward", mutates_args=())
def tiled_mlp_backward(grad: torch.Tensor, x: torch.Tensor, up_w: torch.Tensor, up_b: Optional[torch.Tensor],
                       gate_w: Optional[torch.Tensor], gate_b: Optional[torch.Tensor], down_w: torch.Tensor,
                       down_b: Optional[torch.Tensor], act: str, chunks: int) -> list[torch.Tensor]:
    """[d x, d up_w, (d up_b), (d gate_w), (d gate_b), d down_w, (d down_b)]: one entry per given tensor.

    Chunk by chunk: recompute the chunk's forward (the intermediates of one chunk only), then its
    backward with the kernels autograd would run (mm, silu/gelu/threshold backward), so every token's
    arithmetic is the untiled one; weight gradients are accumulated over chunks in the weight dtype, each chunk's
    GEMM adding into them (``addmm_``): no fp32 copy of the weights and no product tensor, as ALST's TiledMLP
    (autograd accumulating into ``.grad``) and Liger's default; for 16-bit weights that is one rounding per chunk
    instead of one in all.
    """
    dim = _seq_dim(x)
    params = [up_w, up_b, gate_w, gate_b, down_w, down_b]
    acc = [None if p is None else torch.zeros_like(p) for p in params]  # the gradients it returns (see above)
    acc_up_w, acc_up_b, acc_gate_w, acc_gate_b, acc_down_w, acc_down_b = acc
    dx = torch.empty_like(x)
    start = 0
    for xc, gc in zip(torch.tensor_split(x, chunks, dim=dim), torch.tensor_split(grad, chunks, dim=dim)):
        n = xc.shape[dim]
        if not n:
            continue
        x2 = xc.reshape(-1, x.shape[-1])
        g2 = gc.reshape(-1, gc.shape[-1])
        up = F.linear(x2, up_w, up_b)
        if gate_w is not None:
            # At most four f-wide tensors per token alive at once (the cost model's 3f/N + f/N): the products
            # below reuse the buffers of tensors that are dead after them (same elementwise arithmetic).
            gate = F.linear(x2, gate_w, gate_b)
            activated = _act(act, gate)
            inner = activated * up
            _accumulate_weight_grad(g2, inner, acc_down_w, acc_down_b)
            del inner  # before d_inner exists
            d_inner = g2.mm(down_w)
            d_act = up.mul_(d_inner)           # d act(gate) = d_inner * up, in up's buffer
            d_up = d_inner.mul_(activated)     # d up = d_inner * act(gate), in d_inner's buffer
            del up, d_inner, activated
            d_gate = _act_backward(act, d_act, gate)
            del d_act, gate
            d_x = _linear_backward(d_gate, x2, gate_w, acc_gate_w, acc_gate_b)
            del d_gate
            d_x = d_x + _linear_backward(d_up, x2, up_w, acc_up_w, acc_up_b)
        else:
            _accumulate_weight_grad(g2, _act(act, up), acc_down_w, acc_down_b)
            d_inner = g2.mm(down_w)
            d_up = _act_backward(act, d_inner, up)
            del up, d_inner
            d_x = _linear_backward(d_up, x2, up_w, acc_up_w, acc_up_b)
        dx.narrow(dim, start, n).copy_(d_x.view(xc.shape))
        del d_up, d_x  # else they are still alive while the next chunk builds its own
        start += n
    return [dx, *(total for total in acc if total is not None)]


@tiled_mlp_backward.register_fake
def _tiled_mlp_backward_fake(grad, x, up_w, up_b, gate_w, gate_b, down_w, down_b, act, chunks):
    return [torch.empty_like(x), *(torch.empty_like(p) for p in _present(up_w, up_b, gate_w, gate_b, down_w, down_b))]


def _setup(ctx, inputs, output):
    x, up_w, up_b, gate_w, gate_b, down_w, down_b, ctx.act, ctx.chunks = inputs
    ctx.save_for_backward(x, up_w, up_b, gate_w, gate_b, down_w, down_b)  # the input and weights only


def _backward(ctx, grad):
    saved = ctx.saved_tensors
    grads = iter(tiled_mlp_backward(grad.contiguous(), *saved, ctx.act, ctx.chunks))
    dx = next(grads)
    return (dx, *(next(grads) if p is not None else None for p in saved[1:]), None, None)


tiled_mlp.register_autograd(_backward, setup_context=_setup)
cast_under_autocast(torch.ops.autosp_ops.tiled_mlp.default)  # under autocast: its linears in the autocast dtype

TILED_MLP = torch.ops.autosp_ops.tiled_mlp.default


# --- the pass ----------------------------------------------------------------------------------------------
def _linear(node) -> tuple | None:
    """(input, weight, bias) of an ``F.linear`` node, else None."""
    if not isinstance(node, fx.Node) or not is_call(node, LINEAR):
        return None
    args = list(node.args) + [None] * 3
    x = node.kwargs.get("input", args[0])
    w = node.kwargs.get("weight", args[1])
    b = node.kwargs.get("bias", args[2])
    return x, w, b


def _activation(node) -> str | None:
    if not isinstance(node, fx.Node) or node.op != "call_function" or node.target not in _ACTIVATIONS:
        return None
    name = _ACTIVATIONS[node.target]
    if name == "gelu":
        approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
        if approximate == "tanh":
            return "gelu_tanh"
        if approximate != "none":
            return None
    return name


def _single_use(*nodes) -> bool:
    return all(len(n.users) == 1 for n in nodes)


def match_mlp(down: fx.Node) -> dict | None:
    """The MLP whose down projection is ``down``: {x, up, gate, act, down, nodes}, or None."""
    down_args = _linear(down)
    if down_args is None:
        return None
    inner = down_args[0]
    if not isinstance(inner, fx.Node):
        return None
    found = None
    if is_call(inner, _MUL) and len(inner.args) == 2 and all(isinstance(a, fx.Node) for a in inner.args):
        for act_node, up in (inner.args, inner.args[::-1]):
            act = _activation(act_node)
            gate, up_args = _linear(act_node.args[0]) if act else None, _linear(up)
            if act and gate is not None and up_args is not None and gate[0] is up_args[0]:
                found = dict(x=up_args[0], up=up_args[1:], gate=gate[1:], act=act, down=down_args[1:],
                             nodes=(inner, act_node, act_node.args[0], up))
                break
    else:
        act = _activation(inner)
        up_args = _linear(inner.args[0]) if act else None
        if up_args is not None:
            found = dict(x=up_args[0], up=up_args[1:], gate=(None, None), act=act, down=down_args[1:],
                         nodes=(inner, inner.args[0]))
    if found is None or not _single_use(*found["nodes"]):
        return None  # an intermediate used elsewhere must exist in full: nothing to gain
    x_shape = shape(found["x"])
    if x_shape is None or len(x_shape) < 2:
        return None
    return found


def mlp_tiling_pass(gm: fx.GraphModule, example_inputs, ctx: SPContext) -> None:
    chunks = ctx.candidate.mlp_chunks
    if chunks <= 1:
        return
    graph = gm.graph
    matches = [m for m in (match_mlp(n) for n in list(graph.nodes)) if m is not None]
    # what SDPA became with ring attention, or with packed documents / sliding windows
    ring = {torch.ops.autosp_ops.ring_attention.default, torch.ops.autosp_ops.span_attention.default}
    n_attention = sum(1 for n in graph.nodes if (is_call(n, SDPA) or is_call(n, ring))
                      and not n.meta.get("autosp_head_group"))
    # a mixture of experts' MLP is autosp's expert op (compiler/experts.py): it runs its tokens in pieces itself
    experts = [n for n in graph.nodes if n.op == "call_function" and n.target is MOE_EXPERTS]
    for node in experts:
        node.kwargs = {**node.kwargs, "chunks": chunks}
        ctx.stats.mlps_tiled += 1
    if len(matches) + len(experts) < n_attention:
        fail(f"mlp_chunks={chunks}: found {len(matches)} MLP(s) for {n_attention} attention layer(s); MLP tiling "
             f"recognises down(act(gate(x)) * up(x)) and down(act(up(x))) built from F.linear with SiLU, GELU or "
             f"ReLU and no other use of the intermediates; re-plan with mlp_chunks=1")
    used: set = set()
    for m in matches:
        down = next(iter(m["nodes"][0].users))
        if used & {down, *m["nodes"]}:
            continue  # overlaps an MLP already tiled (the output of one feeding straight into another)
        used |= {down, *m["nodes"]}
        with graph.inserting_before(down):
            node = graph.call_function(TILED_MLP, (m["x"], *m["up"], *m["gate"], *m["down"], m["act"], chunks))
        node.meta.update(down.meta)
        down.replace_all_uses_with(node)
        graph.erase_node(down)
        for dead in m["nodes"]:
            graph.erase_node(dead)
        ctx.stats.mlps_tiled += 1
    graph.eliminate_dead_code()


__all__ = ["mlp_tiling_pass", "match_mlp", "tiled_mlp", "tiled_mlp_backward", "mlp_reference", "TILED_MLP"]
