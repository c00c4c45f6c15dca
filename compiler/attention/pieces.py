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
global token coordinates): causal, optionally restricted to a sliding window of W tokens (key j visible to
query i iff i - W < j <= i, the Hugging Face convention: a query sees W tokens including itself).
:func:`attention_pieces` adds packed documents by cutting both spans at the document boundaries first and
pairing only the parts inside one document (each pair is then causal, or windowed, exactly as one sequence).
A window needs a third piece kind besides full pieces and causal diagonals: its far edge, the aligned
square of queries ``[a, a+n)`` over keys ``[a-W+1, a-W+1+n)`` where row i attends key rows >= i
(``mirrored``: SDPA's ``is_causal`` with both row orders reversed). Queries are cut into chunks of W-1
tokens; each chunk sees a causal diagonal, a full middle and a mirrored far edge (fewer when clipped).

:func:`attention_pieces` maps every span pair through it into block-local rows and coalesces adjacent
full pieces, so e.g. a zigzag ring step is one SDPA call instead of two.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

Span = tuple[int, int]
"""A half-open range of global token positions ``[start, stop)``."""


@dataclass(frozen=True)
class Piece:
    """Query rows ``[q_start, q_stop)`` attend key rows ``[k_start, k_stop)`` of their blocks (block-local
    rows); ``causal``: a square whose row i attends key rows <= i (the same tokens on both sides), or with
    ``mirrored`` key rows >= i (a sliding window's far edge: the keys are the queries shifted back by W-1)."""

    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    causal: bool
    mirrored: bool = False

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


def _causal(q: Span, k: Span) -> list[tuple[Span, Span, bool]]:
    """Key j visible to query i iff j <= i; ``(query span, key span, causal)`` in global coordinates."""
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


def _far_edge(q: Span, k: Span, reach: int) -> list[tuple[Span, Span, bool]]:
    """Key j visible to query i iff j >= i - reach (the caller guarantees j <= i for every pair). It is the
    causal rule reflected (x -> -x, queries shifted by ``reach``): its causal squares come back mirrored."""
    qa, qb = q
    ka, kb = k
    if qa >= qb or ka >= kb:
        return []

    def back(span):                                  # a reflected span [a, b) is the tokens [1 - b, 1 - a)
        return 1 - span[1], 1 - span[0]

    out = []
    for qs, ks, causal in _causal((reach + 1 - qb, reach + 1 - qa), (1 - kb, 1 - ka)):
        a, b = back(qs)
        out.append(((a + reach, b + reach), back(ks), causal))
    return out


def span_pieces(q: Span, k: Span, window: int | None = None) -> list[tuple[Span, Span, bool]]:
    """The causal rule on one query span and one key span (global positions): key j is visible to query i
    iff j <= i and, with a sliding ``window`` W, i - j < W. Returns ``(query span, key span, kind)`` pieces
    in global coordinates, kind ``False`` (full), ``True`` (causal diagonal) or ``"mirrored"`` (far edge)."""
    qa, qb = q
    ka, kb = k
    if qa >= qb or ka >= kb:
        return []
    if window is None or qb - 1 - ka < window:       # no pair is W or more apart: plain causal
        return _causal(q, k)
    if window < 1:
        raise ValueError(f"a sliding window must be at least 1 token, got {window}")
    out = []
    n = max(1, window - 1)                           # query chunks of W-1: diagonal, full middle, far edge
    for a in range(max(qa, ka), min(qb, kb + window - 1), n):
        b = min(a + n, qb)
        edge_stop = min(a, a - window + 1 + (b - a))  # keys [a-W+1, edge_stop): far edge; [edge_stop, a): full
        out += _causal((a, b), (max(ka, a), min(kb, b)))
        lo, hi = max(ka, edge_stop), min(kb, a)
        if lo < hi:
            out.append(((a, b), (lo, hi), False))
        out += [(qs, ks, "mirrored" if causal else False)
                for qs, ks, causal in _far_edge((a, b), (max(ka, a - window + 1), min(kb, edge_stop)), window - 1)]
    return out


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


def _document_parts(span: Span, documents, starts) -> dict[int, Span]:
    """{document index: the part of ``span`` inside it} (``documents`` sorted, ``starts`` their starts)."""
    a, b = span
    out = {}
    i = max(0, bisect.bisect_right(starts, a) - 1)
    while i < len(documents) and documents[i][0] < b:
        lo, hi = max(a, documents[i][0]), min(b, documents[i][1])
        if lo < hi:
            out[i] = (lo, hi)
        i += 1
    return out


def attention_pieces(q_spans, k_spans, documents=None, window: int | None = None) -> list[Piece]:
    """Every piece of attention between a query block and a key/value block (block-local rows).

    ``documents``: the packed documents as sorted, disjoint global spans covering the tokens (None: one
    document); a query attends only keys of its own document. ``window``: a sliding window of W tokens."""
    q_spans, k_spans = join_adjacent(q_spans), join_adjacent(k_spans)
    q_off, k_off = _offsets(q_spans), _offsets(k_spans)
    starts = [d[0] for d in documents] if documents else None
    pieces = []
    for qs, qo in zip(q_spans, q_off):
        for ks, ko in zip(k_spans, k_off):
            if documents:
                k_parts = _document_parts(ks, documents, starts)
                pairs = [(qd, k_parts[i]) for i, qd in _document_parts(qs, documents, starts).items() if i in k_parts]
            else:
                pairs = [(qs, ks)]
            for qd, kd in pairs:
                for (qa, qb), (ka, kb), kind in span_pieces(qd, kd, window):
                    pieces.append(Piece(qa - qs[0] + qo, qb - qs[0] + qo, ka - ks[0] + ko, kb - ks[0] + ko,
                                        bool(kind), kind == "mirrored"))
    return coalesce(pieces)


def _join_runs(full: list[Piece], by_keys: bool) -> tuple[list[Piece], bool]:
    """One sweep joining full pieces with the same key rows and touching query rows (``by_keys``), or the
    same query rows and touching key rows."""
    def fixed(p):
        return (p.k_start, p.k_stop) if by_keys else (p.q_start, p.q_stop)

    def moving(p):
        return (p.q_start, p.q_stop) if by_keys else (p.k_start, p.k_stop)

    out, changed = [], False
    for p in sorted(full, key=lambda p: (fixed(p), moving(p))):
        last = out[-1] if out else None
        if last is not None and fixed(last) == fixed(p) and moving(last)[1] == moving(p)[0]:
            out[-1] = (Piece(last.q_start, p.q_stop, last.k_start, last.k_stop, False) if by_keys
                       else Piece(last.q_start, last.q_stop, last.k_start, p.k_stop, False))
            changed = True
        else:
            out.append(p)
    return out, changed


def coalesce(pieces: list[Piece]) -> list[Piece]:
    """Join full pieces that share their key rows and touch in query rows (or the other way round): fewer,
    larger SDPA calls for the same pairs. Sort-and-sweep until nothing joins (n log n per sweep: a packed
    sequence can give thousands of pieces)."""
    full = [p for p in pieces if not p.causal]
    changed = True
    while changed:
        full, by_q = _join_runs(full, by_keys=True)
        full, by_k = _join_runs(full, by_keys=False)
        changed = by_q or by_k
    return sorted([p for p in pieces if p.causal] + full, key=lambda p: (p.q_start, p.k_start))


__all__ = ["Piece", "Span", "attention_pieces", "coalesce", "join_adjacent", "span_pieces"]
