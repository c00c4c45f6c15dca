"""Attention pass: Ulysses all-to-alls around every ``scaled_dot_product_attention``, and ring attention
inside them when the SP group has a ring.

2-D SP (``ctx.candidate.ring`` R > 1, :mod:`autosp.compiler.groups`): the all-to-alls below run over the U =
P / R ranks of the Ulysses group (P replaced by U everywhere below), after which every rank of a ring
position holds that position's 2S/2R zigzag tokens (:mod:`autosp.compiler.attention.layout`) for H/U
heads; each SDPA, whichever schedule built it, then becomes ``autosp_ops::ring_attention`` over the ring
group (:mod:`autosp.compiler.attention.ring`), which passes the key/value blocks around the ring and
merges the partial results by log-sum-exp. With U = 1 (pure ring) there is no all-to-all: the SDPA's
k and v are the model's n_kv heads (``repeat_kv`` peeled as below) and the ring op does grouped-query
attention itself. Head counts need only divide by U, so P may exceed the number of heads.

Packed documents and sliding windows (``ctx.rule`` set: the engine trains packed documents or the model
has windowed layers), soft-capped attention (Gemma 2's ``autosp_ops::capped_sdpa``,
:mod:`autosp.compiler.softcapping`: its cap rides along as the ops' ``softcap``) and attention with sinks
(gpt-oss's ``autosp_ops::sink_sdpa``, :mod:`autosp.compiler.sinks`: the ops get ``sinks``, this rank's heads'
slice of the sink logits, :func:`_local_sinks`): after the rewrite each SDPA
becomes ``autosp_ops::span_attention`` (Ulysses only;
the rank holds the whole sequence for its heads, so documents and windows are a local restriction) or a
ring attention given the rule; both read the batch's documents at run time
(:mod:`autosp.compiler.attention.documents`) and take the layer's window, read here from the model config
through the layer index in the call's module path (:func:`layer_window`).

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

Overlap schedules (plan knob ``overlap``, docs/cost_model.md section 7). ``none`` uses the blocking
``autosp_ops::all_to_all``. The other two split each all-to-all into ``autosp_ops::all_to_all_start``
(launch, returns the in-flight receive buffer) and ``autosp_ops::all_to_all_wait`` (wait, lay out),
and place compute between the two nodes (see :mod:`autosp.compiler.ops` for how their autograd makes
the backward overlap in mirror image):

- ``kv_async``: the K and V starts go right after K (post-RoPE) and V are ready; every node only the
  query needs (its projection, RoPE) that sat before them is moved after them; the Q all-to-all is
  blocking; the K and V waits come right before attention. Forward: the K/V exchanges run under the
  Q projection, RoPE and the Q exchange. Backward (autograd reverses the order): the inverse K/V
  exchanges start when attention's backward produced dK, dV and run under the inverse Q exchange and
  the Q path's backward (RoPE, the projection's input and weight gradients).
- ``head_pipeline``: attention runs in C = min(HEAD_PIPELINE_CHUNKS, local heads) head groups (the
  cost model's C). Group g sends, for every rank, its slice of that rank's heads (q, and the kv heads
  it needs that no earlier group sent). Schedule, one group of look-ahead each way::

      start(0) start(1) | wait(0) attn(0) start_out(0) start(2) | wait(1) attn(1) start_out(1)
      wait_out(0) start(3) | ... | wait_out(C-1); output = the groups' heads put back in order

  so group g+1's input exchange and group g-1's output exchange run under group g's attention.
  Backward: the same schedule reversed. Groups follow the kv heads: with at least C local kv heads
  each group is whole kv heads with their query heads; with fewer, each group is part of one kv
  head's query heads and that kv head travels once, with its first group.
"""

from __future__ import annotations

import operator
import re

import torch
from torch import fx

