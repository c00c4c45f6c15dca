"""Activation checkpointing as a partition of the joint graph (plan knob ``checkpointing``).

The Dynamo passes (mask, positions, attention, loss, ...) rewrite the model graph; AOTAutograd then
traces the *joint* forward+backward graph at the aten level and a partitioner splits it into the forward
graph and the backward graph, deciding which forward values are saved for the backward and which the
backward recomputes. A checkpointing policy is exactly that decision, so it is applied there and nowhere
else: :class:`SPPartitioner` tags every forward node of every decoder layer of the joint graph with
``node.meta["recompute"]`` (:class:`torch.utils.checkpoint.CheckpointPolicy` ``MUST_SAVE`` or
``MUST_RECOMPUTE``) and ``node.meta["ac_graph_id"]`` (one id per layer), then runs torch's min-cut
partitioner (``min_cut_rematerialization_partition``), which honours the tags (they are what
``torch.utils.checkpoint`` under ``torch.compile`` produces too). The same partitioner object serves both
backends: ``aot_eager`` gets it as ``partition_fn``, Inductor as ``config.custom_partitioner_fn`` (after
Inductor's own joint-graph passes).

Decoder layers are read from the graph: a forward node belongs to the layer named by the outermost entry of
its ``nn_module_stack`` whose path ends in an integer index (``model.layers.3``: a child of an
``nn.ModuleList``); nodes the SP passes inserted without a module stack (the all-to-alls) take the layer of
their inputs. Under ZeRO-3 every layer is its own graph (the module stack then starts inside the layer):
a fragment graph with attention and no indexed module is one layer.

Policies (:data:`autosp.contract.specs.CHECKPOINTING_POLICIES`), per forward node of a layer:

==========  =====================================================  ==========================================
policy      MUST_SAVE (never recomputed)                           MUST_RECOMPUTE
==========  =====================================================  ==========================================
none        (no tags: torch's default min-cut partitioner)         -
selective   matmul outputs, attention outputs, collective outputs  norms, RoPE, SiLU, products, casts, copies
sequence    attention outputs, collective outputs                  everything else (projections, MLP, norms)
full        -                                                      everything (attention, all-to-alls too)
==========  =====================================================  ==========================================

In every policy a layer's boundary values (read by a later layer or by the code after the layers: the
residual stream) are MUST_SAVE, so each layer keeps its input and the backward of one layer never reaches
into another. Random ops (dropout) are never recomputed. What is *saved* is then whatever the backward
needs that may not be recomputed: under ``selective`` the layer input, q/k/v after their all-to-all, the
attention output and its logsumexp, the o_proj output and the MLP's gate/up outputs; under ``sequence`` the
layer input, q/k/v after their all-to-all, the attention output (both layouts) and its logsumexp; under
``full`` the layer input. Collectives are recomputed only under ``full``: each rank runs the same backward
graph, so the recomputed all-to-alls are issued in the same order everywhere.

``none`` is torch's default partitioner, unchanged: it already recomputes some cheap pointwise ops (RMSNorm
products, SiLU) instead of saving them when that is smaller; compiler/README.md gives the measured
difference to the cost model's "save everything" reading of ``none``.

Every partition is reported in ``ctx.stats.partitions`` (:class:`PartitionReport`): saved bytes per layer
(from the forward graph's saved outputs), saved bytes outside the layers, what was offloaded, and which
forward ops the backward graph recomputes (matmuls, attention, collectives).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field

import torch
from torch import fx
from torch.utils.checkpoint import CheckpointPolicy

from autosp.compiler.passes.saved import owner_layer, residual_shapes, saved_values
from autosp.contract.op_classes import KEEP_CLASSES, attention_kind, is_matmul
from autosp.contract.specs import CHECKPOINTING_POLICIES
from autosp.errors import UsageError

COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d_functional"})
COLLECTIVE_WORDS = ("all_to_all", "all_reduce", "all_gather", "reduce_scatter", "broadcast")
"""An op of the ``autosp_ops`` namespace whose name contains one of these is a collective (it moves data
between ranks, or starts/completes such a move: ``all_to_all_start``/``all_to_all_wait``): never recomputed
under ``selective``/``sequence``. Every ``_c10d_functional`` op is one too."""

_INDEXED = re.compile(r"(?:\.(\d+)|\[(\d+)\]|\['(\d+)'\]|\[\"(\d+)\"\])$")


# ---------------------------------------------------------------------------------------------------
# op classes
# ---------------------------------------------------------------------------------------------------
def _op_name(target) -> tuple[str, str]:
    """(namespace, op name) of an OpOverload / HigherOrderOperator target; ('', '') otherwise."""
    if isinstance(target, torch._ops.OpOverload):
        return target.namespace, target._opname
    if isinstance(target, torch._ops.HigherOrderOperator):
        return "higher_order", target.name()
    return "", ""


def op_class(node: fx.Node) -> str | None:
    """``collective``, ``attention``, ``matmul``, ``random``, ``view`` or ``other`` (None: not an op)."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:  # an output of a multi-output op is what that op is
        parent = node.args[0]
        return op_class(parent) if isinstance(parent, fx.Node) else "other"
    namespace, name = _op_name(node.target)
    if namespace == "higher_order" and name in _RNG_WRAPPERS:
        # functionalized RNG around a recomputed op (SDPA carries the nondeterministic_seeded tag):
        # run_and_save_rng_state(op, *args) in the forward, run_with_rng_state(state, op, *args) in the backward
        index = _RNG_WRAPPERS[name]
        return _class_of_target(node.args[index] if len(node.args) > index else None)
    cls = _class_of_target(node.target)
    if cls == "other" and isinstance(node.target, torch._ops.OpOverload):
        if torch.Tag.nondeterministic_seeded in node.target.tags:
            return "random"
        if _is_view(node):
            return "view"
    return cls


