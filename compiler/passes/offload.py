"""Activation offload (plan knob ``offload_activations``): the layers' saved activations live in host memory
between their forward and their backward.

A pass over the two graphs the partitioner produced (:class:`~autosp.compiler.passes.checkpointing.SPPartitioner`
calls it right after partitioning): a saved activation is a forward-graph output and a backward-graph input
of the same name. For every saved activation that belongs to a decoder layer (its producer or a forward
reader is in the layer: the layer's input included; parameters and values outside the layers stay):

forward graph::

    x = ...                                    # produced as before
    h = autosp_ops.offload(x)                  # right after x: device -> host copy starts
    ...                                        # the rest of this layer and the next one
    h = autosp_ops.offload_wait(h, x)          # at the end of the next layer (or of the graph)
    return (..., h, ...)                       # the host copy is what autograd keeps

backward graph::

    h (placeholder, host)
    d = autosp_ops.reload(h, device, size, stride)   # when the layer after it starts its backward
    ...                                              # that layer's backward
    d = autosp_ops.reload_wait(d)                    # just before the first use
    ... uses of d ...

On CUDA the copies run on one side stream into pinned host buffers: ``offload``/``reload`` only enqueue
the copy (after the compute stream's work so far) and record an event; the ``*_wait`` op makes the compute
stream wait for that event. ``offload_wait`` takes the device tensor as an argument so the graph (Inductor's
buffer reuse included) keeps it alive until its copy is done; the device copy of a layer's activations is
released one layer later, and the backward prefetches one layer ahead, so about two layers' worth are on the
device at a time (the cost model's assumption). On a CPU device the same graph runs: ``offload`` and
``reload`` make real copies into separate tensors and the waits do nothing — exactness is testable, but
host and device are the same memory, so nothing is saved there.

``autosp_ops.OFFLOADED`` counts the bytes each ``offload`` moved (the runtime's evidence that it ran);
:func:`is_host_copy` tells a measurement which saved tensors are the host copies.
"""

from __future__ import annotations

import collections
import weakref

import torch
from torch import fx

from autosp.compiler.passes.saved import owner_layer, residual_shapes, saved_values

OFFLOADED: collections.Counter = collections.Counter()
"""Bytes moved by ``offload`` (key ``"bytes"``) and ``reload`` (key ``"reload_bytes"``), calls (``"calls"``)."""

_HOST_COPIES: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
HOST_KEPT_OUTPUTS: dict = {}
"""``autosp_ops::chunked_layer`` programs with ``offload_chunks``: key -> index of the op's first output that the
op itself keeps in host memory (filled by :func:`autosp.compiler.chunked_layer.register`)."""
_PENDING: dict = {}          # data_ptr of an offload/reload output -> (CUDA event of its copy, device)
_STREAMS: dict = {}          # device -> side stream for the copies


def is_host_copy(t: torch.Tensor) -> bool:
    """Is ``t`` (a view of) a host copy ``offload`` made?"""
    try:
        ptr = t.untyped_storage().data_ptr()
    except RuntimeError:
        return False
    return ptr in _HOST_COPIES


def _side_stream(device: torch.device):
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device=device)
    return _STREAMS[device]