from autosp.compiler import ops
from autosp.compiler.attention import local as _local_ops  # noqa: F401  (registers autosp_ops::span_attention)
from autosp.compiler.attention import ring as _ring_ops  # noqa: F401  (registers autosp_ops::ring_attention)
from autosp.compiler.context import SPContext
from autosp.compiler.sinks import SINKS_ARG, sinks_of
from autosp.compiler.softcapping import softcap_of
from autosp.compiler.passes.common import (
    SDPA,
    SDPA_ARGS,
    SDPA_DEFAULTS,
    ancestors,
    fail,
    is_call,
    is_method,
    normalized,
    set_named_args,
    shape,
)
from autosp.cost_models.step_time import HEAD_PIPELINE_CHUNKS

A2A = torch.ops.autosp_ops.all_to_all.default
A2A_START = torch.ops.autosp_ops.all_to_all_start.default
A2A_WAIT = torch.ops.autosp_ops.all_to_all_wait.default
RING = torch.ops.autosp_ops.ring_attention.default
SPAN = torch.ops.autosp_ops.span_attention.default
_LAYER_INDEX = re.compile(r"(?:\.(\d+)|\[(\d+)\]|\['(\d+)'\])(?=\.|\[|$)")


def layer_index(node: fx.Node) -> int | None:
    """The decoder layer an SDPA call belongs to: the last list index in its module path
    (``model.layers.3.self_attn`` -> 3), from Dynamo's ``nn_module_stack``."""
    stack = node.meta.get("nn_module_stack") or {}
    for path, _ in reversed(list(stack.values())):
        found = [next(g for g in m.groups() if g is not None) for m in _LAYER_INDEX.finditer(str(path))]
        if found:
            return int(found[-1])
    return None


def graph_layer(gm: fx.GraphModule, example_inputs, ctx: SPContext) -> int | None:
    """The one decoder layer whose parameters this graph takes as inputs (a ZeRO-3 layer fragment), by the
    parameters' identity (``ctx.param_layers``); None when there are none or several."""
    layers = {ctx.param_layers.get(id(value)) for node, value in
              zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs)
              if isinstance(value, torch.nn.Parameter)}
    layers.discard(None)
    return layers.pop() if len(layers) == 1 else None


