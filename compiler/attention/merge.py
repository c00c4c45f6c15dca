"""Merging partial attention results by their log-sum-exp.

Attention of a query row over keys K = K1 u K2 (disjoint) from the partial results over K1 and K2:

    lse = log(exp(lse1) + exp(lse2))
    out = out1 * exp(lse1 - lse) + out2 * exp(lse2 - lse)

exact, in any order and any grouping (it is a weighted mean whose weights are the softmax mass of each
part). A row that saw no key in a part has lse -inf there and weight 0; a row that saw no key at all keeps
lse -inf and output 0. Accumulate in float32 (the ring keeps float32 accumulators whatever the model's
dtype).
"""

from __future__ import annotations

import torch


def _weight(part: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    # exp(part - total), with 0 where the row has seen nothing at all (-inf - -inf would be nan)
    return torch.where(torch.isneginf(total), torch.zeros_like(total), torch.exp(part - total))


def merge_partials(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                   lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of the union of two disjoint key sets. out [..., n, d], lse [..., n]."""
    lse = torch.logaddexp(lse_a, lse_b)
    out = out_a * _weight(lse_a, lse).unsqueeze(-1) + out_b * _weight(lse_b, lse).unsqueeze(-1)
    return out, lse


def merge_into(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
               rows: slice) -> None:
    """Merge a piece's (out, lse) for query rows ``rows`` into the float32 accumulators, in place.
    acc_out [B, H, n, d], acc_lse [B, H, n]; out/lse cover just ``rows``."""
    merged_out, merged_lse = merge_partials(acc_out[:, :, rows], acc_lse[:, :, rows], out.float(), lse.float())
    acc_out[:, :, rows] = merged_out
    acc_lse[:, :, rows] = merged_lse


def empty_accumulators(q: torch.Tensor, head_dim_v: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of a row that has seen no key yet: zeros and -inf, float32."""
    b, h, n, d = q.shape
    out = torch.zeros(b, h, n, head_dim_v or d, dtype=torch.float32, device=q.device)
    lse = torch.full((b, h, n), float("-inf"), dtype=torch.float32, device=q.device)
    return out, lse


__all__ = ["empty_accumulators", "merge_into", "merge_partials"]