def _copy(dst: torch.Tensor, src: torch.Tensor, device: torch.device) -> None:
    """``dst.copy_(src)``; on CUDA enqueued on the side stream after the compute stream's work so far (``dst``
    may have been allocated there), with an event the matching ``*_wait`` op makes the compute stream wait for."""
    if device.type != "cuda":
        dst.copy_(src)
        return
    stream = _side_stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        dst.copy_(src, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
    _PENDING[dst.data_ptr()] = (event, device)


# --- ops -------------------------------------------------------------------------------------------
@torch.library.custom_op("autosp_ops::offload", mutates_args=())
def offload(x: torch.Tensor) -> torch.Tensor:
    """A contiguous host copy of ``x`` (CUDA: pinned, copied asynchronously on the side stream)."""
    host = torch.empty(x.shape, dtype=x.dtype, device="cpu", pin_memory=x.device.type == "cuda")
    _copy(host, x, x.device)
    _HOST_COPIES[host.untyped_storage().data_ptr()] = host
    OFFLOADED["bytes"] += host.numel() * host.element_size()
    OFFLOADED["calls"] += 1
    return host


@offload.register_fake
def _offload_fake(x):
    return torch.empty(x.shape, dtype=x.dtype, device="cpu")


@torch.library.custom_op("autosp_ops::reload", mutates_args=())
def reload(host: torch.Tensor, device: torch.device, size: list[int], stride: list[int]) -> torch.Tensor:
    """A device tensor of the given size and stride holding ``host`` (CUDA: copied asynchronously)."""
    out = torch.empty_strided(size, stride, dtype=host.dtype, device=device)
    _copy(out, host, out.device)
    OFFLOADED["reload_bytes"] += out.numel() * out.element_size()
    return out


@reload.register_fake
def _reload_fake(host, device, size, stride):
    return torch.empty_strided(size, stride, dtype=host.dtype, device=device)


# The waits return their first argument (an alias), which torch.library.custom_op does not allow: define
# them with an aliasing schema.
_lib = torch.library.Library("autosp_ops", "FRAGMENT")
_lib.define("offload_wait(Tensor(a) host, Tensor keepalive) -> Tensor(a)")
_lib.define("reload_wait(Tensor(a) x) -> Tensor(a)")


def _wait_for(t: torch.Tensor) -> None:
    pending = _PENDING.pop(t.data_ptr(), None)
    if pending is not None:
        event, device = pending
        torch.cuda.current_stream(device).wait_event(event)


@torch.library.impl("autosp_ops::offload_wait", "CompositeExplicitAutograd")
def _offload_wait(host: torch.Tensor, keepalive: torch.Tensor) -> torch.Tensor:
    _wait_for(host)  # after this the compute stream may reuse keepalive's memory
    return host


@torch.library.register_fake("autosp_ops::offload_wait")
def _offload_wait_fake(host, keepalive):
    return host


@torch.library.impl("autosp_ops::reload_wait", "CompositeExplicitAutograd")
def _reload_wait(x: torch.Tensor) -> torch.Tensor:
    _wait_for(x)
    return x


@torch.library.register_fake("autosp_ops::reload_wait")
def _reload_wait_fake(x):
    return x


OFFLOAD = torch.ops.autosp_ops.offload.default
RELOAD = torch.ops.autosp_ops.reload.default
OFFLOAD_WAIT = torch.ops.autosp_ops.offload_wait.default
RELOAD_WAIT = torch.ops.autosp_ops.reload_wait.default


# --- the pass --------------------------------------------------------------------------------------
def _fake(like: torch.Tensor, make):
    """``make()`` under the fake mode ``like`` belongs to (graph metadata must hold fake tensors)."""
    mode = getattr(like, "fake_mode", None)
    if mode is None:
        return make()
    with mode:
        return make()


def _set_val(node: fx.Node, val: torch.Tensor) -> None:
    from torch._subclasses.fake_tensor import extract_tensor_metadata

    node.meta["val"] = val
    node.meta["tensor_meta"] = extract_tensor_metadata(val)


def _offloaded_by_chunked_layer(node: fx.Node) -> bool:
    """An output of ``autosp_ops::chunked_layer`` that the op itself kept in host memory (``offload_chunks``)."""
    import operator

    if node.op != "call_function" or node.target is not operator.getitem:
        return False
    parent = node.args[0]
    if not isinstance(parent, fx.Node) or getattr(parent.target, "_opname", None) != "chunked_layer":
        return False
    first = HOST_KEPT_OUTPUTS.get(parent.args[-1])
    return first is not None and node.args[1] >= first


def offload_saved_activations(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, n_layers: int,
                              static_names: set = frozenset()) -> int:
    """Rewrite ``fw``/``bw`` (see the module docstring); return the bytes offloaded per forward."""
    fw_graph, bw_graph = fw.graph, bw.graph
    fw_nodes = list(fw_graph.nodes)
    fw_index = {n: i for i, n in enumerate(fw_nodes)}
    fw_output = fw_graph.find_nodes(op="output")[0]
    last_placeholder = max((n for n in fw_nodes if n.op == "placeholder"), key=fw_index.get, default=None)
    layer_end: dict[int, fx.Node] = {}
    for node in fw_nodes:
        layer = node.meta.get("autosp_layer")
        if layer is not None and node.op == "call_function":
            layer_end[layer] = node

    chosen = []
    shapes = residual_shapes(fw, num_fwd_outputs)
    for node in saved_values(fw, num_fwd_outputs):
        if node.op == "placeholder" and node.name in static_names:
            continue  # parameters and buffers
        val = node.meta["val"]
        if not val.is_floating_point():
            continue
        if _offloaded_by_chunked_layer(node):
            continue  # sequence-chunked layer with offload_chunks: already a host copy
        owner = owner_layer(node, shapes)
        if owner is None or owner >= n_layers:
            continue  # outside the layers (embedding side, final norm, head, loss): stays on the device
        chosen.append((node, owner))
    if not chosen:
        return 0

    # forward: copy out right after the value exists, wait at the end of the next layer (or the graph)
    replaced = {}
    total = 0
    for node, owner in chosen:
        val = node.meta["val"]
        anchor = node if node.op != "placeholder" else last_placeholder
        with fw_graph.inserting_after(anchor):
            host = fw_graph.call_function(OFFLOAD, (node,))
        _set_val(host, _fake(val, lambda: torch.empty(val.shape, dtype=val.dtype, device="cpu")))
        readers = [u for u in node.users if u is not fw_output and u is not host]
        candidates = [layer_end[owner + 1]] if owner + 1 in layer_end else []
        candidates += readers
        after = max(candidates, key=fw_index.get, default=None)
        if after is None or fw_index.get(after, -1) < fw_index.get(anchor, -1):
            after = host
        with fw_graph.inserting_after(after):
            done = fw_graph.call_function(OFFLOAD_WAIT, (host, node))
        _set_val(done, host.meta["val"])
        replaced[node] = (done, val)
        total += val.numel() * val.element_size()
    outputs = list(fw_output.args[0])
    fw_output.args = (tuple(replaced[n][0] if n in replaced else n for n in outputs),) + fw_output.args[1:]
    fw_graph.lint()
    fw.recompile()

    # backward: the saved activation arrives as a host tensor; reload one layer ahead of its first use
    by_name = {n.name: n for n in bw_graph.find_nodes(op="placeholder")}
    bw_nodes = list(bw_graph.nodes)
    bw_index = {n: i for i, n in enumerate(bw_nodes)}
    first_real = next((n for n in bw_nodes if n.op != "placeholder"), None)
    targets = []
    for node, owner in chosen:
        ph = by_name.get(node.name)
        if ph is None or not ph.users:
            raise RuntimeError(f"autosp offload: saved value {node.name} has no reader in the backward graph")
        first_use = min(ph.users, key=bw_index.get)
        targets.append((ph, owner, first_use, replaced[node][1]))
    group_start: dict[int, int] = {}
    for ph, owner, first_use, _ in targets:
        group_start[owner] = min(group_start.get(owner, len(bw_nodes)), bw_index[first_use])
    for ph, owner, first_use, val in targets:
        _set_val(ph, _fake(val, lambda: torch.empty(val.shape, dtype=val.dtype, device="cpu")))
        start = group_start.get(owner + 1)
        where = first_real if start is None else bw_nodes[min(start, bw_index[first_use])]
        if bw_index[where] > bw_index[first_use]:
            where = first_use
        with bw_graph.inserting_before(where):
            dev = bw_graph.call_function(RELOAD, (ph, val.device, list(val.shape), list(val.stride())))
        _set_val(dev, _fake(val, lambda: torch.empty_strided(val.shape, val.stride(), dtype=val.dtype,
                                                             device=val.device)))
        with bw_graph.inserting_before(first_use):
            ready = bw_graph.call_function(RELOAD_WAIT, (dev,))
        _set_val(ready, dev.meta["val"])
        for user in list(ph.users):
            if user is not dev:
                user.replace_input_with(ph, ready)
    bw_graph.lint()
    bw.recompile()
    return total


__all__ = ["OFFLOADED", "is_host_copy", "offload", "offload_saved_activations", "reload"]