def layer_window(node: fx.Node, ctx: SPContext, fragment_layer: int | None = None) -> int:
    """The sliding window of this SDPA call's layer in tokens, 0 for a global layer. The layer is the list
    index in the call's module path, else the layer whose parameters the graph takes (``fragment_layer``:
    under ZeRO-3 a layer's graph is traced from the layer's own frame, without the path; Dynamo then
    shares a compiled layer graph only between layers whose window attribute is the same)."""
    windows = ctx.layer_windows
    if not windows:
        return 0
    distinct = set(windows)
    if len(distinct) == 1:  # every layer alike (Mistral): no need to know which layer this is
        return next(iter(distinct)) or 0
    index = layer_index(node)
    if index is None:
        index = fragment_layer
    if index is None or index >= len(windows):
        fail(f"the model mixes sliding-window and global layers ({len(windows)} layers) but this attention's layer "
             f"index could not be read from its module path", node)
    return windows[index] or 0


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
    graph, p, group = gm.graph, ctx.candidate.ulysses, ctx.ulysses_group
    ranks = "sequence-parallel ranks" if ctx.candidate.ring == 1 else "Ulysses ranks (sp / ring)"
    ulysses = ctx.candidate.ring == 1 or p > 1
    fragment_layer = graph_layer(gm, example_inputs, ctx) if ctx.rule and ctx.layer_windows else None
    capped = sinks = False
    for node in list(graph.nodes):
        if not is_call(node, SDPA):
            continue
        if ctx.rule:  # read before the rewrite: the head pipeline's new SDPA calls have no module path
            node.meta["autosp_window"] = layer_window(node, ctx, fragment_layer)
        capped = capped or bool(softcap_of(node))
        sinks = sinks or sinks_of(node) is not None
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
            fail(f"{n_heads} query heads do not divide over {p} {ranks}", node)
        k_src, k_rep = _peel_repeat_kv(k)
        v_src, v_rep = _peel_repeat_kv(v)
        if shape(k_src)[1] != shape(v_src)[1]:  # only one of them was recognisably repeated
            k_src, v_src = k, v
        n_kv = shape(k_src)[1]
        if n_heads % n_kv:
            fail(f"{n_heads} query heads are not a multiple of {n_kv} key/value heads", node)
        if not ulysses:  # pure ring: k/v keep their n_kv heads, the ring op does grouped-query attention
            set_named_args(node, SDPA_ARGS, key=k_src, value=v_src, enable_gqa=n_kv != n_heads)
            ctx.stats.attention += 1
            continue
        if n_kv % p == 0:
            replicate = 1
        elif p % n_kv == 0:
            replicate = p // n_kv
        else:
            fail(f"{n_kv} key/value heads are incompatible with {p} {ranks} (need "
                 f"n_kv % P == 0 or P % n_kv == 0)", node)
        local_q_heads, local_kv_heads = n_heads // p, n_kv * replicate // p
        plan = _Layer(graph, node, args, q, k_src, v_src, replicate, p, group, local_q_heads, local_kv_heads,
                      first_head=(ctx.sp_rank % p) * local_q_heads)
        if ctx.candidate.overlap == "kv_async":
            _kv_async(plan)
        elif ctx.candidate.overlap == "head_pipeline" and min(HEAD_PIPELINE_CHUNKS, local_q_heads) > 1:
            _head_pipeline(plan, min(HEAD_PIPELINE_CHUNKS, local_q_heads))
        else:  # none (or a head pipeline of one group: nothing to pipeline)
            _blocking(plan)
        if ctx.candidate.overlap in ("none", "kv_async") or min(HEAD_PIPELINE_CHUNKS, local_q_heads) == 1:
            _local_sinks(plan, node, 0, local_q_heads)  # the node now attends this rank's heads
        if ctx.candidate.overlap != "none":
            ctx.stats.attention_overlapped += 1
        ctx.stats.attention += 1
    if ctx.candidate.ring > 1:
        for node in [n for n in graph.nodes if is_call(n, SDPA)]:
            _ring_attention(graph, node, ctx)
    elif ctx.rule or capped or sinks:  # documents, windows, soft-capped scores or sinks (which SDPA cannot do)
        for node in [n for n in graph.nodes if is_call(n, SDPA)]:
            _span_attention(graph, node, ctx)
    graph.eliminate_dead_code()


def _span_attention(graph: fx.Graph, node: fx.Node, ctx: SPContext) -> None:
    """Replace a (rewired, mask-free, causal) SDPA by attention restricted to the published documents and the
    layer's window (:mod:`autosp.compiler.attention.local`)."""
    args = normalized(node, SDPA_ARGS, SDPA_DEFAULTS)
    if args["dropout_p"] not in (0, 0.0):
        fail("attention dropout is not supported with packed documents or sliding windows: set the model's "
             "attention dropout to 0", node)
    with graph.inserting_before(node):
        span = graph.call_function(SPAN, (args["query"], args["key"], args["value"], args["scale"], ctx.rule or "",
                                          node.meta.get("autosp_window", 0), softcap_of(node)),
                                   {"sinks": sinks_of(node)} if sinks_of(node) is not None else {})
        out = graph.call_function(operator.getitem, (span, 0))
    for new in (span, out):
        new.meta.update({k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack",
                                                                      "autosp_head_group", "autosp_window")})
    node.replace_all_uses_with(out)
    graph.erase_node(node)


