"""Sequence-chunking pass (plan knob ``sequence_chunks`` > 1): every decoder layer becomes one
``autosp_ops::chunked_layer`` node that runs the layer over the rank's tokens in that many chunks
(:mod:`autosp.compiler.chunked_layer`: the algorithm, what is saved, what is recomputed, the offload).

Runs last, on the graph the other passes made: a layer's Ulysses all-to-alls (any of them: q, k, v, out; the
``kv_async`` split ones too), its ring attention, its tiled MLP are inside the region that is cut out, so they
run per chunk. For each decoder layer (the nodes :func:`~autosp.compiler.passes.checkpointing.assign_layers`
gives one layer index; under ZeRO-3 a fragment graph with attention and no indexed module is one layer):

- the region's one attention node (SDPA, ``autosp_ops::ring_attention``, or ``autosp_ops::span_attention``
  for packed documents and sliding windows) becomes a call of :func:`~autosp.compiler.chunked_layer.attend`;
  the ring and span ops' document rule and window ride along into the chunk pairs' attention, their sinks
  (gpt-oss) into ``attend``;
- the values the region reads from outside are classified: parameters (graph inputs that are
  ``nn.Parameter``, attributes) go in whole; activations with the local sequence length at dim -2 (the
  hidden states [B, s, h], the rotary tables [B, s, d]) are chunked along it; activations without the
  sequence length go in whole (constants); anything else is an error;
- every value used after the region must be token-wise ([..., s, ...] at dim -2): it is assembled from the
  chunks' outputs.

The region becomes a graph over one chunk (:class:`~autosp.compiler.chunked_layer.LayerProgram`) and the
node's outputs replace the region's. Head-pipelined attention (several attention nodes per layer) is refused.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from autosp.compiler.context import SPContext
from autosp.compiler.passes.common import SDPA, SDPA_ARGS, SDPA_DEFAULTS, example, fail, is_call, normalized


def _attention_nodes(graph: fx.Graph) -> list:
    restricted = {torch.ops.autosp_ops.ring_attention.default, torch.ops.autosp_ops.span_attention.default}
    return [n for n in graph.nodes if is_call(n, SDPA) or is_call(n, restricted)]


def _layers(gm: fx.GraphModule, ctx: SPContext) -> dict:
    from autosp.compiler.passes.checkpointing import assign_layers

    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    layers = assign_layers(gm.graph, calls)
    if not layers and ctx.fragments and _attention_nodes(gm.graph):
        layers = assign_layers(gm.graph, calls, whole_graph_is_layer=True)
    return layers


def _parameters(gm: fx.GraphModule, example_inputs) -> set:
    found = {n for n in gm.graph.nodes if n.op == "get_attr"}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, example_inputs):
        if isinstance(value, torch.nn.Parameter):
            found.add(node)
    return found


_SIZED_METHODS = {"view", "reshape", "expand", "new_zeros", "new_ones", "new_empty", "new_full", "broadcast_to"}
_SIZED_FUNCTIONS = {torch.reshape, torch.ones, torch.zeros, torch.empty, torch.full, torch.broadcast_to}


def _sized(node: fx.Node) -> bool:
    """Does ``node`` take sizes as arguments (which Dynamo traced as literals of the local length)?"""
    return ((node.op == "call_method" and node.target in _SIZED_METHODS)
            or (node.op == "call_function" and node.target in _SIZED_FUNCTIONS))


def _sizes(args: tuple) -> tuple[int, list]:
    """(index in ``args`` where the sizes start, the sizes): ``f(x, (a, b))``, ``f(x, a, b)``, ``f((a, b), fill)``."""
    for index, a in enumerate(args):
        if isinstance(a, (tuple, list, torch.Size)):
            return index, list(a)
        if isinstance(a, int) and not isinstance(a, bool):
            return index, [b for b in args[index:] if isinstance(b, int) and not isinstance(b, bool)]
    return len(args), []


def _seq_positions(node: fx.Node, s: int) -> list[int] | None:
    """Which of ``node``'s size arguments are the sequence length (None: cannot tell). One argument equal to s
    is it; with several (a model dimension equal to s), the one whose output dim is the input's sequence dim
    (same product of the dims before it; the input's sequence dim is its one dim of size s, or with several
    its dim -2, where chunked inputs have theirs)."""
    _, sizes = _sizes(node.args)
    found = [k for k, a in enumerate(sizes) if a == s]
    if len(found) <= 1:
        return found
    source = example(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) else None
    out = example(node)
    if source is None or out is None or len(sizes) != out.dim():
        return None
    dims = [d for d, n in enumerate(source.shape) if n == s]
    if len(dims) != 1:
        dims = [source.dim() - 2] if source.dim() >= 2 and source.shape[-2] == s else []
    if not dims:
        return None
    prefix = _prod(source.shape[:dims[0]])
    match = [k for k in found if _prod(out.shape[:k]) == prefix]
    return match if len(match) == 1 else None


def _prod(dims) -> int:
    total = 1
    for d in dims:
        total *= d
    return total


def _resize(node: fx.Node, positions: list[int], new: int) -> None:
    """Put ``new`` in place of the size arguments at ``positions``."""
    start, sizes = _sizes(node.args)
    for k in positions:
        sizes[k] = new
    args = list(node.args)
    if start < len(args) and isinstance(args[start], (tuple, list, torch.Size)):
        args[start] = type(args[start])(sizes) if not isinstance(args[start], torch.Size) else tuple(sizes)
    else:
        args[start:start + len(sizes)] = sizes
    node.args = tuple(args)


_RING_ARGS = ("query", "key", "value", "scale", "group", "ranges", "rule", "window", "softcap")
_SPAN_ARGS = ("query", "key", "value", "scale", "rule", "window", "softcap")


def _attention_args(node: fx.Node):
    """(q, k, v, scale, returns_lse, rule, window, softcap, sinks) of an SDPA, ring- or span-attention node
    (``rule``: the engine whose packed documents apply, "" for none; ``window``: the layer's sliding window, 0 for
    none; ``softcap``: Gemma 2's attention logit cap, 0 for none; ``sinks``: gpt-oss's local sink logits, a node,
    or None)."""
    if is_call(node, SDPA):
        args = normalized(node, SDPA_ARGS, SDPA_DEFAULTS)
        if args["attn_mask"] is not None or not args["is_causal"] or args["dropout_p"]:
            fail("sequence_chunks needs causal attention without a mask or dropout (the mask pass makes it so for "
                 "causal models); re-plan with sequence_chunks=1", node)
        return args["query"], args["key"], args["value"], args["scale"], False, "", 0, 0.0, None
    names = _SPAN_ARGS if is_call(node, {torch.ops.autosp_ops.span_attention.default}) else _RING_ARGS
    args = normalized(node, (*names, "sinks"), {"rule": "", "window": 0, "softcap": 0.0, "sinks": None})
    return (args["query"], args["key"], args["value"], args["scale"], True, args["rule"], args["window"],
            args["softcap"], args["sinks"])


def _the_attention(graph: fx.Graph, ctx: SPContext, region: list) -> fx.Node:
    """The layer's one attention op (a chunked layer runs exactly one, over the chunks' K/V)."""
    all_attention = set(_attention_nodes(graph))
    attention = [n for n in region if n in all_attention]
    if len(attention) != 1:
        fail(f"sequence_chunks={ctx.candidate.sequence_chunks}: a decoder layer has {len(attention)} attention ops; chunked "
             f"layers need exactly one (overlap=head_pipeline splits it: use overlap none or kv_async)", region[0])
    return attention[0]


def _layer_inputs(region: list, params: set, s: int, attn: fx.Node) -> tuple:
    """The nodes outside the region that it reads, in first-read order, and the same sorted into token-wise
    inputs (with the dim their sequence is at, counted from the front), constants and parameters."""
    inside = set(region)
    external: list = []
    for node in region:
        for parent in node.all_input_nodes:
            if parent not in inside and parent not in external:
                external.append(parent)
    chunked, consts, weights, chunk_dims = [], [], [], []
    for node in external:
        if node in params:
            weights.append(node)
            continue
        value = example(node)
        if value is None:
            fail(f"sequence_chunks: a decoder layer reads a non-tensor value ({node.format_node()}) computed outside it; "
                 f"re-plan with sequence_chunks=1", node)
        if value.dim() >= 2 and value.shape[-2] == s:
            chunked.append(node)
            chunk_dims.append(value.dim() - 2)
        elif s in tuple(value.shape):
            fail(f"sequence_chunks: a decoder layer reads {node.name} of shape {tuple(value.shape)}, with the "
                 f"sequence ({s} tokens) not at dim -2; re-plan with sequence_chunks=1", node)
        else:
            consts.append(node)
    if not chunked:
        fail("sequence_chunks: a decoder layer without a token-wise input", attn)
    return external, chunked, consts, weights, chunk_dims


def _layer_outputs(region: list, s: int) -> tuple[list, list]:
    """The region's nodes used after it (each must be token-wise) and their (shape, dtype, sequence dim)."""
    inside = set(region)
    outputs, out_specs = [], []
    for node in region:
        if any(user not in inside for user in node.users):
            value = example(node)
            if value is None or value.dim() < 2 or value.shape[-2] != s:
                fail(f"sequence_chunks: a decoder layer returns {node.name}, which is not a [..., {s}, ...] "
                     f"token-wise tensor; re-plan with sequence_chunks=1", node)
            outputs.append(node)
            out_specs.append((tuple(value.shape), value.dtype, value.dim() - 2))
    return outputs, out_specs


