"""Attention of one query piece over one key/value piece, returning the log-sum-exp, and its backward.

Both are the SDPA kernels torch ships for its own ring attention (``torch.distributed.tensor.experimental``
context parallel calls the same aten ops): they return, besides the output, the per-row log-sum-exp of the
scores, and their backward takes the output and log-sum-exp instead of recomputing the softmax
normaliser. That is what makes blockwise attention exact: each piece's output is merged by its
log-sum-exp (:mod:`.merge`), and the backward of each piece is run with the *merged* output and
log-sum-exp of its rows (the flash-attention backward: P = exp(S - lse), dS = P * (dP - rowsum(dO * O))),
so the pieces' gradients add up to the gradient of the whole attention.

Shapes: q [B, Hq, n, d], k and v [B, Hkv, m, d] with Hq a multiple of Hkv (grouped-query attention);
out [B, Hq, n, d] in q's dtype, lse [B, Hq, n] float32.

- CPU: ``aten._scaled_dot_product_flash_attention_for_cpu`` and its ``_backward``; they handle Hq != Hkv
  themselves (measured on torch 2.13: identical to SDPA with ``enable_gqa``).
- CUDA (written device-agnostic, NOT run on this project's CPU-only machines):
  ``aten._scaled_dot_product_efficient_attention`` and its backward (fp32, bf16 and fp16); its
  log-sum-exp rows are padded to a multiple of 32, so the forward trims them and the backward pads the
  merged one again; key/value heads are repeated to Hq heads for it and their gradients summed back.

With ``softcap`` > 0 (Gemma 2's attention logit soft-capping) both run the capped kernel of :mod:`.capped`.
"""

from __future__ import annotations

import torch

from autosp.compiler.attention.capped import capped_with_lse, capped_with_lse_backward

aten = torch.ops.aten
_LSE_ALIGN = 32  # memory-efficient attention pads its log-sum-exp rows to a multiple of this


def _repeat_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _fold_kv(grad: torch.Tensor, groups: int) -> torch.Tensor:
    """Gradient of ``_repeat_kv``: sum the repeated heads."""
    if groups == 1:
        return grad
    b, h, m, d = grad.shape
    return grad.view(b, h // groups, groups, m, d).sum(dim=2)


def sdpa_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  scale: float | None, softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of softmax(q k^T * scale [+ causal mask]) v. ``causal`` needs n == m (aligned square).
    ``softcap`` > 0: the scores are soft-capped first (:mod:`.capped`; SDPA cannot)."""
    if softcap:
        return capped_with_lse(q, k, v, causal, scale, softcap)
    if q.device.type == "cpu":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, causal, scale=scale)
        return out, lse.float()
    groups = q.shape[1] // k.shape[1]
    out, lse, *_ = aten._scaled_dot_product_efficient_attention.default(
        q, _repeat_kv(k, groups), _repeat_kv(v, groups), None, True, 0.0, causal, scale=scale)
    return out, lse[..., :q.shape[2]].float()


def sdpa_with_lse_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           out: torch.Tensor, lse: torch.Tensor, causal: bool,
                           scale: float | None, softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the piece, given the (merged) output and log-sum-exp of its query rows."""
    if softcap:
        return capped_with_lse_backward(dout, q, k, v, out, lse, causal, scale, softcap)
    if q.device.type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
            dout, q, k, v, out, lse.contiguous(), 0.0, causal, scale=scale)
    groups = q.shape[1] // k.shape[1]
    n = q.shape[2]
    padded = -(-n // _LSE_ALIGN) * _LSE_ALIGN
    lse_padded = lse.new_zeros(*lse.shape[:-1], padded)
    lse_padded[..., :n] = lse
    empty = torch.empty(0, device=q.device, dtype=torch.int64)
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward.default(
        dout, q, _repeat_kv(k, groups), _repeat_kv(v, groups), None, out, lse_padded, empty, empty, 0.0,
        [True, True, True, False], causal, scale=scale)
    return dq, _fold_kv(dk, groups), _fold_kv(dv, groups)


__all__ = ["sdpa_with_lse", "sdpa_with_lse_backward"]