def _ring_attention(graph: fx.Graph, node: fx.Node, ctx: SPContext) -> None:
    """Replace a (rewired, mask-free, causal) SDPA by ring attention over the ring group."""
    args = normalized(node, SDPA_ARGS, SDPA_DEFAULTS)
    if args["dropout_p"] not in (0, 0.0):
        fail("attention dropout is not supported with ring attention (ring > 1): set the model's attention "
             "dropout to 0", node)
    with graph.inserting_before(node):
        cap = softcap_of(node)  # documents / window / soft-capped scores
        restriction = (ctx.rule or "", node.meta.get("autosp_window", 0), *((cap,) if cap else ())) \
            if ctx.rule or cap else ()
        ring = graph.call_function(RING, (args["query"], args["key"], args["value"], args["scale"], ctx.ring_group,
                                          ctx.ring_ranges, *restriction),
                                   {"sinks": sinks_of(node)} if sinks_of(node) is not None else {})
        out = graph.call_function(operator.getitem, (ring, 0))
    for new in (ring, out):
        new.meta.update({k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack",
                                                                      "autosp_head_group")})
    ring.meta["autosp_ring"] = True
    node.replace_all_uses_with(out)
    graph.erase_node(node)


class _Layer:
    """One SDPA call to rewrite and what the pass worked out about it."""

    def __init__(self, graph, node, args, q, k_src, v_src, replicate, p, group, local_q_heads, local_kv_heads,
                 first_head=0):
        self.graph, self.node, self.args = graph, node, args
        self.q, self.k_src, self.v_src, self.replicate = q, k_src, v_src, replicate
        self.p, self.group = p, group
        self.local_q_heads, self.local_kv_heads = local_q_heads, local_kv_heads
        self.first_head = first_head  # the first of this rank's query heads after the all-to-all (its Ulysses rank's)

    def kv_input(self, src):
        """The kv tensor as it travels: replicated P/n_kv times when there are fewer kv heads than ranks."""
        if self.replicate > 1:
            return self.graph.call_function(torch.repeat_interleave, (src, self.replicate), {"dim": 1})
        return src

    def call(self, target, args, kwargs=None):
        new = self.graph.call_function(target, args, kwargs or {})
        if "stack_trace" in self.node.meta:
            new.meta["stack_trace"] = self.node.meta["stack_trace"]
        return new


def _local_sinks(plan: _Layer, node: fx.Node, lo: int, hi: int) -> None:
    """Give a ``sink_sdpa`` node that attends this rank's local query heads ``lo:hi`` (after the all-to-all) the
    same heads' slice of the sink logits. The parameter stays whole on every rank: its gradient is this rank's
    heads' share in the slice and zero elsewhere, and the data-parallel sum over the SP group adds the shares."""
    sinks = sinks_of(node)
    if sinks is None:
        return
    with plan.graph.inserting_before(node):
        local = plan.call(torch.narrow, (sinks, 0, plan.first_head + lo, hi - lo))
    if len(node.args) > SINKS_ARG:
        node.args = (*node.args[:SINKS_ARG], local, *node.args[SINKS_ARG + 1:])
    else:
        node.kwargs = {**node.kwargs, "sinks": local}


def _blocking(plan: _Layer) -> None:
    graph, node, group = plan.graph, plan.node, plan.group
    with graph.inserting_before(node):
        q2 = plan.call(A2A, (plan.q, 1, 2, group))
        kv = [plan.call(A2A, (plan.kv_input(src), 1, 2, group)) for src in (plan.k_src, plan.v_src)]
    set_named_args(node, SDPA_ARGS, query=q2, key=kv[0], value=kv[1],
                   enable_gqa=plan.local_kv_heads != plan.local_q_heads)
    with graph.inserting_after(node):
        out = plan.call(A2A, (node, 2, 1, group))
    node.replace_all_uses_with(out, delete_user_cb=lambda user: user is not out)
    node.meta["autosp_ulysses"] = True


def _insertion_point(graph, src: fx.Node) -> fx.Node:
    """Right after ``src``, or after the last placeholder when ``src`` is a graph input."""
    if src.op == "placeholder":
        return [n for n in graph.nodes if n.op == "placeholder"][-1]
    return src