def _size_positions(region: list, s: int) -> dict:
    """For each node of the region that takes sizes: the positions of its size arguments that are the sequence."""
    positions = {}
    for node in region:
        if _sized(node):
            if any(key in node.kwargs for key in ("size", "shape")):
                fail("sequence_chunks: sizes given as keywords are not supported; re-plan with sequence_chunks=1", node)
            positions[node] = _seq_positions(node, s)
            if positions[node] is None:
                fail(f"sequence_chunks: {node.format_node()} has several sizes equal to the local length {s} and "
                     f"which one is the sequence cannot be told; pad the sequence to another length "
                     f"(pad_to_multiple_of) or re-plan with sequence_chunks=1", node)
    return positions


def _region_program(gm: fx.GraphModule, region: list, inputs: tuple, attn: fx.Node, qkv: tuple, outputs: list,
                    positions: dict, s: int, length: int) -> fx.GraphModule:
    """The region over a chunk of ``length`` tokens: every size argument equal to s becomes ``length``."""
    from autosp.compiler.chunked_layer import attend

    q, k, v, sinks = qkv
    sub = fx.Graph()
    env = {}
    for node in inputs:
        env[node] = sub.placeholder(node.name)
    for node in region:
        if node is attn:
            env[node] = sub.call_function(attend, (env[q], env[k], env[v], *((env[sinks],) if sinks else ())))
            continue
        copy = sub.node_copy(node, lambda n: env[n])
        if positions.get(node) and length != s:
            _resize(copy, positions[node], length)
        env[node] = copy
    sub.output(tuple(env[n] for n in outputs))
    return fx.GraphModule(gm, sub)


