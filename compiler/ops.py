"""The collectives the SP graph calls, as custom ops.

Each op is a ``torch.library.custom_op``: opaque to Dynamo, AOTAutograd and Inductor (which call it as
an extern kernel), with a fake implementation for shape propagation and, where gradients flow, an
autograd formula. They take the process group by name (``ProcessGroup.group_name``) so the graph holds
only strings and ints.

- ``autosp_ops::all_to_all(x, scatter_dim, gather_dim, group)``: split ``x`` into P chunks along
  ``scatter_dim``, send chunk j to rank j, concatenate what arrives along ``gather_dim`` in rank order.
  Ulysses uses it as [B, H, s, d] (sequence-sharded) -> [B, H/P, S, d] (head-sharded) with
  scatter_dim=1, gather_dim=2, and the inverse for the attention output. Its gradient is the inverse
  all-to-all (the op is a permutation of elements across ranks).
- ``autosp_ops::all_reduce_sum(x, group)``: a sum over the group, returned as a new tensor. The loss pass
  uses it on detached statistics only, so it has no autograd formula (and needs none).

The namespace is ``autosp_ops``, not ``autosp``: DeepSpeed 0.19.8 registers its own
``autosp::all_to_all`` (deepspeed/compile/custom_ops/all_to_all.py, with a different group convention),
and two ``custom_op`` definitions of one name silently replace each other: whichever module is imported
last would run inside the other's graphs.

Every call increments a counter in :data:`CALLS`; the runtime compares them before and after each
forward to prove the compiled graph, not an eager fallback, ran the attention and the loss.
"""

from __future__ import annotations

import collections

import torch
import torch.distributed as dist

CALLS: collections.Counter = collections.Counter()
"""How many times each op ran in this process (forward and backward calls alike)."""


def _group(name: str):
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


def group_size(name: str) -> int:
    return dist.get_world_size(group=_group(name))


def _needs_fp32_transport(x: torch.Tensor) -> bool:
    # Gloo has no bfloat16/half all-to-all or all-reduce on every build; the values are exact in fp32.
    return x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16)


def _leading_ones(shape, dim: int) -> bool:
    return all(d == 1 for d in shape[:dim])


def _launch(op: str, x: torch.Tensor, scatter_dim: int, group: str, async_op: bool):
    """Start (or run) the exchange of ``x`` split along ``scatter_dim``: (work, send, recv), where ``recv``
    is [P, *chunk] and slot j holds what rank j sent."""
    CALLS["all_to_all"] += 1
    pg = _group(group)
    world = dist.get_world_size(group=pg)
    if x.shape[scatter_dim] % world:
        raise RuntimeError(f"autosp_ops::{op}: dim {scatter_dim} of size {x.shape[scatter_dim]} "
                           f"does not split over {world} ranks")
    if _needs_fp32_transport(x):
        x = x.float()
    chunk = list(x.shape)
    chunk[scatter_dim] //= world
    if not async_op and x.is_contiguous() and _leading_ones(x.shape, scatter_dim):
        # the P chunks are already consecutive blocks of x in rank order: send x itself (a blocking exchange
        # has finished reading it when this returns; an asynchronous one sends a copy, since the graph may
        # reuse x's memory while the exchange runs)
        send = x.view(world, *chunk)
    else:  # [P, *chunk]: chunk j goes to rank j.
        send = torch.stack(torch.tensor_split(x, world, dim=scatter_dim), dim=0).contiguous()
    recv = torch.empty_like(send)
    work = dist.all_to_all_single(recv, send, group=pg, async_op=async_op)
    return work, send, recv


@torch.library.custom_op("autosp_ops::all_to_all", mutates_args=())
def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: str) -> torch.Tensor:
    _, _, recv = _launch("all_to_all", x, scatter_dim, group, async_op=False)
    if _leading_ones(recv.shape[1:], gather_dim):
        # the slots are already the output's consecutive blocks along gather_dim: the receive buffer is the
        # output (a fresh tensor, so the op's output aliases nothing)
        shape = list(recv.shape[1:])
        shape[gather_dim] *= recv.shape[0]
        return recv.view(shape).to(x.dtype)
    return torch.cat(recv.unbind(0), dim=gather_dim).to(x.dtype)


@all_to_all.register_fake
def _all_to_all_fake(x, scatter_dim, gather_dim, group):
    world = group_size(group)
    shape = list(x.shape)
    shape[scatter_dim] //= world
    shape[gather_dim] *= world
    return x.new_empty(shape)


def _all_to_all_setup(ctx, inputs, output):
    _, scatter_dim, gather_dim, group = inputs
    ctx.scatter_dim, ctx.gather_dim, ctx.group = scatter_dim, gather_dim, group


def _all_to_all_backward(ctx, grad):
    return all_to_all(grad.contiguous(), ctx.gather_dim, ctx.scatter_dim, ctx.group), None, None, None


all_to_all.register_autograd(_all_to_all_backward, setup_context=_all_to_all_setup)


