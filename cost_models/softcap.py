"""Gemma 2 logit soft-capping: what ``cap x tanh(x / cap)`` on attention scores and on the final logits costs.

- Attention scores (``attn_logit_softcap``): the cap is applied inside the attention kernel, on every score
  before the softmax, as a score modification (FlexAttention's ``score_mod``; SDPA's flash kernel has no hook for
  it). Same FLOPs, a slower kernel: :data:`ATTENTION_SPEED` is the share of FlashAttention-2's speed such a kernel
  reaches, forward and backward. Memory is unchanged (no S x S tensor; the backward recomputes the scores).
- Final logits (``final_logit_softcap``): one more pointwise op on the s x V logits before the loss (tiled or not),
  whose tanh output the backward needs: :data:`LOGIT_ELEMS` more logits-sized tensor at the loss peak and kept
  with the logits, and :data:`LOGIT_POINTWISE_BYTES` more memory traffic per logit.

Query pre-attention scaling (Gemma 2/3 ``query_pre_attn_scalar``) is the softmax scale: free. Pure functions.
"""

from __future__ import annotations

__all__ = ["ATTENTION_SPEED", "LOGIT_ELEMS", "LOGIT_POINTWISE_BYTES", "attention_slowdown", "logit_extra"]

ATTENTION_SPEED = (0.90, 0.85)
"""(forward, backward) speed of attention with a score modification relative to FlashAttention-2: PyTorch blog
"FlexAttention: The Flexibility of PyTorch with the Performance of FlashAttention" (2024-08-07): "90% of
FlashAttention2's performance in the forward pass and 85% in the backward pass". An assumption until measured."""

LOGIT_ELEMS = 1
"""Logit-sized tensors (training dtype) soft-capping adds: the tanh output the backward multiplies by."""

LOGIT_POINTWISE_BYTES = (4.0, 6.0)
"""(forward, backward) bytes per logit at 2-byte logits: read the logits and write the capped ones (the divide,
tanh and multiply fuse); backward reads the gradient and the tanh output and writes the gradient."""


def attention_slowdown(model) -> tuple[float, float]:
    """(forward, backward) attention time multipliers of ``model`` (1, 1 without attention soft-capping)."""
    if not getattr(model, "attn_logit_softcap", 0.0):
        return 1.0, 1.0
    return 1.0 / ATTENTION_SPEED[0], 1.0 / ATTENTION_SPEED[1]


def logit_extra(model) -> tuple[int, float, float]:
    """(logit-sized tensors, forward bytes, backward bytes per logit at 2 bytes) final-logit soft-capping adds."""
    if not getattr(model, "final_logit_softcap", 0.0):
        return 0, 0.0, 0.0
    return LOGIT_ELEMS, LOGIT_POINTWISE_BYTES[0], LOGIT_POINTWISE_BYTES[1]
