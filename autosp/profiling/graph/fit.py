"""Least-squares fits of a measured quantity against the sequence length (plain Python, no numpy).

Bytes and memory traffic are fitted as ``a + b*s`` (a per-step constant plus a per-token slope),
FLOPs as ``a*s + c*s^2`` (matmul work linear in the tokens, attention work quadratic). Each fit
reports its relative residual: the largest |measured - fitted| over the points, divided by the
largest |measured|. On a traced transformer every quantity is exactly of its form (shapes are
exact under FakeTensorMode), so a residual above ~1e-9 means the model does something the form
cannot express (an S x S tensor kept for backward, a sequence-dependent branch) and is reported.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fit:
    coef: tuple      # (a, b) for "linear", (a, c) for "flops"
    kind: str
    residual: float

    def __call__(self, s: float) -> float:
        x, y = self.coef
        return x + y * s if self.kind == "linear" else x * s + y * s * s


def _solve2(a11: float, a12: float, a22: float, b1: float, b2: float) -> tuple[float, float]:
    det = a11 * a22 - a12 * a12
    if det == 0:
        raise ValueError("degenerate fit: give at least two distinct sequence lengths")
    return (b1 * a22 - a12 * b2) / det, (a11 * b2 - a12 * b1) / det


def _residual(fit_fn, xs, ys) -> float:
    scale = max(abs(y) for y in ys)
    if scale == 0:
        return 0.0
    return max(abs(y - fit_fn(x)) for x, y in zip(xs, ys)) / scale


def fit_linear(xs, ys) -> Fit:
    """``y = a + b*x`` by least squares."""
    xs, ys = [float(x) for x in xs], [float(y) for y in ys]
    n = len(xs)
    if n < 2 or len(ys) != n:
        raise ValueError("fit_linear needs at least two (x, y) points")
    m = max(abs(x) for x in xs) or 1.0   # solve in x/m for conditioning
    ts = [x / m for x in xs]
    st, stt = sum(ts), sum(t * t for t in ts)
    sy, sty = sum(ys), sum(t * y for t, y in zip(ts, ys))
    a, b = _solve2(n, st, stt, sy, sty)
    b = b / m
    if all(y == ys[0] for y in ys):   # constant: keep it exact
        a, b = ys[0], 0.0
    fit = Fit((a, b), "linear", 0.0)
    return Fit((a, b), "linear", _residual(fit, xs, ys))


def fit_flops(xs, ys) -> Fit:
    """``y = a*x + c*x^2`` by least squares (no constant term: no tokens, no work)."""
    xs, ys = [float(x) for x in xs], [float(y) for y in ys]
    if len(xs) < 2 or len(ys) != len(xs):
        raise ValueError("fit_flops needs at least two (x, y) points")
    m = max(abs(x) for x in xs) or 1.0   # solve in x/m for conditioning
    ts = [x / m for x in xs]
    s2 = sum(t ** 2 for t in ts)
    s3 = sum(t ** 3 for t in ts)
    s4 = sum(t ** 4 for t in ts)
    b1 = sum(t * y for t, y in zip(ts, ys))
    b2 = sum(t * t * y for t, y in zip(ts, ys))
    a, c = _solve2(s2, s3, s4, b1, b2)
    a, c = a / m, c / (m * m)
    fit = Fit((a, c), "flops", 0.0)
    return Fit((a, c), "flops", _residual(fit, xs, ys))


def clean(value: float, tol: float = 1e-9) -> float:
    """Round away floating-point dust: a value within a relative ``tol`` of an integer becomes that
    integer (per-token sizes and FLOPs of a traced model are integers; least squares adds dust)."""
    nearest = round(value)
    if abs(value - nearest) <= tol * max(1.0, abs(value)):
        return float(nearest)
    return value


def clean_ratio(value: float) -> float:
    """A ratio rounded to 12 significant digits (2.4999999999999996 -> 2.5)."""
    return float(f"{value:.12g}")


__all__ = ["Fit", "clean", "clean_ratio", "fit_flops", "fit_linear"]