def _kv_async(plan: _Layer) -> None:
    graph, node, group = plan.graph, plan.node, plan.group
    starts = []
    for src in (plan.k_src, plan.v_src):
        with graph.inserting_after(_insertion_point(graph, src)):
            travelling = plan.kv_input(src)
        with graph.inserting_after(_insertion_point(graph, travelling)):
            starts.append(plan.call(A2A_START, (travelling, 1, 2, group)))
    position = {n: i for i, n in enumerate(graph.nodes)}
    anchor = max(starts, key=position.__getitem__)
    _move_query_path_after(graph, plan.q, (plan.k_src, plan.v_src), anchor, position)
    dtype_k, dtype_v = _dtype(plan.k_src), _dtype(plan.v_src)
    with graph.inserting_before(node):
        q2 = plan.call(A2A, (plan.q, 1, 2, group))
        k2 = plan.call(A2A_WAIT, (starts[0], 1, 2, group, dtype_k))
        v2 = plan.call(A2A_WAIT, (starts[1], 1, 2, group, dtype_v))
    set_named_args(node, SDPA_ARGS, query=q2, key=k2, value=v2, enable_gqa=plan.local_kv_heads != plan.local_q_heads)
    with graph.inserting_after(node):
        out = plan.call(A2A, (node, 2, 1, group))
    node.replace_all_uses_with(out, delete_user_cb=lambda user: user is not out)
    node.meta["autosp_ulysses"] = True


def _dtype(node: fx.Node) -> torch.dtype:
    value = node.meta.get("example_value", node.meta.get("val"))
    if not isinstance(value, torch.Tensor):
        fail("internal: attention input without a recorded dtype", node)
    return value.dtype


def _move_query_path_after(graph, q: fx.Node, kv_sources, anchor: fx.Node, position: dict) -> list:
    """Move the nodes only the query needs (its projection, RoPE, ...) from before ``anchor`` to after it.

    A node moves only if each of its users is also moved or already after ``anchor``, so the graph stays
    topologically ordered. Returns the moved nodes in their (kept) relative order.
    """
    shared = set()
    for src in kv_sources:
        shared |= ancestors(src) | {src}
    query_only = {n for n in ancestors(q) | {q}
                  if n not in shared and n.op not in ("placeholder", "get_attr") and position[n] < position[anchor]}
    movable: set = set()
    for n in sorted(query_only, key=position.__getitem__, reverse=True):
        if all(u in movable or position[u] > position[anchor] for u in n.users):
            movable.add(n)
    cursor = anchor
    moved = sorted(movable, key=position.__getitem__)
    for n in moved:
        cursor.append(n)
        cursor = n
    return moved