_RNG_WRAPPERS = {"run_and_save_rng_state": 0, "run_with_rng_state": 1}


def _class_of_target(target) -> str:
    namespace, name = _op_name(target)
    if namespace in COLLECTIVE_NAMESPACES or (namespace == "autosp_ops" and any(w in name for w in COLLECTIVE_WORDS)):
        return "collective"
    if namespace == "autosp_ops" and name.startswith("chunked_layer"):
        return "attention"  # a sequence-chunked layer: kept like attention, recomputed only under `full`
    if attention_kind(name):  # forward or backward kernel: the same tables as the graph-derived cost model
        return "attention"
    if is_matmul(name):
        return "matmul"
    return "other"


def _is_view(node: fx.Node) -> bool:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    return bool(schema.returns) and any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


# ---------------------------------------------------------------------------------------------------
# decoder layers
# ---------------------------------------------------------------------------------------------------
def block_path(node: fx.Node) -> str | None:
    """The module path of the decoder layer ``node`` was traced in: the outermost ``nn_module_stack`` entry
    whose path ends in an integer index (a child of an ``nn.ModuleList``); None if there is none."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    for value in stack.values():
        path = value[0] if isinstance(value, tuple) else str(value)
        if _INDEXED.search(path):
            return path
    return None


def _tangent_dependent(graph: fx.Graph) -> set:
    dependent = set()
    for node in graph.nodes:
        if node.op == "placeholder":
            if node.name.startswith("tangents"):
                dependent.add(node)
        elif any(arg in dependent for arg in node.all_input_nodes):
            dependent.add(node)
    return dependent


def forward_nodes(graph: fx.Graph) -> list:
    """The joint graph's forward ops: calls that do not depend on a tangent (incoming gradient)."""
    dependent = _tangent_dependent(graph)
    return [n for n in graph.nodes if n.op == "call_function" and n not in dependent]


