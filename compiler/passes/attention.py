"""Attention pass: Ulysses all-to-alls around every ``scaled_dot_product_attention``.

Each rank holds s = S/P tokens of every head. Before attention, ``autosp_ops::all_to_all`` turns q, k and v
from [B, H, s, d] (sequence-sharded) into [B, H/P, S, d] (head-sharded): every rank now sees the whole
sequence for H/P heads, and causal attention over it is exact. The output goes back the same way.

Grouped-query attention (n_kv key/value heads, H query heads):

- k/v that the model expanded to H heads with ``repeat_kv`` (expand + reshape, or repeat_interleave,
  which HF does whenever it passes a mask) are traced back to their n_kv heads, so the all-to-all moves
  n_kv heads instead of H; SDPA then runs with ``enable_gqa=True`` on the local heads instead of
  materialising the repeat over the full sequence.
- n_kv % P == 0: the kv heads are sharded like the query heads (rank r's query heads use exactly the kv
  heads r receives).
- P % n_kv == 0: each kv head is replicated P/n_kv times before the all-to-all, so every rank receives
  the one kv head its query heads share.
- otherwise: an error (the planner treats such a candidate as invalid).

The mask pass runs first: every SDPA reaching this pass is mask-free and causal.
"""

from __future__ import annotations

import torch
from torch import fx

from autosp.compiler import ops
from autosp.compiler.context import SPContext
from autosp.compiler.passes.common import SDPA, SDPA_ARGS, SDPA_DEFAULTS, fail, is_call, is_method, normalized, set_named_args, shape

A2A = torch.ops.autosp_ops.all_to_all.default


def _peel_repeat_kv(node: fx.Node):
    """If ``node`` is k/v repeated to more heads, return (source with n_kv heads, n_rep); else (node, 1)."""
    out_shape = shape(node)
    if out_shape is None or len(out_shape) != 4:
        return node, 1
    # repeat_interleave(x, n_rep, dim=1)
    if (node.op in ("call_function", "call_method") and getattr(node.target, "__name__", node.target)
            == "repeat_interleave"):
        source = node.args[0]
        src_shape = shape(source)
        if src_shape is not None and len(src_shape) == 4 and out_shape[1] % src_shape[1] == 0 \
                and src_shape[0] == out_shape[0] and src_shape[2:] == out_shape[2:]:
            dim = node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else None)
            if dim in (1, -3):
                return source, out_shape[1] // src_shape[1]
        return node, 1
    # HF repeat_kv: x[:, :, None, :, :].expand(B, n_kv, n_rep, s, d).reshape(B, n_kv * n_rep, s, d)
    if not is_method(node, "reshape", "view"):
        return node, 1
    expanded = node.args[0]
    if not isinstance(expanded, fx.Node) or not is_method(expanded, "expand"):
        return node, 1
    inserted = expanded.args[0]
    if not isinstance(inserted, fx.Node):
        return node, 1
    source = inserted.args[0] if inserted.args else None
    if not isinstance(source, fx.Node):
        return node, 1
    src_shape, exp_shape = shape(source), shape(expanded)
    if src_shape is None or exp_shape is None or len(src_shape) != 4 or len(exp_shape) != 5:
        return node, 1
    b, n_kv, s, d = src_shape
    if exp_shape[0] != b or exp_shape[1] != n_kv or exp_shape[3:] != (s, d) or shape(inserted) != (b, n_kv, 1, s, d):
        return node, 1
    n_rep = exp_shape[2]
    if out_shape != (b, n_kv * n_rep, s, d):
        return node, 1
    return source, n_rep


def attention_pass(gm: fx.GraphModule, example_inputs, ctx: SPContext) -> None:
    graph, p, group = gm.graph, ctx.sp_size, ctx.sp_group
    for node in list(graph.nodes):
        if not is_call(node, SDPA):
            continue
        args = normalized(node, SDPA_ARGS, SDPA_DEFAULTS)
        if args["attn_mask"] is not None or not args["is_causal"]:
            fail("internal: attention reached the attention pass with a mask", node)
        q, k, v = args["query"], args["key"], args["value"]
        q_shape = shape(q)
        if q_shape is None or len(q_shape) != 4:
            fail("sequence parallelism needs SDPA inputs shaped [batch, heads, seq, head_dim]", node)
        n_heads, seq = q_shape[1], q_shape[2]
        if seq != ctx.local_len:
            fail(f"attention over {seq} tokens where this rank holds {ctx.local_len}: the sequence dimension "
                 f"of SDPA's inputs is not the model's sequence", node)
        if n_heads % p:
            fail(f"{n_heads} query heads do not divide over {p} sequence-parallel ranks", node)
        k_src, k_rep = _peel_repeat_kv(k)
        v_src, v_rep = _peel_repeat_kv(v)
        if shape(k_src)[1] != shape(v_src)[1]:  # only one of them was recognisably repeated
            k_src, v_src = k, v
        n_kv = shape(k_src)[1]
        if n_heads % n_kv:
            fail(f"{n_heads} query heads are not a multiple of {n_kv} key/value heads", node)
        if n_kv % p == 0:
            replicate = 1
        elif p % n_kv == 0:
            replicate = p // n_kv
        else:
            fail(f"{n_kv} key/value heads are incompatible with {p} sequence-parallel ranks (need "
                 f"n_kv % P == 0 or P % n_kv == 0)", node)
        local_q_heads, local_kv_heads = n_heads // p, n_kv * replicate // p
        with graph.inserting_before(node):
            q2 = graph.call_function(A2A, (q, 1, 2, group))
            kv = []
            for src in (k_src, v_src):
                if replicate > 1:
                    src = graph.call_function(torch.repeat_interleave, (src, replicate), {"dim": 1})
                kv.append(graph.call_function(A2A, (src, 1, 2, group)))
        set_named_args(node, SDPA_ARGS, query=q2, key=kv[0], value=kv[1],
                       enable_gqa=local_kv_heads != local_q_heads)
        with graph.inserting_after(node):
            out = graph.call_function(A2A, (node, 2, 1, group))
        node.replace_all_uses_with(out, delete_user_cb=lambda user: user is not out)
        node.meta["autosp_ulysses"] = True
        ctx.stats.attention += 1
    graph.eliminate_dead_code()


def wrapped(node: fx.Node) -> bool:
    """Is this SDPA call's every input and its output an autosp all-to-all?"""
    args = normalized(node, SDPA_ARGS, SDPA_DEFAULTS)
    inputs_ok = all(isinstance(args[k], fx.Node) and is_call(args[k], {A2A}) for k in ("query", "key", "value"))
    return inputs_ok and bool(node.users) and all(is_call(u, {A2A}) for u in node.users)


__all__ = ["attention_pass", "wrapped", "ops"]
