"""What a partitioned forward graph saves for the backward, and which decoder layer owns each saved value:
read by the checkpointing report (:mod:`.checkpointing`) and by the activation offload (:mod:`.offload`),
which moves the layers' saved values to host memory."""

from __future__ import annotations

import torch
from torch import fx


def saved_values(fw: fx.GraphModule, num_fwd_outputs: int) -> list:
    """The forward graph's outputs that the backward reads (tensors only, in order)."""
    out = fw.graph.find_nodes(op="output")[0]
    return [n for n in out.args[0][num_fwd_outputs:]
            if isinstance(n, fx.Node) and isinstance(n.meta.get("val"), torch.Tensor)]


def owner_layer(node: fx.Node, residual_shapes=frozenset()) -> int | None:
    """The decoder layer a saved value belongs to (None: outside the layers).

    A value produced in layer i belongs to the last layer among i and its forward readers (a layer's output
    read by the next layer is that layer's input); read by the code after the layers (the last layer's
    output: the final norm's input) it belongs to index i + 1, past the last layer. A value produced outside
    the layers and read by exactly one layer is that layer's input (the embedding output for the first
    layer), unless it is a graph input that is not the residual stream (``residual_shapes``: the shapes of
    the graph's outputs): under ZeRO-3 each layer is a graph whose inputs are the hidden states and the
    rotary tables every layer shares. Values read by several layers (the rotary tables) are outside.
    """
    producer = node.meta.get("autosp_layer")
    readers, outside = set(), False
    for user in node.users:
        if user.op != "call_function" or not user.meta.get("autosp_fwd"):
            continue
        layer = user.meta.get("autosp_layer")
        if layer is None:
            outside = True
        else:
            readers.add(layer)
    if producer is not None:
        return max(readers | {producer} | ({producer + 1} if outside else set()))
    if len(readers) != 1:
        return None
    if node.op == "placeholder":
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or tuple(val.shape) not in residual_shapes:
            return None
    return readers.pop()


def residual_shapes(fw: fx.GraphModule, num_fwd_outputs: int) -> frozenset:
    """Shapes of the forward graph's real outputs (a ZeRO-3 layer graph returns the residual stream)."""
    out = fw.graph.find_nodes(op="output")[0]
    return frozenset(tuple(n.meta["val"].shape) for n in out.args[0][:num_fwd_outputs]
                     if isinstance(n, fx.Node) and isinstance(n.meta.get("val"), torch.Tensor))


__all__ = ["owner_layer", "residual_shapes", "saved_values"]
