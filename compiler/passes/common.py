"""Helpers the passes share: matching ops in a Dynamo FX graph, naming source lines, evaluating a
subgraph on the example inputs."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import fx

from autosp.errors import UsageError

from autosp.compiler.sinks import SINK_SDPA  # noqa: E402  (registers autosp_ops::sink_sdpa)
from autosp.compiler.softcapping import CAPPED_SDPA  # noqa: E402  (registers autosp_ops::capped_sdpa)

# SDPA, Gemma 2's soft-capped attention with SDPA's signature plus ``softcap`` (compiler/softcapping.py) and
# gpt-oss's attention with SDPA's signature plus ``sinks`` (compiler/sinks.py)
SDPA = {torch._C._nn.scaled_dot_product_attention, F.scaled_dot_product_attention, CAPPED_SDPA, SINK_SDPA}
CROSS_ENTROPY = {F.cross_entropy}
NLL_LOSS = {F.nll_loss}
LOG_SOFTMAX = {F.log_softmax, torch.log_softmax}
PAD = {F.pad, torch._C._nn.pad}
EMBEDDING = {F.embedding, torch.embedding}
ARANGE = {torch.arange}

# SDPA's signature: (query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
# enable_gqa=False)
SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
# cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)
CE_ARGS = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing")
CE_DEFAULTS = {"weight": None, "size_average": None, "ignore_index": -100, "reduce": None, "reduction": "mean",
               "label_smoothing": 0.0}


def is_call(node: fx.Node, targets) -> bool:
    return node.op == "call_function" and node.target in targets


def is_method(node: fx.Node, *names: str) -> bool:
    return node.op == "call_method" and node.target in names


def normalized(node: fx.Node, names, defaults) -> dict:
    """The call's arguments by name, defaults filled in."""
    out = dict(defaults)
    for name, value in zip(names, node.args):
        out[name] = value
    out.update(node.kwargs)
    return out


def set_named_args(node: fx.Node, names, **values) -> None:
    """Rewrite some arguments of a call, wherever (args or kwargs) they were passed."""
    args, kwargs = list(node.args), dict(node.kwargs)
    for key, value in values.items():
        index = names.index(key)
        if index < len(args):
            args[index] = value
        else:
            kwargs[key] = value
    node.args, node.kwargs = tuple(args), kwargs


def example(node) -> torch.Tensor | None:
    """The fake tensor Dynamo recorded for ``node`` (None when it is not a tensor)."""
    if not isinstance(node, fx.Node):
        return None
    value = node.meta.get("example_value", node.meta.get("val"))
    return value if isinstance(value, torch.Tensor) else None


def shape(node) -> tuple | None:
    value = example(node)
    return None if value is None else tuple(value.shape)


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


def where(node: fx.Node) -> str:
    """``file:line (function): code`` of the user code that produced ``node``."""
    trace = node.meta.get("stack_trace") or ""
    frames = _FRAME.findall(trace)
    if not frames:
        return f"graph node {node.name}"
    path, line, func, code = frames[-1]
    return f"{path}:{line} ({func}): {code.strip()}"


def op_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return f".{target}()"
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)


def fail(message: str, node: fx.Node | None = None) -> None:
    suffix = f" [{op_name(node)} at {where(node)}]" if node is not None else ""
    raise UsageError(message + suffix)


def ancestors(node: fx.Node) -> set:
    seen, stack = set(), [node]
    while stack:
        current = stack.pop()
        for parent in current.all_input_nodes:
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def placeholders(gm: fx.GraphModule) -> list:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def evaluate(gm: fx.GraphModule, target: fx.Node, example_inputs) -> object:
    """Run the part of ``gm`` that ``target`` depends on, on the real example inputs."""
    needed = ancestors(target) | {target}
    values = dict(zip(placeholders(gm), example_inputs))
    graph, mapping, inputs = fx.Graph(), {}, []
    for node in gm.graph.nodes:
        if node not in needed:
            continue
        if node.op == "placeholder":
            value = values[node]
            if isinstance(value, torch._subclasses.FakeTensor):
                raise UsageError("cannot verify the attention mask: Dynamo passed fake example inputs")
            mapping[node] = graph.placeholder(node.name)
            inputs.append(value)
        else:
            mapping[node] = graph.node_copy(node, lambda n: mapping[n])
    graph.output(mapping[target])
    sub = fx.GraphModule(gm, graph)
    with torch.no_grad():
        return sub(*inputs)


__all__ = ["ARANGE", "CE_ARGS", "CE_DEFAULTS", "CROSS_ENTROPY", "EMBEDDING", "LOG_SOFTMAX", "NLL_LOSS", "PAD", "SDPA",
           "SDPA_ARGS", "SDPA_DEFAULTS", "ancestors", "evaluate", "example", "fail", "is_call", "is_method",
           "normalized", "op_name", "placeholders", "set_named_args", "shape", "where"]


def add_matmul_into(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` for the tiled ops' weight gradients: one GEMM adding into ``acc`` when the dtypes agree (no
    product tensor); under autocast (16-bit chunks, fp32 weights) the product is made and added."""
    if a.dtype == acc.dtype and b.dtype == acc.dtype:
        acc.addmm_(a, b)
    else:
        acc.add_(a.mm(b))