def _replace_region(graph: fx.Graph, region: list, external: list, outputs: list, args: tuple, attn: fx.Node) -> None:
    """One chunked-layer node (after the region's last input) in place of the region; its outputs' users read
    the node's items instead."""
    from autosp.compiler.chunked_layer import CHUNKED_LAYER

    inside = set(region)
    order = {n: i for i, n in enumerate(graph.nodes)}
    last_input = max(external, key=order.get)
    first_use = min((u for n in outputs for u in n.users if u not in inside), key=order.get)
    if order[last_input] > order[first_use]:
        fail("sequence_chunks: a decoder layer's output is used before all of its inputs exist", attn)
    with graph.inserting_after(last_input):
        node = graph.call_function(CHUNKED_LAYER, args)
    node.meta.update({k: v for k, v in attn.meta.items() if k in ("nn_module_stack", "stack_trace", "source_fn_stack")})
    anchor = node
    for index, out in enumerate(outputs):
        with graph.inserting_after(anchor):
            item = graph.call_function(operator.getitem, (node, index))
        item.meta.update({k: v for k, v in node.meta.items()})
        item.meta["example_value"] = item.meta["val"] = example(out)
        anchor = item
        out.replace_all_uses_with(item, delete_user_cb=lambda user: user not in inside)
    for dead in reversed(region):
        graph.erase_node(dead)


