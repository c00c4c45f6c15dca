"""Which parts of a query block attend which parts of a key/value block, and how.

Blockwise attention (ring attention, sequence-chunked layers) never builds a mask. A *block* is a list of
the global token ranges ("spans") it holds, in the order its rows are laid out: ``[(0, 4), (12, 16)]`` is
an 8-row block whose rows 0-3 are tokens 0-3 and rows 4-7 tokens 12-15 (the zigzag layout of
:mod:`.layout`). For one query block and one key/value block, :func:`attention_pieces` returns the
rectangles of (query rows, key rows) that attend, each either

- ``causal=False``: every query row attends every key row (one plain SDPA call, no mask), or
- ``causal=True``: a square whose query and key rows are the same tokens: row i attends key rows <= i
  (SDPA's ``is_causal``, top-left aligned).

Rows absent from every piece attend nothing in this key block (they get log-sum-exp -inf and no
contribution when the partial results are merged, :mod:`.merge`). Pieces never overlap, and together they
cover exactly the (query, key) pairs the attention rule allows, so summing the pieces' contributions by
log-sum-exp is exact.

The attention rule lives in ONE function, :func:`span_pieces` (one query span against one key span, in
global token coordinates). It is causal today. The refinements later work needs go there and nowhere
else, still without a mask:

- packed documents: cut both spans at the document boundaries and keep only pairs inside one document
  (each such pair is then causal exactly as now);
- sliding windows of W tokens: drop keys below ``q - W + 1``; cutting the spans every W tokens leaves
  full pieces, causal diagonals and their mirror image (key >= query - W + 1 on an aligned square,
  which is SDPA's ``is_causal`` on both row orders reversed) as a third kind.

:func:`attention_pieces` maps every span pair through it into block-local rows and coalesces adjacent
full pieces, so e.g. a zigzag ring step is one SDPA call instead of two.
"""

from __future__ import annotations

from dataclasses import dataclass

Span = tuple[int, int]
"""A half-open range of global token positions ``[start, stop)``."""


@dataclass(frozen=True)
class Piece:
    """Query rows ``[q_start, q_stop)`` attend key rows ``[k_start, k_stop)`` of their blocks (block-local
    rows); ``causal``: the square is the same tokens on both sides and row i attends key rows <= i."""

    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    causal: bool

    @property
    def q(self) -> slice:
        return slice(self.q_start, self.q_stop)

    @property
    def k(self) -> slice:
        return slice(self.k_start, self.k_stop)

    @property
    def pairs(self) -> int:
        """How many (query, key) pairs the piece computes (its share of the attention work)."""
        n, m = self.q_stop - self.q_start, self.k_stop - self.k_start
        return n * (n + 1) // 2 if self.causal else n * m


def span_pieces(q: Span, k: Span) -> list[tuple[Span, Span, bool]]:
    """The causal rule on one query span and one key span (global positions): key j is visible to query i
    iff j <= i. Returns ``(query span, key span, causal)`` pieces in global coordinates."""
    qa, qb = q
    ka, kb = k
    if qa >= qb or ka >= kb or ka > qb - 1:          # empty, or every key after every query
        return []
    if kb - 1 <= qa:                                 # every key at or before the first query
        return [((qa, qb), (ka, kb), False)]
    out = []
    if ka < qa:                                      # keys before the first query: seen by every query
        out.append(((qa, qb), (ka, qa), False))
    m = max(ka, qa)                                  # the rest starts on the diagonal: queries < m see none
    e = min(kb, qb)
    out.append(((m, e), (m, e), True))
    if qb > kb:                                      # queries past the last key see all of [m, kb)
        out.append(((kb, qb), (m, kb), False))
    return out                                       # keys >= qb (if any) are seen by no query


def join_adjacent(spans) -> list[Span]:
    """The same rows with touching spans joined (``[(0, 4), (4, 8)]`` -> ``[(0, 8)]``): fewer, larger pieces."""
    out: list[Span] = []
    for a, b in spans:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _offsets(spans) -> list[int]:
    out, total = [], 0
    for a, b in spans:
        out.append(total)
        total += b - a
    return out


def attention_pieces(q_spans, k_spans) -> list[Piece]:
    """Every piece of attention between a query block and a key/value block (block-local rows)."""
    q_spans, k_spans = join_adjacent(q_spans), join_adjacent(k_spans)
    q_off, k_off = _offsets(q_spans), _offsets(k_spans)
    pieces = []
    for qs, qo in zip(q_spans, q_off):
        for ks, ko in zip(k_spans, k_off):
            for (qa, qb), (ka, kb), causal in span_pieces(qs, ks):
                pieces.append(Piece(qa - qs[0] + qo, qb - qs[0] + qo, ka - ks[0] + ko, kb - ks[0] + ko, causal))
    return coalesce(pieces)


def coalesce(pieces: list[Piece]) -> list[Piece]:
    """Join full pieces that share their key rows and touch in query rows (or the other way round): fewer,
    larger SDPA calls for the same pairs."""
    pieces = list(pieces)
    changed = True
    while changed:
        changed = False
        for i, a in enumerate(pieces):
            if a.causal:
                continue
            for j, b in enumerate(pieces):
                if j == i or b.causal:
                    continue
                joined = None
                if (a.k_start, a.k_stop) == (b.k_start, b.k_stop) and a.q_stop == b.q_start:
                    joined = Piece(a.q_start, b.q_stop, a.k_start, a.k_stop, False)
                elif (a.q_start, a.q_stop) == (b.q_start, b.q_stop) and a.k_stop == b.k_start:
                    joined = Piece(a.q_start, a.q_stop, a.k_start, b.k_stop, False)
                if joined is not None:
                    pieces = [p for n, p in enumerate(pieces) if n not in (i, j)] + [joined]
                    changed = True
                    break
            if changed:
                break
    return sorted(pieces, key=lambda p: (p.q_start, p.k_start))


__all__ = ["Piece", "Span", "attention_pieces", "coalesce", "join_adjacent", "span_pieces"]