def head_groups(local_q: int, local_kv: int, chunks: int) -> list[tuple[int, int, int, int]]:
    """(q_lo, q_hi, kv_lo, kv_hi) of each head group, local heads; ``chunks`` <= local_q groups.

    With at least ``chunks`` kv heads, the groups are whole kv heads (split as evenly as possible) with
    their query heads; otherwise every kv head's query heads are split into pieces, ``chunks`` in all.
    """
    ratio = local_q // local_kv
    if local_kv >= chunks:
        bounds = [len(t) for t in torch.arange(local_kv).tensor_split(chunks)]
        out, lo = [], 0
        for n in bounds:
            out.append((lo * ratio, (lo + n) * ratio, lo, lo + n))
            lo += n
        return out
    pieces = [chunks // local_kv + (1 if i < chunks % local_kv else 0) for i in range(local_kv)]
    out = []
    for kv, n in enumerate(pieces):
        for t in torch.arange(kv * ratio, (kv + 1) * ratio).tensor_split(n):
            out.append((int(t[0]), int(t[-1]) + 1, kv, kv + 1))
    return out


def _head_pipeline(plan: _Layer, chunks: int) -> None:
    graph, node, group, p = plan.graph, plan.node, plan.group, plan.p
    hq, hk = plan.local_q_heads, plan.local_kv_heads
    groups = head_groups(hq, hk, chunks)
    dtypes = {"q": _dtype(plan.q), "k": _dtype(plan.k_src), "v": _dtype(plan.v_src)}
    args = plan.args

    def heads(t, local, lo, hi):
        # [B, P*local, s, d] -> every rank's heads lo:hi, rank-major: [B, P*(hi-lo), s, d]
        view = plan.call(torch.unflatten, (t, 1, (p, local)))
        part = plan.call(operator.getitem, (view, (slice(None), slice(None), slice(lo, hi))))
        return plan.call(torch.flatten, (part, 1, 2))

    with graph.inserting_before(node):
        k_in, v_in = plan.kv_input(plan.k_src), plan.kv_input(plan.v_src)
        started, received, kv_of, outs_started, outs = {}, {}, {}, {}, []
        sent_kv = 0

        def start(g):
            nonlocal sent_kv
            q_lo, q_hi, kv_lo, kv_hi = groups[g]
            entry = {"q": plan.call(A2A_START, (heads(plan.q, hq, q_lo, q_hi), 1, 2, group))}
            if kv_hi > sent_kv:
                if kv_lo != sent_kv:
                    fail("internal: head groups do not follow the kv heads", node)
                entry["k"] = plan.call(A2A_START, (heads(k_in, hk, kv_lo, kv_hi), 1, 2, group))
                entry["v"] = plan.call(A2A_START, (heads(v_in, hk, kv_lo, kv_hi), 1, 2, group))
                sent_kv = kv_hi
                kv_of[(kv_lo, kv_hi)] = g
            started[g] = entry

        def wait(g):
            received[g] = {name: plan.call(A2A_WAIT, (t, 1, 2, group, dtypes[name])) for name, t in started[g].items()}

        def attend(g):
            q_lo, q_hi, kv_lo, kv_hi = groups[g]
            kv = received[kv_of[(kv_lo, kv_hi)]]
            cap = {"softcap": softcap_of(node)} if softcap_of(node) else {}
            sinks = {"sinks": sinks_of(node)} if sinks_of(node) is not None else {}
            out = plan.call(node.target, (received[g]["q"], kv["k"], kv["v"]),
                            {"dropout_p": args["dropout_p"], "is_causal": True, "scale": args["scale"],
                             "enable_gqa": (q_hi - q_lo) != (kv_hi - kv_lo), **cap, **sinks})
            _local_sinks(plan, out, q_lo, q_hi)  # the group's heads' sinks
            out.meta["autosp_ulysses"] = True
            out.meta["autosp_head_group"] = g  # one layer's attention is several SDPA calls here
            if "autosp_window" in node.meta:
                out.meta["autosp_window"] = node.meta["autosp_window"]
            outs_started[g] = plan.call(A2A_START, (out, 2, 1, group))

        def wait_out(g):
            done = plan.call(A2A_WAIT, (outs_started[g], 2, 1, group, dtypes["q"]))
            q_lo, q_hi = groups[g][:2]
            outs.append(plan.call(torch.unflatten, (done, 1, (p, q_hi - q_lo))))

        start(0)
        if len(groups) > 1:
            start(1)
        for g in range(len(groups)):
            wait(g)
            attend(g)
            if g >= 1:
                wait_out(g - 1)
            if g + 2 < len(groups):
                start(g + 2)
        wait_out(len(groups) - 1)
        merged = plan.call(torch.flatten, (plan.call(torch.cat, (outs,), {"dim": 2}), 1, 2))
    node.replace_all_uses_with(merged)
    graph.erase_node(node)


# --- Inductor: keep the overlap windows -------------------------------------------------------------------
# Inductor's scheduler re-sorts nodes after fusion (and for peak memory), which can move an all-to-all
# start down to its wait and so close the window (seen on the backward of kv_async: the inverse K/V
# starts moved past the Q path). A post-grad pass pins the order the graph was built in: every
# heavy node (matmul, attention, autosp op) between a start and its wait gets the start as an extra
# dependency, and the wait gets every one of them, with Inductor's own ``control_deps`` mechanism
# (the one it uses to order collectives around matmuls). Every added edge agrees with the existing
# order, so no cycle can appear. It also keeps the collectives in one fixed order on every rank.
_HEAVY_ATEN = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention_for_cpu",
               "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
               "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu_backward",
               "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
               "_scaled_dot_product_cudnn_attention_backward")