def assign_layers(graph: fx.Graph, fwd: list, whole_graph_is_layer: bool = False) -> dict:
    """{forward node: layer index}, layers numbered in forward order. Nodes without a module stack (inserted
    by a pass) take the one layer their forward inputs belong to, else the one layer of their users."""
    if whole_graph_is_layer:
        return {n: 0 for n in fwd}
    fwd_set = set(fwd)
    order: dict[str, int] = {}
    layer: dict[fx.Node, int | None] = {}
    unknown = []
    for node in fwd:
        path = block_path(node)
        if path is not None:
            layer[node] = order.setdefault(path, len(order))
        elif node.meta.get("nn_module_stack"):
            layer[node] = None               # traced in a module outside the layers
        else:
            unknown.append(node)
    if not order:
        return {}
    for node in unknown:                     # topological order: inputs are settled first
        found = {layer.get(i) for i in node.all_input_nodes if i in fwd_set and i in layer}
        found.discard(None)
        if len(found) == 1:
            layer[node] = found.pop()
    for node in reversed(unknown):
        if node in layer:
            continue
        found = {layer.get(u) for u in node.users if u in fwd_set and u in layer}
        found.discard(None)
        layer[node] = found.pop() if len(found) == 1 else None
    return {n: i for n, i in layer.items() if i is not None}


def _has_attention(fwd: list) -> bool:
    return any(op_class(n) == "attention" for n in fwd)


# ---------------------------------------------------------------------------------------------------
# tagging
# ---------------------------------------------------------------------------------------------------
def _save(node: fx.Node) -> None:
    """MUST_SAVE ``node``; for a view, its base (views are never saved, they are recomputed from it)."""
    seen = set()
    while op_class(node) == "view" and node.all_input_nodes and node not in seen:
        seen.add(node)
        base = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else node.all_input_nodes[0]
        if base.op != "call_function":
            return
        node = base
    if "recompute" not in node.meta:
        return
    if isinstance(node.meta.get("val"), (tuple, list)):  # a multi-output op: its outputs are what is saved
        for user in node.users:
            if user.target is operator.getitem and "recompute" in user.meta:
                user.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        return
    node.meta["recompute"] = CheckpointPolicy.MUST_SAVE


def tag_joint_graph(graph: fx.Graph, policy: str, *, fragments: bool = False) -> dict:
    """Tag the forward nodes of every decoder layer for ``policy``; return {node: layer} (empty: none found).

    The tags are ``node.meta['recompute']`` and ``node.meta['ac_graph_id']`` (layer index + 1) read by
    ``min_cut_rematerialization_partition``; every tagged node also gets ``node.meta['autosp_layer']``.
    """
    if policy not in CHECKPOINTING_POLICIES:
        raise UsageError(f"unknown checkpointing policy {policy!r}; one of {', '.join(CHECKPOINTING_POLICIES)}")
    fwd = forward_nodes(graph)
    for node in fwd:
        node.meta["autosp_fwd"] = True
    layers = assign_layers(graph, fwd)
    if not layers and fragments and _has_attention(fwd):
        layers = assign_layers(graph, fwd, whole_graph_is_layer=True)
    for node, index in layers.items():
        node.meta["autosp_layer"] = index
    if policy == "none" or not layers:
        return layers
    keep = KEEP_CLASSES[policy]
    fwd_set = set(fwd)
    for node, index in layers.items():
        cls = op_class(node)
        must_save = cls == "random" or cls in keep
        node.meta["recompute"] = CheckpointPolicy.MUST_SAVE if must_save else CheckpointPolicy.MUST_RECOMPUTE
        node.meta["ac_graph_id"] = index + 1
    # boundaries: a value read by another layer or by the code after the layers is kept, never recomputed
    for node, index in layers.items():
        if any(u in fwd_set and layers.get(u) != index for u in node.users):
            _save(node)
    return layers


# ---------------------------------------------------------------------------------------------------
# the partitioner
# ---------------------------------------------------------------------------------------------------
def _nbytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return 0
    numel = val.numel()
    if not isinstance(numel, int):  # a data-dependent size (an RNG state): its size hint
        numel = getattr(getattr(numel, "node", None), "hint", None) or 0
    return int(numel) * val.element_size()


