"""Packed documents and sliding windows: how much of the S x S causal triangle attention really computes.

docs/cost_model.md ("Documents and sliding windows") derives everything here; the short version:

- **Work units.** Causal attention over n tokens is priced in units of n^2 (the cost model's 2 S^2 q
  forward FLOPs per layer are S^2 of these units times 2q). A *piece* of p tokens that attends only to
  itself costs p^2; with a sliding window of W tokens (each query sees the W most recent keys, itself
  included: Hugging Face's ``kv > q - W``) it costs 2pW - W^2 once p > W.
- **Kernel time.** Flash attention over n tokens runs at n / (n + n_half) of its long-sequence speed
  (cost_models/ring.py, fitted to FlashAttention-2's benchmark). Kernels run per document, so a piece of p
  tokens takes p^2 + n_half p time units (2pW - W^2 + n_half (2p - W) with a window: the band's rows have
  W keys, so the per-row-block cost is amortised over W, not p).
- **Packing** (the workload's ``doc_lens``, a histogram ``((length, count), ...)``): documents drawn from
  the histogram are laid end to end and the stream is cut every S tokens; a document crossing a
  sequence end is cut there, its rest starts the next sequence. A document starts at offset o of its
  sequence; over a long stream o is uniform on the multiples of g = gcd(S, every length) (a random walk on
  the circle of S positions whose steps are the lengths: its stationary law is uniform on the subgroup the
  steps generate). So k documents of S/k tokens each fill every sequence exactly (1/k of the triangle),
  documents of S tokens are one per sequence (the triangle), and lengths with gcd 1 start anywhere.
- **Expectation.** For one document of l tokens and x = S - o tokens left in its first sequence, its
  pieces are min(l, x), then full sequences of S, then the rest; summed over pieces that is a continuous
  function of x, a quadratic between the breakpoints l, W, r, r - W, r + S - W (l = qS + r), so its mean
  over the lattice is a handful of closed-form sums of quadratics (exact integer arithmetic).

Pure functions of plain integers; memoised, because the planner prices thousands of candidates at a few
sequence lengths.
"""

from __future__ import annotations

import math
from functools import lru_cache
from math import gcd

__all__ = ["BIN_RATIO", "MAX_BINS", "Pricing", "attention_pricing", "cell_moments", "compact_histogram", "doc_stats",
           "piece_moments"]

MAX_BINS = 512
BIN_RATIO = 2.0 ** (1.0 / 16.0)
"""A histogram with more than MAX_BINS distinct lengths is grouped into geometric bins BIN_RATIO (4.4%) wide,
each priced at its mean length (the bin's tokens are kept; its sum of squared lengths is under-counted by
the variance inside the bin, at most (BIN_RATIO - 1)^2 / 12 = 0.02%), so a plan stays a few kilobytes and a
price a few milliseconds whatever the dataset."""


def compact_histogram(counts: dict) -> tuple:
    """((length, count), ...) with increasing lengths from {length: count}, binned past MAX_BINS lengths."""
    pairs = sorted((int(l), int(c)) for l, c in counts.items() if c)
    if len(pairs) <= MAX_BINS:
        return tuple(pairs)
    bins: dict[int, list] = {}
    for length, count in pairs:
        key = int(math.log(length) / math.log(BIN_RATIO))
        acc = bins.setdefault(key, [0, 0])
        acc[0] += length * count
        acc[1] += count
    merged: dict[int, int] = {}
    for tokens, count in bins.values():
        mean = max(1, round(tokens / count))
        merged[mean] = merged.get(mean, 0) + count
    return tuple(sorted(merged.items()))


def piece_moments(p: int, window: int = 0) -> tuple[int, int]:
    """(work, kernel-length term) of one piece of ``p`` tokens: its time is work + n_half x the second.

    work: p^2 (causal triangle), or 2pW - W^2 when a window W < p cuts it; the second term: p, or 2p - W
    (work / W: the band's per-row-block overhead is amortised over W keys)."""
    if p <= 0:
        return 0, 0
    if window <= 0 or p <= window:
        return p * p, p
    return 2 * p * window - window * window, 2 * p - window


def _document_sum(l: int, x: int, S: int, window: int) -> tuple[int, int]:
    """Piece moments of a document of ``l`` tokens with ``x`` tokens left in its first sequence of ``S``."""
    if l <= x:
        return piece_moments(l, window)
    full, last = divmod(l - x, S)
    a0, b0 = piece_moments(x, window)
    af, bf = piece_moments(S, window)
    al, bl = piece_moments(last, window)
    return a0 + full * af + al, b0 + full * bf + bl


def _lattice_sum(l: int, S: int, g: int, window: int) -> tuple[int, int]:
    """Sum over x = g, 2g, ..., S of the document's piece moments (exact: a sum of quadratics per segment)."""
    r = l % S
    points = {l, r}
    if window > 0:
        points |= {window, r - window, r + S - window}
    cuts = sorted({0, S} | {b for b in points if 0 < b < S})
    total_a = total_b = 0
    for lo, hi in zip(cuts, cuts[1:]):
        j0, j1 = lo // g + 1, hi // g      # lattice points x = j g in (lo, hi]: one quadratic piece
        m = j1 - j0 + 1
        if m <= 0:
            continue
        if m <= 3:
            for j in range(j0, j1 + 1):
                a, b = _document_sum(l, j * g, S, window)
                total_a, total_b = total_a + a, total_b + b
            continue
        v0, v1, v2 = (_document_sum(l, (j0 + k) * g, S, window) for k in range(3))
        c1, c2, c3 = m, m * (m - 1) // 2, m * (m - 1) * (m - 2) // 6   # Newton's forward differences
        total_a += c1 * v0[0] + c2 * (v1[0] - v0[0]) + c3 * (v2[0] - 2 * v1[0] + v0[0])
        total_b += c1 * v0[1] + c2 * (v1[1] - v0[1]) + c3 * (v2[1] - 2 * v1[1] + v0[1])
    return total_a, total_b


