"""Attention restricted to documents and sliding windows, per row, and the op that runs it after Ulysses.

:func:`rows_forward` / :func:`rows_backward`: :func:`~.blockwise.block_forward` / ``block_backward`` for a
batch whose rows may hold different packed documents: rows with the same documents run together, each
group with the pieces of :func:`~.pieces.attention_pieces` for its documents and the layer's window. The
pieces of a (block, block, documents, window) are cached: every layer of a step asks for the same ones.

``autosp_ops::span_attention(q, k, v, scale, rule, window, softcap=0, sinks=None) -> (out, lse)``: what the
attention pass puts in place of SDPA after the Ulysses all-to-all when the engine trains packed documents or a
model with sliding windows (the ring op, :mod:`.ring`, takes the same two arguments). After the all-to-all the
rank holds the whole sequence [0, S) for its heads, so document and window restrictions are local: no mask and
no communication; it also runs every soft-capped attention (Gemma 2: ``softcap`` > 0, which SDPA cannot do,
:mod:`.capped`), documents and windows or not, and every attention with sinks (gpt-oss: ``sinks``, the local
heads' sink logits, merged once after the pieces, :mod:`.sinks`). ``rule`` names the engine whose published
documents apply (:mod:`.documents`); ``window`` is the layer's sliding window in tokens, 0 for none. q [B, Hq, S, d], k and v [B, Hkv, S, d]
(grouped-query natively), out in q's dtype, lse [B, Hq, S] float32. Backward:
``autosp_ops::span_attention_backward`` (flash-attention style, from the saved output and log-sum-exp).
The kernels are the SDPA ones of :mod:`.kernels` (CPU flash attention; CUDA memory-efficient attention,
not run on this project's machines), or with ``AUTOSP_FLEX_ATTENTION=1`` on CUDA one FlexAttention call
with a document block mask (:mod:`.flex_cuda`, untested).
"""

from __future__ import annotations

import functools

import torch

from autosp.compiler import ops
from autosp.compiler.attention import flex_cuda
from autosp.compiler.autocast import cast_under_autocast
from autosp.compiler.attention.blockwise import block_backward, block_forward
from autosp.compiler.attention.documents import published
from autosp.compiler.attention.merge import empty_accumulators
from autosp.compiler.attention.pieces import attention_pieces
from autosp.compiler.attention.sinks import fold_sinks, sinks_grad


@functools.lru_cache(maxsize=256)
def _pieces(q_spans: tuple, k_spans: tuple, documents, window: int):
    return attention_pieces(q_spans, k_spans, documents, window or None)


def _row_groups(rows_documents) -> list[tuple[slice, tuple | None]]:
    """Consecutive rows with the same documents, as (row slice, documents)."""
    groups: list = []
    for b, docs in enumerate(rows_documents):
        docs = None if docs is None else tuple(tuple(d) for d in docs)
        if groups and groups[-1][1] == docs:
            groups[-1] = (slice(groups[-1][0].start, b + 1), docs)
        else:
            groups.append((slice(b, b + 1), docs))
    return groups


def rows_forward(q, k, v, q_spans, k_spans, scale, rows_documents, window: int, into, softcap: float = 0.0):
    """Merge the attention of q's rows over this key/value block into ``into`` = (out, lse), float32."""
    out, lse = into
    for rows, docs in _row_groups(rows_documents):
        pieces = _pieces(tuple(q_spans), tuple(k_spans), docs, window)
        block_forward(q[rows], k[rows], v[rows], q_spans, k_spans, scale, into=(out[rows], lse[rows]), pieces=pieces,
                      softcap=softcap)
    return out, lse


def rows_backward(dout, q, k, v, out, lse, q_spans, k_spans, scale, rows_documents, window: int, into,
                  softcap: float = 0.0):
    """Add this block pair's (dq, dk, dv) into ``into`` (float32)."""
    dq, dk, dv = into
    for rows, docs in _row_groups(rows_documents):
        pieces = _pieces(tuple(q_spans), tuple(k_spans), docs, window)
        block_backward(dout[rows], q[rows], k[rows], v[rows], out[rows], lse[rows], q_spans, k_spans, scale,
                       into=(dq[rows], dk[rows], dv[rows]), pieces=pieces, softcap=softcap)
    return dq, dk, dv


def rule_documents(rule: str, batch: int):
    """Per row: the published documents of engine ``rule`` (None everywhere when ``rule`` is empty)."""
    return published(rule, batch) if rule else (None,) * batch


@torch.library.custom_op("autosp_ops::span_attention", mutates_args=())
def span_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, rule: str,
                   window: int, softcap: float = 0.0,
                   sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    ops.CALLS["span_attention"] += 1
    # opt-in, untested: one FlexAttention call with a document block mask
    if flex_cuda.enabled(q) and not softcap and sinks is None:
        return flex_cuda.flex_forward(q, k, v, scale, rule_documents(rule, q.shape[0]), window)
    spans = ((0, q.shape[2]),)
    acc = empty_accumulators(q, v.shape[-1])
    rows_forward(q, k.contiguous(), v.contiguous(), spans, spans, scale, rule_documents(rule, q.shape[0]), window,
                 acc, softcap)
    out, lse = acc
    if sinks is not None:
        fold_sinks(out, lse, sinks)
    return out.to(q.dtype), lse


@span_attention.register_fake
def _span_attention_fake(q, k, v, scale, rule, window, softcap=0.0, sinks=None):
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("autosp_ops::span_attention_backward", mutates_args=())
def span_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                            lse: torch.Tensor, scale: float | None, rule: str,
                            window: int, softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ops.CALLS["span_attention_backward"] += 1
    if flex_cuda.enabled(q) and not softcap:
        return flex_cuda.flex_backward(dout, q, k, v, scale, rule_documents(rule, q.shape[0]), window)
    spans = ((0, q.shape[2]),)
    grads = tuple(torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in (q, k, v))
    rows_backward(dout.contiguous(), q, k.contiguous(), v.contiguous(), out, lse, spans, spans, scale,
                  rule_documents(rule, q.shape[0]), window, grads, softcap)
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))


@span_attention_backward.register_fake
def _span_attention_backward_fake(dout, q, k, v, out, lse, scale, rule, window, softcap=0.0):
    return tuple(t.new_empty(t.shape) for t in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, ctx.scale, ctx.rule, ctx.window, ctx.softcap, sinks = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sinks)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, sinks = ctx.saved_tensors
    # (out, lse) include the sinks: the pieces' flash backward from them is already the gradient with sinks
    dq, dk, dv = span_attention_backward(dout, q, k, v, out, lse, ctx.scale, ctx.rule, ctx.window, ctx.softcap)
    dsinks = None if sinks is None else sinks_grad(dout, out, lse, sinks)
    return dq, dk, dv, None, None, None, None, dsinks


span_attention.register_autograd(_backward, setup_context=_setup_context)
cast_under_autocast(torch.ops.autosp_ops.span_attention.default)  # under autocast: SDPA's dtype rule

__all__ = ["rows_backward", "rows_forward", "rule_documents", "span_attention", "span_attention_backward"]
