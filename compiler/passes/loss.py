"""Loss pass: undo the model's label shift and make the loss token-weighted over the whole world.

The runtime shifts labels over the *full* sequence before sharding (shifting inside a shard would lose
the P-1 targets at shard borders) and hands each rank its slice. The model, which does not know that,
shifts them again; this pass finds that shift on the path from the loss's target back to the labels
input and removes it:

- current HF style: ``pad(labels, (0, 1), value=ignore_index)[..., 1:]`` -> ``labels``;
- older style: ``logits[..., :-1, :]`` with ``labels[..., 1:]`` -> ``logits`` with ``labels``.

Then the mean over this rank's tokens is replaced by the exact global mean. With ``local_sum`` the sum
of this rank's token losses (``reduction='sum'``) and ``N`` the number of valid targets over every rank
of every SP and DP group (one all-reduce of [local_sum, local_count]):

    value = sum_over_world(local_sum) / N                 (= single-process full-batch loss)
    g     = W * local_sum / N                             (W = ranks DeepSpeed averages gradients over)
    loss  = g + (value - g).detach()

``loss`` has the global value and the gradient of ``g``; DeepSpeed averages gradients over all W
ranks, so the averaged gradient is sum_over_world(d local_sum) / N, the gradient of the single-process
loss. Per-rank means averaged over ranks would be wrong whenever ranks hold different numbers of valid
targets (padding, ignore_index).
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from autosp.compiler.context import SPContext
from autosp.compiler.passes.common import (
    CE_ARGS,
    CE_DEFAULTS,
    CROSS_ENTROPY,
    LOG_SOFTMAX,
    NLL_LOSS,
    PAD,
    fail,
    is_call,
    normalized,
    set_named_args,
)

ALL_REDUCE = torch.ops.autosp_ops.all_reduce_sum.default
_TRANSPARENT_METHODS = {"view", "reshape", "contiguous", "to", "flatten", "long", "clone", "int"}
_TRANSPARENT_FUNCTIONS = {torch.reshape, torch.flatten}


def _through_transparent(node):
    """Step back over reshapes, copies and dtype/device moves."""
    while isinstance(node, fx.Node) and (
            (node.op == "call_method" and node.target in _TRANSPARENT_METHODS)
            or (node.op == "call_function" and node.target in _TRANSPARENT_FUNCTIONS)):
        node = node.args[0]
    return node


def _slice_last(node, start, stop, ndim_before_last=0) -> bool:
    """Is ``node`` ``x[..., start:stop]`` (or ``x[..., start:stop, :]`` with ndim_before_last=1)?"""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is operator.getitem):
        return False
    index = node.args[1]
    if not isinstance(index, tuple):
        return False
    want = slice(start, stop, None)
    trailing = (slice(None, None, None),) * ndim_before_last
    if len(index) >= 2 + ndim_before_last and index[0] is Ellipsis and index[1] == want \
            and tuple(index[2:]) == trailing:
        return True
    # explicit leading slices: x[:, start:stop] / x[:, start:stop, :]
    body = index[: len(index) - ndim_before_last]
    if tuple(index[len(body):]) != trailing or not body:
        return False
    return body[-1] == want and all(i == slice(None, None, None) for i in body[:-1])


def _pad_args(node):
    args = list(node.args) + [None] * 4
    pad = node.kwargs.get("pad", args[1])
    mode = node.kwargs.get("mode", args[2] if args[2] is not None else "constant")
    value = node.kwargs.get("value", args[3] if args[3] is not None else 0)
    return pad, mode, value


def _remove_shift(loss: fx.Node, ignore_index: int, ctx: SPContext) -> fx.Node:
    """Rewire ``loss``'s target (and input, for the old style) to skip the model's shift; return the labels."""
    args = normalized(loss, CE_ARGS, CE_DEFAULTS)
    target = args["target"]
    node = _through_transparent(target)
    if _slice_last(node, 1, None) and is_call(_through_transparent(node.args[0]), PAD):
        pad_node = _through_transparent(node.args[0])
        pad, mode, value = _pad_args(pad_node)
        if tuple(pad) != (0, 1) or mode != "constant":
            fail("the model shifts labels with an unexpected pad", pad_node)
        if value != ignore_index:
            fail(f"the model pads shifted labels with {value}, but the loss ignores {ignore_index}", pad_node)
        labels = pad_node.args[0]
        node.replace_all_uses_with(labels)
        ctx.stats.label_shifts_removed += 1
        return _through_transparent(labels)
    if _slice_last(node, 1, None):
        labels = node.args[0]
        logits = _through_transparent(args["input"])
        if is_call(logits, LOG_SOFTMAX):  # nll_loss(log_softmax(logits[..., :-1, :]))
            logits = _through_transparent(logits.args[0])
        if not _slice_last(logits, None, -1, ndim_before_last=1):
            fail("the model shifts labels with labels[..., 1:] but its logits are not sliced with "
                 "logits[..., :-1, :]; cannot undo the shift", loss)
        logits.replace_all_uses_with(logits.args[0])
        node.replace_all_uses_with(labels)
        ctx.stats.label_shifts_removed += 1
        return _through_transparent(labels)
    fail("cannot find the model's label shift (pad(labels, (0, 1), value=ignore_index)[..., 1:] or "
         "labels[..., 1:] with logits[..., :-1, :]); autosp shifts labels over the full sequence itself and "
         "must remove the model's own shift", loss)


def loss_pass(gm: fx.GraphModule, example_inputs, ctx: SPContext) -> None:
    graph = gm.graph
    losses = [n for n in graph.nodes if is_call(n, CROSS_ENTROPY) or is_call(n, NLL_LOSS)]
    if not losses:
        if not ctx.fragments:
            fail("no loss found: the model must compute F.cross_entropy (or nll_loss of log_softmax) on its "
                 "labels inside forward()")
        return
    if len(losses) > 1:
        fail(f"{len(losses)} losses found; autosp supports one token-level cross-entropy per forward", losses[1])
    loss = losses[0]
    args = normalized(loss, CE_ARGS, CE_DEFAULTS)
    if args["reduction"] != "mean" or args["size_average"] is not None or args["reduce"] is not None:
        fail("the model's loss must use reduction='mean' (autosp replaces it by the exact global mean)", loss)
    if args["weight"] is not None:
        fail("class-weighted cross-entropy is not supported with sequence parallelism", loss)
    ignore_index = args["ignore_index"]
    if ignore_index != ctx.ignore_index:
        fail(f"the loss ignores {ignore_index} but the engine pads with ignore_index={ctx.ignore_index}; "
             f"pass ignore_index={ignore_index} to autosp.compile", loss)
    labels = _remove_shift(loss, ignore_index, ctx)
    if labels.op != "placeholder":
        fail("the loss's target is not the labels passed to the model", loss)
    set_named_args(loss, CE_ARGS, reduction="sum")
    target = normalized(loss, CE_ARGS, CE_DEFAULTS)["target"]
    new_nodes = []

    def call(fn, *args, method=False, **kwargs):
        n = graph.call_method(fn, args, kwargs) if method else graph.call_function(fn, args, kwargs)
        new_nodes.append(n)
        return n

    with graph.inserting_before(loss.next):  # keeps the new nodes in program order
        local_sum = call("float", loss, method=True)
        count = call("sum", call(operator.ne, target, ignore_index), method=True)
        stats = call(torch.stack, [call("detach", local_sum, method=True), call("float", count, method=True)])
        total = call(ALL_REDUCE, stats, ctx.world_group)
        n_valid = call(operator.getitem, total, 1)
        value = call(operator.truediv, call(operator.getitem, total, 0), n_valid)
        grad_path = call(operator.truediv, call(operator.mul, local_sum, float(ctx.grad_world_size)), n_valid)
        correction = call("detach", call(operator.sub, value, grad_path), method=True)
        out = call(operator.add, grad_path, correction)
    skip = set(new_nodes)
    loss.replace_all_uses_with(out, delete_user_cb=lambda user: user not in skip)
    ctx.stats.losses += 1
    graph.eliminate_dead_code()


__all__ = ["ALL_REDUCE", "loss_pass"]
