"""Ring attention over the ring process group, as custom ops with autograd.

``autosp_ops::ring_attention(q, k, v, scale, group, ranges, rule="", window=0, softcap=0, sinks=None) -> (out,
lse)``: causal
attention of this ring position's query block over the key/value blocks of every ring position; with
``rule`` (an engine's published packed documents, :mod:`.documents`) only within each document, with
``window`` > 0 only over the last ``window`` tokens (:mod:`.pieces`: documents cross ring blocks freely), with
``softcap`` > 0 on soft-capped scores (Gemma 2, :mod:`.capped`), with ``sinks`` (gpt-oss: the local heads' sink
logits) merged once after every block (:mod:`.sinks`). q [B, Hq, n, d], k and v
[B, Hkv, n, d] (grouped-query: Hq a multiple of Hkv, any Hkv including 1); ``ranges`` the global token
spans each ring position's block holds (:func:`~autosp.compiler.attention.layout.flat_ranges`), so the
op knows, for every (query block, key block) pair, which pieces attend (full, causal diagonal, or
nothing: :mod:`.pieces`), with no mask. out is in q's dtype, lse [B, Hq, n] float32.

Forward, on ring position r of R (blocks travel to the next position, r + 1)::

    step t = 0 .. R-1:   holds the k/v block of position (r - t) mod R
        start sending it to r + 1 and receiving the next one from r - 1   (t < R-1; async P2P)
        attend the local queries to the held block, merge by log-sum-exp  (overlaps the transfer)
        wait for the transfer

Backward (``autosp_ops::ring_attention_backward``), flash-attention style: each piece's backward runs with
the merged output and log-sum-exp saved by the forward, so nothing is recomputed but the pieces' scores.
The dK/dV of a block travel with it and arrive back at the block's owner after R hops::

    step t:  start the next k/v block's transfer (t < R-1)
             dq += pieces' dq; dk_t, dv_t = pieces' dk, dv for the held block     (overlaps both transfers)
             wait for the partial dK/dV of the held block from r - 1 (t > 0), add them to dk_t, dv_t
             start sending dk_t, dv_t to r + 1, receiving the next partial from r - 1
             wait for the k/v transfer
    finally wait for the last dK/dV transfer: this position's own block, summed over every position.

Accumulation and the dK/dV transport are float32. Transfers use ``batch_isend_irecv`` on the ring group
(gloo and NCCL alike; NCCL runs the pair in one group call). With the zigzag layout every step after the
first attends exactly half of the block pairs' rows to keys (one SDPA call), the first step the two causal
diagonals and one full piece: every ring position does the same work.

Each op call counts in :data:`autosp.compiler.ops.CALLS` (``ring_attention``), the runtime's evidence
that attention ran in the SP graph. The gradient of ``lse`` is not propagated (the attention pass uses
only ``out``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from autosp.compiler import ops
from autosp.compiler.autocast import cast_under_autocast
from autosp.compiler.attention.layout import unflatten_ranges
from autosp.compiler.attention.local import rows_backward, rows_forward, rule_documents
from autosp.compiler.attention.merge import empty_accumulators
from autosp.compiler.attention.sinks import fold_sinks, sinks_grad

_KV_TAG, _DKV_TAG = 71, 72  # distinct tags: the k/v and dK/dV transfers between the same two ranks overlap


class _Transfer:
    """``send`` on its way to the next ring position, the previous one's arriving in ``recv``."""

    def __init__(self, send: torch.Tensor, pg, tag: int):
        size, rank = pg.size(), pg.rank()
        self.send, self.recv = send, torch.empty_like(send)
        nxt = dist.get_global_rank(pg, (rank + 1) % size)
        prv = dist.get_global_rank(pg, (rank - 1) % size)
        self.works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt, pg, tag),
                                             dist.P2POp(dist.irecv, self.recv, prv, pg, tag)])

    def wait(self) -> torch.Tensor:
        for work in self.works:
            work.wait()
        return self.recv


def _pack(*tensors: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _unpack(buffer: torch.Tensor, like) -> list[torch.Tensor]:
    out, offset = [], 0
    for t in like:
        out.append(buffer[offset:offset + t.numel()].view(t.shape))
        offset += t.numel()
    return out


def _setup(q, k, group, ranges):
    pg = ops._group(group)
    size, rank = pg.size(), pg.rank()
    spans = unflatten_ranges(ranges, size)
    n = sum(b - a for a, b in spans[rank])
    if q.shape[2] != n or k.shape[2] != n:
        raise RuntimeError(f"autosp_ops::ring_attention: blocks of {q.shape[2]} queries / {k.shape[2]} keys but "
                           f"ring position {rank} holds {n} tokens")
    if q.shape[1] % k.shape[1]:
        raise RuntimeError(f"autosp_ops::ring_attention: {q.shape[1]} query heads are not a multiple of "
                           f"{k.shape[1]} key/value heads")
    return pg, size, rank, spans


def ring_block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, pg, q_spans,
                       k_spans, acc, documents=None, window: int = 0, softcap: float = 0.0) -> None:
    """Merge into ``acc`` (float32 out, lse) the attention of this ring position's query block (its global spans
    ``q_spans[rank]``) over the key/value block every ring position holds (``k_spans[position]``), passing the
    k/v blocks around the ring as described above. The ring op uses q_spans = k_spans; sequence-chunked layers
    call it once per (query chunk, earlier key/value chunk). ``documents`` (per batch row, or None) and
    ``window`` restrict the attention to packed documents and a sliding window (:mod:`.local`)."""
    size, rank = pg.size(), pg.rank()
    documents = documents if documents is not None else (None,) * q.shape[0]
    k, v = k.contiguous(), v.contiguous()
    held = _pack(k, v)
    for step in range(size):
        source = (rank - step) % size
        transfer = _Transfer(held, pg, _KV_TAG) if step + 1 < size else None  # next block, under this attention
        block_k, block_v = _unpack(held, (k, v))
        rows_forward(q, block_k, block_v, q_spans[rank], k_spans[source], scale, documents, window, acc, softcap)
        if transfer is not None:
            held = transfer.wait()


