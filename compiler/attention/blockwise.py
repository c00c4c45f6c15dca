"""Attention of one query block over one key/value block, given the global token spans each holds.

The building block of ring attention (:mod:`.ring`) and of sequence-chunked layers (chunk i attending
key/value chunks j <= i, merged by log-sum-exp, chunks possibly kept in host memory between uses):

- :func:`block_forward` runs every piece of :func:`~.pieces.attention_pieces` with
  :func:`~.kernels.sdpa_with_lse` and merges them into float32 (out, lse) accumulators of the query block
  (fresh ones, or ``into=`` those of earlier key blocks: the merge is order-free);
- :func:`block_backward` runs each piece's backward with the *final* merged output and log-sum-exp of the
  query rows (the flash-attention backward) and adds the piece gradients into float32 accumulators of dq
  (the query block) and dk, dv (the key/value block).

Neither builds a mask nor any n x m tensor outside the SDPA kernels; a block pair that does not attend
(every key after every query) runs no kernel at all. A mirrored piece (a sliding window's far edge) runs
the causal kernel on its rows reversed. q [B, Hq, n, d], k and v [B, Hkv, m, d]. ``softcap`` > 0: Gemma 2's
capped scores (:mod:`.capped`), piece by piece.
"""

from __future__ import annotations

import torch

from autosp.compiler.attention.kernels import sdpa_with_lse, sdpa_with_lse_backward
from autosp.compiler.attention.merge import empty_accumulators, merge_into
from autosp.compiler.attention.pieces import attention_pieces


def block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_spans, k_spans, scale: float | None = None,
                  *, into: tuple[torch.Tensor, torch.Tensor] | None = None, pieces=None, softcap: float = 0.0):
    """(out, lse), float32: attention of the query block over this key/value block, merged into ``into``
    (the accumulators of the key blocks seen before) when given. Rows that see no key keep lse -inf."""
    out, lse = into if into is not None else empty_accumulators(q, v.shape[-1])
    for p in attention_pieces(q_spans, k_spans) if pieces is None else pieces:
        if p.mirrored:  # row i attends key rows >= i: the causal kernel on both row orders reversed
            o, l = sdpa_with_lse(*(t[:, :, s].flip(2) for t, s in ((q, p.q), (k, p.k), (v, p.k))), True, scale,
                                 softcap)
            o, l = o.flip(2), l.flip(-1)
        else:
            o, l = sdpa_with_lse(q[:, :, p.q], k[:, :, p.k], v[:, :, p.k], p.causal, scale, softcap)
        merge_into(out, lse, o, l, p.q)
    return out, lse


def block_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, q_spans, k_spans, scale: float | None = None, *,
                   into: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, pieces=None,
                   softcap: float = 0.0):
    """(dq, dk, dv), float32, of this block pair's share of the attention. ``out`` and ``lse`` are the
    query block's final (merged over every key block) output, in q's dtype, and log-sum-exp. ``into``: the
    accumulators to add to (dq of the query block, dk and dv of the key/value block)."""
    if into is None:
        into = tuple(torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in (q, k, v))
    dq, dk, dv = into
    for p in attention_pieces(q_spans, k_spans) if pieces is None else pieces:
        rows, cols = p.q, p.k
        args = (dout[:, :, rows], q[:, :, rows], k[:, :, cols], v[:, :, cols], out[:, :, rows], lse[:, :, rows])
        if p.mirrored:  # as in the forward: reversed rows, causal kernel, gradients reversed back
            gq, gk, gv = (g.flip(2) for g in sdpa_with_lse_backward(*(t.flip(2) for t in args[:5]),
                                                                    args[5].flip(-1), True, scale, softcap))
        else:
            gq, gk, gv = sdpa_with_lse_backward(*args, p.causal, scale, softcap)
        dq[:, :, rows] += gq
        dk[:, :, cols] += gk
        dv[:, :, cols] += gv
    return dq, dk, dv


__all__ = ["block_backward", "block_forward"]