@torch.library.custom_op("autosp_ops::all_reduce_sum", mutates_args=())
def all_reduce_sum(x: torch.Tensor, group: str) -> torch.Tensor:
    CALLS["all_reduce_sum"] += 1
    dtype = x.dtype
    out = x.float().clone() if _needs_fp32_transport(x) else x.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=_group(group))
    return out.to(dtype)


@all_reduce_sum.register_fake
def _all_reduce_sum_fake(x, group):
    return torch.empty_like(x)


# --- asynchronous all-to-all: start / wait (the overlap schedules) ----------------------------------
#
# ``all_to_all_start(x, scatter_dim, gather_dim, group)`` launches the exchange without waiting
# (``dist.all_to_all_single(..., async_op=True)``) and returns its receive buffer, [P, *chunk]: slot j
# will hold what rank j sends. The buffer is not valid until ``all_to_all_wait`` consumed it:
# ``all_to_all_wait(recv, scatter_dim, gather_dim, group, dtype)`` waits for the exchange and
# concatenates the slots along ``gather_dim``. The pair equals ``all_to_all``; the passes put compute
# between the two nodes, and that compute overlaps the exchange.
#
# The in-flight exchanges live in ``_PENDING``, keyed by the receive buffer's storage address; the
# entry holds the work handle and the send and receive buffers, so neither is freed (or its memory
# reused) while the exchange runs. A wait whose buffer has no entry is an internal error (the graph
# copied the buffer between start and wait) and raises instead of reading an unfinished buffer.
#
# Autograd mirrors the pair, so the backward overlaps the same way without a graph pass. The gradient
# of the pair is the inverse all-to-all. The backward of ``wait`` (reached first, it is later in the
# forward) *starts* the inverse exchange of its output gradient and returns that in-flight receive
# buffer as the "gradient" of ``recv``; the backward of ``start`` (reached later, after the autograd
# engine ran whatever came between them in the forward, in reverse) waits for it and concatenates
# along ``scatter_dim``. The buffer handed between the two backward nodes is not the mathematical
# gradient of ``recv`` but the inverse exchange of it in flight: valid because ``recv`` has exactly one
# user (its wait), which the passes guarantee, and the two functions are only ever used as a pair.
_PENDING: dict = {}


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@torch.library.custom_op("autosp_ops::all_to_all_start", mutates_args=())
def all_to_all_start(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: str) -> torch.Tensor:
    work, send, recv = _launch("all_to_all_start", x, scatter_dim, group, async_op=True)
    _PENDING[_key(recv)] = (work, send, recv)
    return recv


@all_to_all_start.register_fake
def _all_to_all_start_fake(x, scatter_dim, gather_dim, group):
    world = group_size(group)
    shape = list(x.shape)
    shape[scatter_dim] //= world
    dtype = torch.float32 if _needs_fp32_transport(x) else x.dtype
    return x.new_empty([world, *shape], dtype=dtype)


@torch.library.custom_op("autosp_ops::all_to_all_wait", mutates_args=())
def all_to_all_wait(recv: torch.Tensor, scatter_dim: int, gather_dim: int, group: str,
                    dtype: torch.dtype) -> torch.Tensor:
    entry = _PENDING.pop(_key(recv), None)
    if entry is None:
        raise RuntimeError("autosp_ops::all_to_all_wait: no all-to-all in flight for this buffer (internal error: "
                           "the buffer between start and wait was copied or waited twice)")
    entry[0].wait()
    return torch.cat(recv.unbind(0), dim=gather_dim).to(dtype)


@all_to_all_wait.register_fake
def _all_to_all_wait_fake(recv, scatter_dim, gather_dim, group, dtype):
    shape = list(recv.shape[1:])
    shape[gather_dim] *= recv.shape[0]
    return recv.new_empty(shape, dtype=dtype)


def _start_setup(ctx, inputs, output):
    x, ctx.scatter_dim, ctx.gather_dim, ctx.group = inputs
    ctx.dtype = x.dtype


def _start_backward(ctx, grad_recv):
    # grad_recv is the inverse exchange that the wait's backward started: finish it.
    return all_to_all_wait(grad_recv, ctx.gather_dim, ctx.scatter_dim, ctx.group, ctx.dtype), None, None, None


def _wait_setup(ctx, inputs, output):
    _, ctx.scatter_dim, ctx.gather_dim, ctx.group, _ = inputs


def _wait_backward(ctx, grad):
    # start the inverse exchange; the start's backward waits for it (see the comment above)
    return all_to_all_start(grad.contiguous(), ctx.gather_dim, ctx.scatter_dim, ctx.group), None, None, None, None


all_to_all_start.register_autograd(_start_backward, setup_context=_start_setup)
all_to_all_wait.register_autograd(_wait_backward, setup_context=_wait_setup)


__all__ = ["CALLS", "all_reduce_sum", "all_to_all", "all_to_all_start", "all_to_all_wait", "group_size"]
