"""Position pass: give model-derived positions this rank's global offset.

A model that builds its own ``position_ids`` does it from the sequence length it sees:
``torch.arange(s)`` (HF: ``arange(inputs_embeds.shape[1]) + past_seen_tokens``). Traced at the local
length, every rank would then use positions 0..s-1. This pass finds those aranges and gives them the
global positions of the tokens the rank holds (``ctx.spans``): plain Ulysses adds ``sp_rank * s``, so rank
r uses positions r*s .. (r+1)*s-1, as one process on the full sequence; with a ring the rank holds zigzag
chunks (one jump in its rows, :mod:`autosp.compiler.attention.layout`) and row i gets
``i + offset_0 + sum_k (i >= start_k) * (offset_k - offset_{k-1})``, where span k begins at row start_k
and ``offset_k`` is its global start minus start_k (elementwise, from the arange itself: no new input).

An arange counts as a position only if it has the local length *and* its value flows into a rotary
computation (``cos``/``sin``) or a position-embedding lookup (the indices of ``F.embedding``). Value
flow stops where a tensor is used only as an index into another tensor or only for its shape
(``new_ones``, ``size``...), so batch and head aranges and the index aranges of mask construction are
never touched, even when the batch size equals the local length. (The mask pass runs first and has
already deleted any mask construction, which also reads the positions.)

When ``position_ids`` is a graph input, the runtime already sharded it and there is no arange to fix.
Under graph breaks (ZeRO-3) an arange can leave the graph before reaching its consumer; the runtime then
passes global ``position_ids`` itself, and an arange that still escapes a graph unclassified is an error
rather than a guess.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from autosp.compiler.context import SPContext
from autosp.compiler.passes.common import ARANGE, EMBEDDING, ancestors, fail, is_call, is_method

_SHAPE_ONLY_METHODS = {"new_ones", "new_zeros", "new_empty", "new_full", "size", "dim", "numel"}
_SHAPE_ONLY_FUNCTIONS = {torch.ones_like, torch.zeros_like, torch.empty_like, torch.full_like}
_INDEX_FUNCTIONS = {torch.index_select, torch.gather, torch.take, torch.take_along_dim}


def _arange_length(node: fx.Node) -> int | None:
    args = list(node.args)
    if not args or not all(isinstance(a, int) for a in args):
        return None
    if "step" in node.kwargs and node.kwargs["step"] != 1:
        return None
    if len(args) == 1:
        return args[0]
    if len(args) == 2:
        return args[1] - args[0]
    return None if args[2] != 1 else args[1] - args[0]


def _flows(node: fx.Node, user: fx.Node) -> bool:
    """Does ``user`` carry ``node``'s values forward (not just index with it or read its shape)?"""
    if user.op == "output":
        return True
    if user.op == "call_method" and user.target in _SHAPE_ONLY_METHODS:
        return False
    if user.op == "call_function" and user.target in _SHAPE_ONLY_FUNCTIONS:
        return False
    if user.op == "call_function" and user.target is operator.getitem:
        return user.args[0] is node
    if user.op == "call_function" and user.target in _INDEX_FUNCTIONS:
        index = user.kwargs.get("index", user.args[2] if len(user.args) > 2 else None)
        return index is not node
    return True


def _classify(arange: fx.Node) -> str:
    """'position', 'escapes' (reaches a graph output unclassified) or 'internal'."""
    seen, stack, escapes = {arange}, [arange], False
    while stack:
        node = stack.pop()
        for user in node.users:
            if not _flows(node, user):
                continue
            if user.op == "output":
                escapes = True
                continue
            if is_method(user, "cos", "sin") or is_call(user, {torch.cos, torch.sin}):
                return "position"
            if is_call(user, EMBEDDING) and user.args and user.args[0] is node:
                return "position"
            if user not in seen:
                seen.add(user)
                stack.append(user)
    return "escapes" if escapes else "internal"


def _global_positions(graph: fx.Graph, node: fx.Node, spans) -> fx.Node:
    """Nodes after ``node`` (local rows 0..s-1) computing the global position of each row."""
    starts, offsets, row = [], [], 0
    for a, b in spans:
        starts.append(row)
        offsets.append(a - row)
        row += b - a
    out = graph.call_function(operator.add, (node, offsets[0]))
    for start, previous, offset in zip(starts[1:], offsets, offsets[1:]):
        after = graph.call_function(operator.ge, (node, start))
        out = graph.call_function(operator.add, (out, graph.call_function(operator.mul, (after, offset - previous))))
    return out


def position_pass(gm: fx.GraphModule, example_inputs, ctx: SPContext) -> None:
    spans = ctx.spans
    for node in list(gm.graph.nodes):
        if not is_call(node, ARANGE) or _arange_length(node) != ctx.local_len:
            continue
        kind = _classify(node)
        if kind == "escapes" and ctx.fragments and not ctx.positions_from_runtime:
            fail("the model derives positions from torch.arange and they leave the compiled graph at a "
                 "graph break (ZeRO-3 module hooks), so their use cannot be checked: make the model's "
                 "forward accept position_ids", node)
        if kind != "position":
            continue
        ctx.stats.positions_offset += 1
        if len(spans) == 1 and spans[0][0] == 0:
            continue
        if len(spans) > 1 and node.args and len(node.args) >= 2 and node.args[0] != 0:
            fail("the model's positions start at a non-zero arange; with ring attention's zigzag sharding autosp "
                 "needs arange(0, s) or position_ids", node)
        with gm.graph.inserting_before(node.next):  # keeps the new nodes in program order
            shifted = _global_positions(gm.graph, node, spans)
        new_nodes = set(ancestors(shifted)) | {shifted}
        node.replace_all_uses_with(shifted, delete_user_cb=lambda user: user not in new_nodes)


__all__ = ["position_pass"]
