"""Attention with logit soft-capping (Gemma 2's ``attn_logit_softcapping``): scores ``cap * tanh(s / cap)``
before the softmax, for one piece, with its log-sum-exp, and its backward from the merged output and
log-sum-exp -- the same contract as :mod:`.kernels`' SDPA pieces, so blockwise, span and ring attention merge
capped pieces exactly as they merge SDPA ones.

SDPA has no hook for a score modification, so a capped piece is computed here with matmuls in float32:
``s = q k^T * scale``, ``t = tanh(s / cap)``, ``z = cap * t`` (causal pieces: keys after the query get
-inf), ``lse = logsumexp(z)``, ``out = exp(z - lse) v``. Backward, flash-attention style with the merged
(out, lse) of the rows: ``P = exp(z - lse)``, ``dV = P^T dO``, ``dZ = P * (dO V^T - rowsum(dO * O))``,
``dS = dZ * (1 - t^2)`` (the derivative of the cap), ``dQ = dS K * scale``, ``dK = dS^T Q * scale``.

Memory: the scores of ``ROWS`` query rows at a time (float32), not of the whole piece: a piece of n queries
over m keys costs ``B * H * ROWS * m`` floats at once. It runs on any device (the FlexAttention kernel with a
``score_mod`` that the planner's speed figure assumes, cost_models/softcap.py, is the GPU path still to
come: it has no backward from a merged log-sum-exp).
"""

from __future__ import annotations

import torch

ROWS = 1024
"""Query rows whose scores exist at once (bounds the float32 score block to ROWS x keys per head)."""


def _expand(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _scores(q, k, lo, hi, causal, scale, cap):
    """(capped scores z, tanh t) of query rows [lo, hi) over every key, float32; masked entries -inf."""
    s = torch.matmul(q[:, :, lo:hi].float(), k.float().transpose(-1, -2)) * scale
    t = torch.tanh(s / cap)
    z = t * cap
    if causal:  # aligned square: query row i sees key rows <= i
        rows = torch.arange(lo, hi, device=q.device).unsqueeze(1)
        z = z.masked_fill(torch.arange(k.shape[2], device=q.device) > rows, float("-inf"))
    return z, t


def capped_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
                    cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out in q's dtype, lse float32) of softmax(cap * tanh(q k^T * scale / cap) [+ causal]) v."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    groups = q.shape[1] // k.shape[1]
    k, v = _expand(k, groups), _expand(v, groups).float()
    out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=torch.float32, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    for lo in range(0, q.shape[2], ROWS):
        hi = min(lo + ROWS, q.shape[2])
        z, _ = _scores(q, k, lo, hi, causal, scale, cap)
        lse[:, :, lo:hi] = torch.logsumexp(z, dim=-1)
        out[:, :, lo:hi] = torch.matmul(torch.exp(z - lse[:, :, lo:hi, None]), v)
    return out.to(q.dtype), lse


def capped_with_lse_backward(dout, q, k, v, out, lse, causal: bool, scale: float | None, cap: float):
    """(dq, dk, dv) of a capped piece, given the merged output and log-sum-exp of its query rows."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    groups = q.shape[1] // k.shape[1]
    ke, ve = _expand(k, groups).float(), _expand(v, groups).float()
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(ke.shape, dtype=torch.float32, device=q.device)
    dv = torch.zeros(ve.shape, dtype=torch.float32, device=q.device)
    for lo in range(0, q.shape[2], ROWS):
        hi = min(lo + ROWS, q.shape[2])
        z, t = _scores(q, ke, lo, hi, causal, scale, cap)
        # a row that saw no key anywhere has lse -inf: its probabilities are 0, not nan
        finite = torch.isfinite(lse[:, :, lo:hi, None])
        p = torch.where(finite, torch.exp(z - torch.where(finite, lse[:, :, lo:hi, None], 0.0)), 0.0)
        d_o = dout[:, :, lo:hi].float()
        dv += torch.matmul(p.transpose(-1, -2), d_o)
        delta = (d_o * out[:, :, lo:hi].float()).sum(-1, keepdim=True)
        ds = p * (torch.matmul(d_o, ve.transpose(-1, -2)) - delta) * (1 - t * t) * scale
        dq[:, :, lo:hi] = torch.matmul(ds, ke)
        dk += torch.matmul(ds.transpose(-1, -2), q[:, :, lo:hi].float())
    if groups > 1:  # gradient of the repeat: sum each kv head's query-head copies
        b, h, m, d = dk.shape
        dk = dk.view(b, h // groups, groups, m, d).sum(2)
        dv = dv.view(b, h // groups, groups, m, dv.shape[-1]).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


__all__ = ["ROWS", "capped_with_lse", "capped_with_lse_backward"]