@lru_cache(maxsize=4096)
def cell_moments(doc_lens: tuple, S: int, window: int = 0) -> tuple[float, float]:
    """Expected (work, kernel-length term) of one sequence of ``S`` tokens cut from the packed stream of
    ``doc_lens`` (((length, count), ...)); work / S^2 is the share of the causal triangle computed."""
    g = S
    for length, _count in doc_lens:
        g = gcd(g, length)
    n = S // g
    num_a = num_b = 0
    tokens = 0
    for length, count in doc_lens:
        a, b = _lattice_sum(length, S, g, window)
        num_a += count * a
        num_b += count * b
        tokens += count * length
    # per document: sum / n (mean over offsets); per sequence: x S / tokens per document
    scale = S / (n * tokens)
    return num_a * scale, num_b * scale


def doc_stats(doc_lens: tuple) -> tuple[int, float]:
    """(documents, mean length in tokens) of a histogram."""
    docs = sum(c for _, c in doc_lens)
    return docs, (sum(l * c for l, c in doc_lens) / docs if docs else 0.0)


class Pricing:
    """Attention of one layer kind under packing and windows, relative to today's whole-sequence triangle.

    ``work``: FLOPs / the S_pad^2 causal triangle's. ``steps``: the time of each ring step (one entry
    without a ring), in units of the triangle's time at the whole-sequence kernel speed; sum(steps) /
    work is the kernel-efficiency factor the step time applies to the FLOPs.
    """

    __slots__ = ("work", "steps")

    def __init__(self, work: float, steps: tuple):
        self.work = work
        self.steps = steps


@lru_cache(maxsize=4096)
def attention_pricing(doc_lens: tuple, S: int, S_pad: int, window: int, R: int, diag: float, off: float,
                      half: float) -> Pricing:
    """Pricing of one layer kind (``window`` 0: global attention) for sequences of ``S`` real tokens padded
    to ``S_pad`` over a ring of ``R`` (``diag``/``off``: the ring's step-0 and off-diagonal block speeds of
    cost_models/ring.py, relative to the whole-sequence kernel; ``half``: the causal kernel's n_half).

    Unpacked (``doc_lens`` empty), the sequence is one document of S_pad tokens (pad tokens are computed
    like real ones, as without windows). Ulysses (R = 1): work = E[sum of piece work] / S^2 and the kernels
    run per document. Ring: zigzag gives each rank two chunks of c = S_pad / 2R tokens; step 0 (its own
    K/V) is priced as the same stream model over cells of 2c tokens, per document (as if its two chunks
    were adjacent: a window between them is counted as if they were); the rest of the work (pairs of
    tokens of one document in different ranks' chunks) is spread evenly over the 2(R - 1) off-diagonal
    c x c blocks a rank computes in steps 1 .. R-1, as causal attention's blocks are, at the off-diagonal
    speed. A document covering the sequence gives exactly the unpacked ring pricing (step 0: a causal
    kernel over 2c tokens = 1/(R diag)); unpacked and unwindowed returns it without computing:
    (1, (1/(R diag), 1/(R off), ...)).
    """
    if not doc_lens and window <= 0:
        if R == 1:
            return Pricing(1.0, (1.0,))
        return Pricing(1.0, (1.0 / (R * diag),) + (1.0 / (R * off),) * (R - 1))
    lens = doc_lens if doc_lens else ((S_pad, 1),)
    seq = S if doc_lens else S_pad
    a, b = cell_moments(lens, seq, window)
    unit_time = seq * seq + half * seq            # the whole-sequence causal kernel's time for seq^2 work
    work = a / (seq * seq)
    if R == 1:
        return Pricing(work, ((a + half * b) / unit_time,))
    own = S_pad // R                               # the rank's two zigzag chunks, 2c tokens
    oa, ob = cell_moments(lens, own, window)
    cells = seq / own
    inside_a, inside_t = cells * oa, cells * (oa + half * ob)
    if inside_a > a:                               # the 2c-grid and S-grid streams differ by the padding
        inside_t, inside_a = inside_t * a / inside_a, a
    cross = (a - inside_a) / (seq * seq)           # work between ranks' chunks, as a share of the triangle
    # per rank, in units of its 1/R share of the triangle's time: its own 2c tokens hold 1/R of the step-0
    # work, run per document; the rest is spread over the 2(R - 1) off-diagonal c x c block slots it computes
    # in steps 1 .. R-1 (R(2R - 2) slots over the ring), at the off-diagonal speed
    step0 = inside_t / unit_time
    rest = 2.0 * cross / (2 * (R - 1)) / off
    return Pricing(work, (step0,) + (rest,) * (R - 1))