def _heavy(node: fx.Node) -> bool:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    return target.namespace == "autosp_ops" or (target.namespace == "aten" and target._opname in _HEAVY_ATEN)


def overlap_window_deps(graph: fx.Graph) -> dict:
    """{node: nodes it must follow} that keep each start ... wait window as built."""
    nodes = list(graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    deps: dict = {}
    for start in (n for n in nodes if n.op == "call_function" and n.target is A2A_START):
        waits = [u for u in start.users if u.op == "call_function" and u.target is A2A_WAIT]
        if len(waits) != 1:
            continue
        wait = waits[0]
        inside = [n for n in nodes[position[start] + 1:position[wait]] if _heavy(n)]
        for n in inside:
            deps.setdefault(n, {})[start] = None
        deps.setdefault(wait, {}).update(dict.fromkeys(inside))
    return {n: list(before) for n, before in deps.items() if before}


def pin_overlap_order(graph: fx.Graph) -> int:
    """Apply :func:`overlap_window_deps` with ``control_deps``; returns how many nodes were pinned (0 when
    this torch has no ``control_deps``: the order is then Inductor's, see the README)."""
    try:
        from torch._inductor.fx_passes.control_dependencies import preserve_node_ordering
        from torch.utils._ordered_set import OrderedSet
    except ImportError:  # torch < 2.10
        return 0
    deps = overlap_window_deps(graph)
    if deps:
        preserve_node_ordering(graph, {n: OrderedSet(before) for n, before in deps.items()})
    return len(deps)


def inductor_config_patches(ctx: SPContext) -> dict:
    """``compile_fx(config_patches=...)`` for this engine: the window-pinning pass when overlapping."""
    if ctx.candidate.overlap == "none":
        return {}
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class PinOverlapOrder(CustomGraphPass):
        def __call__(self, graph: fx.Graph) -> None:
            pin_overlap_order(graph)

        def uuid(self):
            return "autosp-pin-overlap-order-v1"

    return {"post_grad_custom_post_pass": PinOverlapOrder()}


def wrapped(node: fx.Node) -> bool:
    """Is this SDPA call's every input and its output an autosp all-to-all (blocking, or a start/wait pair)?"""
    args = normalized(node, SDPA_ARGS, SDPA_DEFAULTS)
    inputs_ok = all(isinstance(args[k], fx.Node) and is_call(args[k], {A2A, A2A_WAIT})
                    for k in ("query", "key", "value"))
    return inputs_ok and bool(node.users) and all(is_call(u, {A2A, A2A_START}) for u in node.users)


def ring_wrapped(node: fx.Node, ulysses: bool) -> bool:
    """Is this ring (or span) attention call's output used (through its ``[0]``), and with Ulysses ranks are its q, k,
    v and its output all-to-alls (blocking, or a start/wait pair)?"""
    outs = [u for u in node.users if u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0]
    if not outs or not all(o.users for o in outs):
        return False
    if not ulysses:
        return True
    inputs_ok = all(isinstance(a, fx.Node) and is_call(a, {A2A, A2A_WAIT}) for a in node.args[:3])
    return inputs_ok and all(is_call(u, {A2A, A2A_START}) for o in outs for u in o.users)


__all__ = ["RING", "SPAN", "attention_pass", "graph_layer", "layer_index", "layer_window", "ring_wrapped", "wrapped", "ops"]