def _chunk_layer(gm: fx.GraphModule, ctx: SPContext, region: list, params: set, key_of) -> None:
    from autosp.compiler.attention.layout import chunk_sizes
    from autosp.compiler.chunked_layer import LayerProgram, register

    s = ctx.local_len
    attn = _the_attention(gm.graph, ctx, region)
    q, k, v, scale, returns_lse, rule, window, softcap, sinks = _attention_args(attn)
    external, chunked, consts, weights, chunk_dims = _layer_inputs(region, params, s, attn)
    outputs, out_specs = _layer_outputs(region, s)
    positions = _size_positions(region, s)
    cand = ctx.candidate
    program = LayerProgram(
        graph={length: _region_program(gm, region, (*chunked, *consts, *weights), attn, (q, k, v, sinks), outputs,
                                       positions, s, length)
               for length in set(chunk_sizes(s, cand.sequence_chunks))},
        chunk_dims=chunk_dims, outputs=out_specs,
        q_shape=tuple(example(q).shape), k_shape=tuple(example(k).shape), v_shape=tuple(example(v).shape),
        dtype=example(q).dtype, kv_dtype=example(k).dtype, scale=scale, chunks=cand.sequence_chunks,
        offload=cand.offload_chunks, global_len=ctx.global_len, ulysses=cand.ulysses, ring=cand.ring,
        ring_group=ctx.ring_group, returns_lse=returns_lse, local_len=s, rule=rule, window=window, softcap=softcap)
    key = register(program)
    _replace_region(gm.graph, region, external, outputs, (chunked, consts, weights, key), attn)
    ctx.stats.notes.append(f"chunked layer {key_of}: {len(chunked)} chunked input(s), {len(weights)} parameter(s), "
                           f"{cand.sequence_chunks} chunks")


def _propagate_shapes(gm: fx.GraphModule, example_inputs) -> None:
    """Fake values on every node (the earlier passes inserted nodes Dynamo never saw)."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        fakes = [mode.from_tensor(t) if isinstance(t, torch.Tensor) and not isinstance(
            t, torch._subclasses.FakeTensor) else t for t in example_inputs]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    for node in gm.graph.nodes:
        if "val" in node.meta and "example_value" in node.meta:
            node.meta["example_value"] = node.meta["val"]


def chunking_pass(gm: fx.GraphModule, example_inputs, ctx: SPContext) -> None:
    if ctx.candidate.sequence_chunks <= 1:
        return
    _propagate_shapes(gm, example_inputs)
    layers = _layers(gm, ctx)
    if not layers:
        return
    params = _parameters(gm, example_inputs)
    by_layer: dict = {}
    for node in gm.graph.nodes:  # graph order
        if node in layers:
            by_layer.setdefault(layers[node], []).append(node)
    attention = set(_attention_nodes(gm.graph))
    for index, region in sorted(by_layer.items()):
        if not attention & set(region):
            continue  # a fragment of a layer without its attention (cannot be chunked alone)
        _chunk_layer(gm, ctx, region, params, index)
        ctx.stats.layers_chunked += 1
    gm.graph.eliminate_dead_code()


__all__ = ["chunking_pass"]