@dataclass
class PartitionReport:
    """What the partitioner decided for one compiled graph (sizes at this graph's static shapes)."""

    policy: str
    offload: bool
    layers: int                                    # decoder layers in this graph
    saved_by_layer: list = field(default_factory=list)  # bytes of the saved activations each layer owns
    saved_outside: int = 0                         # saved activations outside the layers (head, loss, embeddings)
    saved_params: int = 0                          # parameters/buffers the backward reads (not activations)
    saved_count: int = 0
    offloaded: int = 0                             # bytes the forward copies to host memory
    recomputed: dict = field(default_factory=dict)  # op class -> forward ops the backward graph recomputes
    backward_matmuls: int = 0
    forward_matmuls: int = 0

    @property
    def saved_layers(self) -> int:
        return sum(self.saved_by_layer)


def describe(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, static_names: set, policy: str,
             offload: bool, n_layers: int) -> PartitionReport:
    report = PartitionReport(policy=policy, offload=offload, layers=n_layers, saved_by_layer=[0] * n_layers)
    shapes = residual_shapes(fw, num_fwd_outputs)
    for node in saved_values(fw, num_fwd_outputs):
        size = _nbytes(node)
        report.saved_count += 1
        if node.op == "placeholder" and node.name in static_names:
            report.saved_params += size
            continue
        owner = owner_layer(node, shapes)
        if owner is None or owner >= n_layers:
            report.saved_outside += size
        else:
            report.saved_by_layer[owner] += size
    recomputed: dict[str, int] = {}
    for node in bw.graph.nodes:
        cls = op_class(node)
        if cls == "matmul":
            report.backward_matmuls += 1
        replayed = _op_name(node.target) == ("higher_order", "run_with_rng_state")  # a recompute by definition
        if (node.meta.get("autosp_fwd") or replayed) and cls not in (None, "view") and node.target is not operator.getitem:
            recomputed[cls] = recomputed.get(cls, 0) + 1
    report.recomputed = recomputed
    report.forward_matmuls = sum(1 for n in fw.graph.nodes if op_class(n) == "matmul")
    return report


try:  # Inductor's hook for a custom partitioner (torch >= 2.9)
    from torch._inductor.custom_graph_pass import CustomPartitionerFn as _PartitionerBase
except ImportError:  # pragma: no cover - older torch
    _PartitionerBase = object


class SPPartitioner(_PartitionerBase):
    """Tag the joint graph for the context's checkpointing policy, run torch's min-cut partitioner, then (with
    ``offload_activations``) move the layers' saved activations to host memory (:mod:`.offload`)."""

    def __init__(self, ctx):
        self.ctx = ctx

    def __call__(self, joint: fx.GraphModule, joint_inputs, *, num_fwd_outputs: int,
                 static_lifetime_input_indices=None, compiler: str = "inductor", **kwargs):
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        policy = self.ctx.candidate.checkpointing
        offload = bool(self.ctx.candidate.offload_activations)
        layers = tag_joint_graph(joint.graph, policy, fragments=self.ctx.fragments)
        n_layers = max(layers.values()) + 1 if layers else 0
        primals = [n for n in joint.graph.find_nodes(op="placeholder") if n.name.startswith("primals")]
        static_names = {primals[i].name for i in (static_lifetime_input_indices or []) if i < len(primals)}
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, compiler=compiler,
                                                     num_fwd_outputs=num_fwd_outputs,
                                                     static_lifetime_input_indices=static_lifetime_input_indices,
                                                     **kwargs)
        report = describe(fw, bw, num_fwd_outputs, static_names, policy, offload, n_layers)
        if offload and n_layers:
            from autosp.compiler.passes.offload import offload_saved_activations

            report.offloaded = offload_saved_activations(fw, bw, num_fwd_outputs, n_layers, static_names)
        self.ctx.stats.partitions.append(report)
        return fw, bw

    def uuid(self):
        return None  # the partition depends on the engine's plan: never reuse a cached compile


__all__ = ["KEEP_CLASSES", "PartitionReport", "SPPartitioner", "assign_layers", "block_path", "describe",
           "forward_nodes", "op_class", "tag_joint_graph"]
