"""Attention sinks (gpt-oss): one learned logit per head that joins every row's softmax denominator.

transformers' gpt-oss attention appends the head's sink logit ``s`` to each row of scores, takes the softmax and
drops the sink's column: the sink is one more key whose value is the zero vector. For a row whose real scores
have log-sum-exp ``L`` and normalised output ``O`` (what every attention piece and merge here produces):

    L' = log(exp(L) + exp(s))          out = O * exp(L - L') = O * sigmoid(L - s)

so the sink is merged once, after every piece (every ring block, every key chunk) has been merged by log-sum-exp,
exactly like one more partial result with output 0 and log-sum-exp ``s`` (:mod:`.merge`). A row that saw no key
keeps output 0.

Backward. With the sink folded in, (out, L') are the attention's output and log-sum-exp over the real keys plus
the sink, and the probabilities of the real keys are ``exp(S - L')``: the flash-attention backward every piece
runs from the merged output and log-sum-exp (``dS = P * (dO V^T - rowsum(dO * out))``) is then already the
gradient of the attention with the sink, for q, k and v alike. The sink's own gradient: the sink's probability
is ``p = exp(s - L')`` and d out / d s = -p * out, so

    d s = - sum over rows of p * rowsum(dO * out)

summed over the batch and the rows a rank holds. Under Ulysses a rank holds its heads' rows of the whole
sequence, under a ring its rows of those heads: each rank's gradient for its heads' slice of the sink parameter
is its rows' share, and the data-parallel gradient sum over the SP group adds the shares (zero elsewhere).
"""

from __future__ import annotations

import torch


def _per_head(sinks: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The sinks [H] as a float32 [1, H, 1] broadcast against ``like`` [B, H, n]."""
    if sinks.dim() != 1 or sinks.shape[0] != like.shape[1]:
        raise RuntimeError(f"autosp: attention sinks of shape {tuple(sinks.shape)} for {like.shape[1]} heads")
    return sinks.float().view(1, -1, 1)


def fold_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> None:
    """Merge the sinks into the float32 accumulators (out [B, H, n, d], lse [B, H, n]) of every key, in place."""
    total = torch.logaddexp(lse, _per_head(sinks, lse))
    out.mul_(torch.exp(lse - total).unsqueeze(-1))  # a row that saw no key: exp(-inf) = 0, its output stays 0
    lse.copy_(total)


def sinks_grad(dout: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """The sinks' gradient [H] (in their dtype) from this rank's rows: the attention's output gradient ``dout``,
    its output ``out`` and log-sum-exp ``lse``, both with the sinks folded in."""
    delta = (dout.float() * out.float()).sum(-1)
    return -(torch.exp(_per_head(sinks, lse) - lse) * delta).sum(dim=(0, 2)).to(sinks.dtype)


__all__ = ["fold_sinks", "sinks_grad"]
