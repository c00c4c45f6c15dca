"""The alpha-beta model of a collective and its least-squares fit. Pure Python (no torch, no numpy).

A collective on ``P`` ranks moving a message of ``m`` bytes takes ``t = alpha + f(P) * m / beta``:

- ``alpha`` (seconds) is the fixed latency of one call;
- ``beta`` (bytes/s) is the *bus bandwidth*: what one rank's link carries per second, one direction;
- ``f(P)`` is the fraction of the message each rank's link must carry (the nccl-tests "bus factor"):
  ``(P-1)/P`` for all-to-all, all-gather and reduce-scatter, ``2(P-1)/P`` for all-reduce (ring).

The message size ``m`` follows the nccl-tests convention: the per-rank buffer for all-to-all and
all-reduce, the gathered output for all-gather, the input for reduce-scatter (in every case the larger of
the rank's input and output buffers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

COLLECTIVES = ("all_to_all", "all_reduce", "all_gather", "reduce_scatter")


def bus_factor(collective: str, group_size: int) -> float:
    """Fraction of an ``m``-byte message that crosses each rank's link (0 for a group of one)."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    share = (group_size - 1) / group_size
    if collective == "all_reduce":
        return 2.0 * share
    if collective in COLLECTIVES:
        return share
    raise ValueError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")


def median(values) -> float:
    data = sorted(float(v) for v in values)
    if not data:
        raise ValueError("median of no values")
    mid = len(data) // 2
    return data[mid] if len(data) % 2 else 0.5 * (data[mid - 1] + data[mid])


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted ``t = alpha + x / beta`` with ``x`` the bytes each link carries (``f(P) * m``)."""

    alpha: float
    beta: float
    max_rel_error: float
    points: int

    def predict(self, link_bytes: float) -> float:
        return self.alpha + link_bytes / self.beta


def fit_alpha_beta(link_bytes, seconds) -> AlphaBeta:
    """Least-squares fit of ``t = alpha + x / beta`` to measured ``(x, t)`` points.

    The residuals are *relative* (each point weighted by ``1/t``), so a 4 KiB message that takes 50 us
    counts as much as a 64 MiB one that takes 50 ms; an unweighted fit would let the largest messages
    decide alpha alone. ``alpha`` is constrained to be ``>= 0``: when the unconstrained optimum is
    negative the fit is redone through the origin. ``max_rel_error`` is the worst ``|fit - t| / t``.

    Raises ValueError when there are fewer than two distinct sizes or the time does not grow with size.
    """
    xs = [float(x) for x in link_bytes]
    ts = [float(t) for t in seconds]
    if len(xs) != len(ts):
        raise ValueError("link_bytes and seconds differ in length")
    if len(set(xs)) < 2:
        raise ValueError("an alpha-beta fit needs at least two distinct message sizes")
    if any(not math.isfinite(t) or t <= 0 for t in ts) or any(not math.isfinite(x) or x < 0 for x in xs):
        raise ValueError("times must be positive and sizes non-negative")
    # Weighted least squares for t = a + b x with weights w = 1/t^2 (relative residuals).
    w = [1.0 / (t * t) for t in ts]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, xs))
    st = sum(wi * t for wi, t in zip(w, ts))
    sxx = sum(wi * x * x for wi, x in zip(w, xs))
    sxt = sum(wi * x * t for wi, x, t in zip(w, xs, ts))
    det = sw * sxx - sx * sx
    a = (sxx * st - sx * sxt) / det
    b = (sw * sxt - sx * st) / det
    if a < 0:
        a, b = 0.0, sxt / sxx
    if not b > 0:
        raise ValueError("time does not grow with message size; cannot fit a bandwidth")
    worst = max(abs(a + b * x - t) / t for x, t in zip(xs, ts))
    return AlphaBeta(alpha=a, beta=1.0 / b, max_rel_error=worst, points=len(xs))


__all__ = ["COLLECTIVES", "AlphaBeta", "bus_factor", "fit_alpha_beta", "median"]