def ring_block_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                        lse: torch.Tensor, scale: float | None, pg, q_spans, k_spans,
                        dq: torch.Tensor, documents=None, window: int = 0,
                        softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward of :func:`ring_block_forward`: add the query block's gradient to ``dq`` (float32) and return
    the float32 (dK, dV) of this position's own key/value block, summed over every position's queries."""
    size, rank = pg.size(), pg.rank()
    documents = documents if documents is not None else (None,) * q.shape[0]
    k, v = k.contiguous(), v.contiguous()
    f32 = [torch.empty(t.shape, dtype=torch.float32, device=t.device) for t in (k, v)]
    held = _pack(k, v)
    partial = None  # the dK/dV of the block arriving next, in flight from r - 1
    for step in range(size):
        source = (rank - step) % size
        transfer = _Transfer(held, pg, _KV_TAG) if step + 1 < size else None
        block_k, block_v = _unpack(held, (k, v))
        dk = torch.zeros_like(f32[0])
        dv = torch.zeros_like(f32[1])
        rows_backward(dout, q, block_k, block_v, out, lse, q_spans[rank], k_spans[source], scale, documents, window,
                      (dq, dk, dv), softcap)
        if partial is not None:
            arrived_k, arrived_v = _unpack(partial.wait(), f32)
            dk += arrived_k
            dv += arrived_v
        if size == 1:
            return dk, dv
        partial = _Transfer(_pack(dk, dv), pg, _DKV_TAG)
        if transfer is not None:
            held = transfer.wait()
    return tuple(_unpack(partial.wait(), f32))  # this position's block, back from its last holder


@torch.library.custom_op("autosp_ops::ring_attention", mutates_args=())
def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, group: str,
                   ranges: list[int], rule: str = "", window: int = 0,
                   softcap: float = 0.0, sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    ops.CALLS["ring_attention"] += 1
    pg, size, rank, spans = _setup(q, k, group, ranges)
    acc = empty_accumulators(q, v.shape[-1])
    ring_block_forward(q, k, v, scale, pg, spans, spans, acc, rule_documents(rule, q.shape[0]), window, softcap)
    out, lse = acc
    if sinks is not None:  # once, after every ring block's merge
        fold_sinks(out, lse, sinks)
    return out.to(q.dtype), lse


@ring_attention.register_fake
def _ring_attention_fake(q, k, v, scale, group, ranges, rule="", window=0, softcap=0.0, sinks=None):
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("autosp_ops::ring_attention_backward", mutates_args=())
def ring_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                            lse: torch.Tensor, scale: float | None, group: str, ranges: list[int], rule: str = "",
                            window: int = 0, softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ops.CALLS["ring_attention_backward"] += 1
    pg, size, rank, spans = _setup(q, k, group, ranges)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    own_dk, own_dv = ring_block_backward(dout.contiguous(), q, k, v, out, lse, scale, pg, spans, spans, dq,
                                         rule_documents(rule, q.shape[0]), window, softcap)
    # copies: the two may be views of one receive buffer, and an op's outputs must not alias each other
    return dq.to(q.dtype), own_dk.to(k.dtype, copy=True), own_dv.to(v.dtype, copy=True)


@ring_attention_backward.register_fake
def _ring_attention_backward_fake(dout, q, k, v, out, lse, scale, group, ranges, rule="", window=0, softcap=0.0):
    # contiguous, as the real gradients are (empty_like would copy the strides of a transposed input)
    return tuple(t.new_empty(t.shape) for t in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, ctx.scale, ctx.group, ctx.ranges, ctx.rule, ctx.window, ctx.softcap, sinks = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sinks)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, sinks = ctx.saved_tensors
    # (out, lse) include the sinks: the blocks' flash backward from them is already the gradient with sinks
    dq, dk, dv = ring_attention_backward(dout, q, k, v, out, lse, ctx.scale, ctx.group, list(ctx.ranges), ctx.rule,
                                         ctx.window, ctx.softcap)
    dsinks = None if sinks is None else sinks_grad(dout, out, lse, sinks)
    return dq, dk, dv, None, None, None, None, None, None, dsinks


ring_attention.register_autograd(_backward, setup_context=_setup_context)
cast_under_autocast(torch.ops.autosp_ops.ring_attention.default)  # under autocast: SDPA's dtype rule

__all__ = ["ring_attention", "ring_attention_backward", "ring_block_backward", "ring_block_forward"]
