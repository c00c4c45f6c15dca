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
- CUDA (written device-agnostic from torch's operator schemas, NOT run on this project's CPU-only machines):
  the SDPA backend that SDPA itself would be allowed to run, so that the kernel the compiler selected
  (``torch.nn.attention.sdpa_kernel`` in compiler/attention_kernel.py sets the backends and their priority)
  also runs the blockwise and ring pieces: :func:`cuda_backend` walks torch's current backend priority
  order and takes the first backend that is enabled and accepts the inputs
  (``torch.backends.cuda.can_use_*_attention``) -- ``aten._scaled_dot_product_cudnn_attention``,
  ``aten._scaled_dot_product_flash_attention`` (both bf16/fp16 only) or
  ``aten._scaled_dot_product_efficient_attention`` (also fp32; the fallback), each with its own backward.
  The three return the same natural-log log-sum-exp (torch's context-parallel attention merges them
  alike): the efficient kernel pads its rows to a multiple of 32 (trimmed here, padded again for its
  backward), cuDNN may return it with a trailing unit dimension (kept the same way for its backward).
  Key/value heads are repeated to Hq heads for the kernels and their gradients summed back. The dense
  (not variable-length) calls pass no cumulative sequence lengths (None: an undefined tensor, as the
  dense forwards return them) and no dropout, so the random-state arguments are unused.

With ``softcap`` > 0 (Gemma 2's attention logit soft-capping) every device runs the capped kernel of
:mod:`.capped`.
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


_BACKENDS = {1: "flash", 2: "efficient", 3: "cudnn"}
"""torch.nn.attention.SDPBackend values of the kernels that return a log-sum-exp (MATH does not)."""
_DEFAULT_PRIORITY = (1, 2, 0, 3)  # torch's own order when it cannot be read (torch < 2.5)
_lse_ranks: dict = {}  # backend -> the rank of the log-sum-exp its forward returned (cuDNN: 3 or 4 by version)


def cuda_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> str:
    """The SDPA backend ('cudnn', 'flash' or 'efficient') that runs a piece on CUDA: the first backend of torch's
    current priority order that is enabled and takes these inputs (k and v with q's head count), else
    'efficient' (it takes every dtype; a shape it refuses fails loudly in the call)."""
    from torch.backends import cuda as sdp

    order = getattr(torch._C, "_get_sdp_priority_order", lambda: _DEFAULT_PRIORITY)()
    checks = {"flash": (sdp.flash_sdp_enabled, getattr(sdp, "can_use_flash_attention", None)),
              "cudnn": (sdp.cudnn_sdp_enabled, getattr(sdp, "can_use_cudnn_attention", None)),
              "efficient": (sdp.mem_efficient_sdp_enabled, getattr(sdp, "can_use_efficient_attention", None))}
    try:
        params = sdp.SDPAParams(q, k, v, None, 0.0, causal, False)
    except (AttributeError, TypeError):  # an older torch: SDPAParams takes other arguments
        params = None
    for value in order:
        name = _BACKENDS.get(int(value))
        if name is None:
            continue
        enabled, usable = checks[name]
        if enabled() and params is not None and usable is not None and usable(params, False):
            return name
    return "efficient"


def _lse_rows(lse: torch.Tensor, n: int) -> torch.Tensor:
    """[B, H, n] float32 from a kernel's log-sum-exp ([B, H, >=n] or [B, H, n, 1])."""
    if lse.dim() == 4:
        lse = lse[..., 0]
    return lse[..., :n].float()


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
    k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
    backend = cuda_backend(q, k, v, causal)
    if backend == "flash":
        out, lse, *_ = aten._scaled_dot_product_flash_attention.default(q, k, v, 0.0, causal, False, scale=scale)
    elif backend == "cudnn":
        out, lse, *_ = aten._scaled_dot_product_cudnn_attention.default(q, k, v, None, True, 0.0, causal, False,
                                                                         scale=scale)
    else:
        out, lse, *_ = aten._scaled_dot_product_efficient_attention.default(q, k, v, None, True, 0.0, causal,
                                                                            scale=scale)
    _lse_ranks[backend] = lse.dim()
    return out, _lse_rows(lse, q.shape[2])


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
    k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
    n, m = q.shape[2], k.shape[2]
    backend = cuda_backend(q, k, v, causal)
    empty = torch.empty(0, device=q.device, dtype=torch.int64)  # no dropout: the random state is unused
    dout, out = dout.contiguous(), out.contiguous()
    if backend == "flash":
        dq, dk, dv = aten._scaled_dot_product_flash_attention_backward.default(
            dout, q, k, v, out, lse.float().contiguous(), None, None, n, m, 0.0, causal, empty, empty, scale=scale)
    elif backend == "cudnn":
        stats = lse.float().unsqueeze(-1) if _lse_ranks.get("cudnn", 4) == 4 else lse.float()
        dq, dk, dv = aten._scaled_dot_product_cudnn_attention_backward.default(
            dout, q, k, v, out, stats.contiguous(), empty, empty, None, None, None, n, m, 0.0, causal, scale=scale)
    else:
        padded = -(-n // _LSE_ALIGN) * _LSE_ALIGN
        lse_padded = lse.new_zeros(*lse.shape[:-1], padded)
        lse_padded[..., :n] = lse
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward.default(
            dout, q, k, v, None, out, lse_padded, empty, empty, 0.0, [True, True, True, False], causal, scale=scale)
    return dq, _fold_kv(dk, groups), _fold_kv(dv, groups)


__all__ = ["cuda_backend", "sdpa_with_lse", "sdpa_with_lse_backward"]
