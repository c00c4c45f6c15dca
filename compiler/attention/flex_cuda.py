"""CUDA only, opt-in, NOT TESTED (this project's machines have no GPU): span-restricted attention after the
Ulysses all-to-all as ONE FlexAttention call with a document (and window) block mask, instead of one SDPA
call per piece (:mod:`.local`). Enabled by ``AUTOSP_FLEX_ATTENTION=1``; without it CUDA runs the piece
path with the memory-efficient SDPA kernels.

The block mask is built from each row's document ids (``doc[b, i]``: the document token i belongs to)
and the window: key j visible to query i iff ``doc[b, j] == doc[b, i]`` and ``j <= i`` and (window W)
``i - j < W``. ``create_block_mask`` stores it block-sparse (128 x 128 blocks), so no S x S tensor exists.
The forward returns the log-sum-exp like the piece path; the backward re-runs the forward under autograd
(FlexAttention's own backward), costing one more forward.
"""

from __future__ import annotations

import functools
import os

import torch

__all__ = ["enabled", "flex_backward", "flex_forward"]


def enabled(q: torch.Tensor) -> bool:
    return q.is_cuda and os.environ.get("AUTOSP_FLEX_ATTENTION") == "1"


@functools.cache
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _document_ids(rows_documents, batch: int, n: int, device) -> torch.Tensor:
    doc = torch.zeros(batch, n, dtype=torch.int32)
    for b, docs in enumerate(rows_documents):
        for i, (a, e) in enumerate(docs or ()):
            doc[b, a:e] = i
    return doc.to(device)


def _block_mask(rows_documents, window: int, batch: int, n: int, device):
    from torch.nn.attention.flex_attention import create_block_mask

    doc = _document_ids(rows_documents, batch, n, device)

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = (kv_idx <= q_idx) & (doc[b, q_idx] == doc[b, kv_idx])
        if window:
            allowed = allowed & (q_idx - kv_idx < window)
        return allowed

    return create_block_mask(mask_mod, batch, None, n, n, device=device)


def flex_forward(q, k, v, scale, rows_documents, window: int):
    """(out in q's dtype, lse float32 [B, Hq, S]) of the whole-sequence block."""
    mask = _block_mask(rows_documents, window, q.shape[0], q.shape[2], q.device)
    out, lse = _compiled()(q, k, v, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
                           return_lse=True)
    return out, lse.float()


def flex_backward(dout, q, k, v, scale, rows_documents, window: int):
    """(dq, dk, dv): FlexAttention's backward of a recomputed forward."""
    with torch.enable_grad():
        q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
        out, _ = flex_forward(q_, k_, v_, scale, rows_documents, window)
        return torch.autograd.grad(out, (q_, k_, v_), dout)
