"""Check pass: prove the rewritten graph has the SP shape, or say exactly what is wrong.

- every ``scaled_dot_product_attention`` takes its q, k, v from ``autosp_ops::all_to_all`` and hands its
  output to one, with no mask and ``is_causal=True``; with a ring (``ring`` > 1) no SDPA is left:
  each is an ``autosp_ops::ring_attention`` whose output is used, wrapped the same way when there are
  Ulysses ranks; with packed documents or sliding windows and no ring, each is an
  ``autosp_ops::span_attention`` wrapped the same way;
- no s x s mask is left (a tensor computed from booleans, not from the weights: a mask the mask pass
  did not remove), and no matmul of two activations produces one (attention computed by hand instead of by
  SDPA: the all-to-alls would never see it);
- in a whole-model graph (ZeRO 0-2, compiled with ``fullgraph=True``, so Dynamo itself reports any graph
  break with its op and source line) there must be attention (the loss pass already insists on a loss).

Under ZeRO-3 the module hooks split the model into many graphs; a graph without attention that builds a
mask and hands it over a graph break cannot see its consumer, so that case is a note, not an error (the
consumer's SDPA verifies the mask it receives; the mask is built at the local length s, never at S). The runtime's per-forward op counters close the remaining gap: the loss
all-reduce must run exactly once, and the all-to-alls (and ring attention, with a ring) at least once per
forward.
"""

from __future__ import annotations

import torch
from torch import fx

from autosp.compiler.context import SPContext
from autosp.compiler.passes.attention import RING, SPAN, ring_wrapped, wrapped
from autosp.compiler.passes.common import SDPA, SDPA_ARGS, SDPA_DEFAULTS, example, fail, is_call, normalized, where
from autosp.contract.op_classes import is_matmul


def _product_of_two(node: fx.Node) -> bool:
    """A matmul (torch.matmul, ``@``, bmm, einsum, ...: the shared table of matmul ops) of two graph values;
    linear and convolution multiply by a layer's weight by construction."""
    name = getattr(node.target, "__name__", "")
    return is_matmul(name) and name not in ("linear", "convolution") and len(node.all_input_nodes) >= 2


def _param_placeholders(gm: fx.GraphModule, example_inputs) -> set:
    return {n for n, v in zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs)
            if isinstance(v, torch.nn.Parameter)}


def _descendants(gm: fx.GraphModule, roots: set) -> set:
    """``roots`` and every node computed from one of them: one pass in graph (topological) order, so
    each edge is looked at once. (A walk back from each node without remembering what it already queued
    enumerates paths, not nodes: exponential in a residual stream.)"""
    reached = set()
    for node in gm.graph.nodes:
        if node in roots or any(p in reached for p in node.all_input_nodes):
            reached.add(node)
    return reached


def check_pass(gm: fx.GraphModule, example_inputs, ctx: SPContext) -> None:
    s = ctx.local_len
    sdpa = [n for n in gm.graph.nodes if is_call(n, SDPA)]
    rings = [n for n in gm.graph.nodes if is_call(n, {RING, SPAN})]
    for node in sdpa:
        if ctx.candidate.ring > 1 or ctx.rule:
            fail("internal: attention left without ring or span-restricted attention", node)
        args = normalized(node, SDPA_ARGS, SDPA_DEFAULTS)
        if not wrapped(node) or args["attn_mask"] is not None or not args["is_causal"]:
            fail("internal: attention left without its all-to-alls", node)
    for node in rings:
        if not ring_wrapped(node, ulysses=ctx.candidate.ulysses > 1 or ctx.candidate.ring == 1):
            fail("internal: ring attention left without its all-to-alls", node)
    if not ctx.fragments:
        if not sdpa and not rings:
            fail("no attention found: the model must call torch.nn.functional.scaled_dot_product_attention "
                 "(for Hugging Face models load them with attn_implementation='sdpa')")
    params = _param_placeholders(gm, example_inputs)
    noted = False
    square = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr") and s >= 2
              and example(n) is not None and example(n).dim() >= 2 and tuple(example(n).shape[-2:]) == (s, s)]
    if not square:
        return
    for node in square:
        if node.op == "call_function" and _product_of_two(node) \
                and not any(p in params for p in node.all_input_nodes):
            fail(f"attention computed outside scaled_dot_product_attention ({s} x {s} scores); use SDPA "
                 f"(Hugging Face: attn_implementation='sdpa')", node)
    # Which (s x s) tensors are masks: computed from booleans and not from the weights. A tensor that is
    # s x s only by coincidence (logits when the vocabulary equals s, an MLP activation when its width
    # does) comes from the weights; each dependence is computed once for the whole graph.
    from_weights = _descendants(gm, params)
    bools = {n for n in gm.graph.nodes if example(n) is not None and example(n).dtype == torch.bool}
    from_bools = _descendants(gm, bools)
    for node in square:
        value = example(node)
        if node in from_weights:
            continue
        if value.dtype != torch.bool and node not in from_bools:
            continue  # e.g. a rotary table whose head_dim happens to equal s
        if ctx.fragments and not sdpa and not rings:  # a mask built here and handed over a graph break
            if not noted:
                noted = True
                ctx.stats.notes.append(f"a {s} x {s} mask is built at {where(node)} and crosses a graph break "
                                       f"(built at the local length s, verified where SDPA receives it)")
            continue
        fail(f"an {s} x {s} tensor is left in the graph (an attention mask the compiler could not remove)", node)


__all__ = ["check_pass"]
