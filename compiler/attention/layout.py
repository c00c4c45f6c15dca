"""Where the tokens live under 2-D sequence parallelism (Ulysses x Ring), with causal load balance.

An SP group of P = U x R ranks: SP rank ``r * U + u`` is Ulysses rank u of ring position r (the U ranks of
one ring position are consecutive, so a Ulysses group stays inside a node; a ring group takes every U-th
rank and crosses nodes). The padded sequence of S tokens is cut into 2R chunks of c = S / 2R tokens, and

- ring position r holds chunks r and 2R-1-r ("head-tail" or zigzag: torch context parallel's
  ``_HeadTailLoadBalancer`` order, checked equal in the tests), so that under causal attention every ring
  position does the same work: chunk r is early (sees little), chunk 2R-1-r late (sees much);
- within the ring position, those 2c tokens (in that order) are split contiguously over its U ranks, s =
  S / P tokens each. After the Ulysses all-to-all every rank of the ring position holds all 2c tokens (for
  H / U heads) in that order, which is the block the ring passes around.

With R = 1 this is the contiguous split of plain Ulysses (chunks 0 and 1 are adjacent). Every rank's
tokens are in increasing global order, possibly with one jump (where its slice crosses from chunk r to
chunk 2R-1-r), which is what lets the causal mask of a rank's own tokens stay lower-triangular.

Sequence-chunked layers (plan knob ``sequence_chunks`` = n, :mod:`autosp.compiler.chunked_layer`): the
sequence is first cut into n global chunks and each is sharded as above, so a rank's local chunk i is its share
of global chunk i (FPDT's layout). After chunk i's all-to-all the rank holds global chunk i (for its heads),
which attends only global chunks <= i. A rank's rows are still in increasing global order.

Pure functions of (S, U, R, rank): the runtime uses them to shard, the position pass to give the tokens
their global positions, the ring attention op to know what each ring position holds.
"""

from __future__ import annotations

import math

import torch

from autosp.compiler.attention.pieces import Span, join_adjacent


def pad_multiple(ulysses: int, ring: int) -> int:
    """S must be a multiple of this: 2R chunks, each ring position's 2c tokens split over U ranks."""
    sp = ulysses * ring
    if ring == 1:
        return sp
    return sp * 2 * ring // math.gcd(sp, 2 * ring)


def ring_spans(seq_len: int, ring: int) -> list[list[Span]]:
    """The global spans of each ring position, in the order its block lays them out."""
    if ring == 1:
        return [[(0, seq_len)]]
    if seq_len % (2 * ring):
        raise ValueError(f"{seq_len} tokens do not split into {2 * ring} chunks")
    c = seq_len // (2 * ring)
    return [[(j * c, (j + 1) * c), ((2 * ring - 1 - j) * c, (2 * ring - j) * c)] for j in range(ring)]


def slice_spans(spans, start: int, stop: int) -> list[Span]:
    """Rows ``[start, stop)`` of a block laid out as ``spans``, as global spans."""
    out, offset = [], 0
    for a, b in spans:
        lo, hi = max(start, offset), min(stop, offset + b - a)
        if lo < hi:
            out.append((a + lo - offset, a + hi - offset))
        offset += b - a
    return join_adjacent(out)


def rank_spans(seq_len: int, ulysses: int, ring: int, sp_rank: int) -> list[Span]:
    """The global spans SP rank ``sp_rank`` holds (its rows in order), S / P tokens in all."""
    sp = ulysses * ring
    if seq_len % pad_multiple(ulysses, ring):
        raise ValueError(f"{seq_len} tokens do not shard over {ulysses} x {ring} ranks")
    r, u = divmod(sp_rank, ulysses)
    s = seq_len // sp
    return slice_spans(ring_spans(seq_len, ring)[r], u * s, (u + 1) * s)


# --- sequence-chunked layers (plan knob sequence_chunks) ---------------------------------------------------
def chunk_sizes(local_len: int, chunks: int) -> list[int]:
    """How many of a rank's ``local_len`` tokens each of its ``chunks`` chunks holds (``torch.tensor_split``'s
    split: the first ``local_len % chunks`` chunks one token longer)."""
    base, extra = divmod(local_len, chunks)
    return [base + (1 if i < extra else 0) for i in range(chunks)]


def chunked_pad_multiple(ulysses: int, ring: int, chunks: int) -> int:
    """S must be a multiple of this with ``chunks`` > 1. Without a ring: of P (chunks may differ by one token);
    with a ring every global chunk is laid out like a whole sequence (:func:`ring_spans`), so all chunks are
    equal and each a multiple of :func:`pad_multiple`."""
    if chunks == 1 or ring == 1:
        return pad_multiple(ulysses, ring)
    return pad_multiple(ulysses, ring) * chunks


def chunk_starts(seq_len: int, sp: int, chunks: int) -> list[int]:
    """The global start of each global chunk (and the end): global chunk i holds every rank's local chunk i,
    ``sp`` times its size."""
    starts = [0]
    for c in chunk_sizes(seq_len // sp, chunks):
        starts.append(starts[-1] + sp * c)
    return starts


def _shift(spans, offset: int) -> list[Span]:
    return [(a + offset, b + offset) for a, b in spans]


def chunk_ring_spans(seq_len: int, ulysses: int, ring: int, chunks: int, index: int) -> list[list[Span]]:
    """The global spans of global chunk ``index`` that each ring position holds after the Ulysses all-to-all,
    in row order: the chunk laid out as a whole sequence would be (:func:`ring_spans`), shifted to its start."""
    starts = chunk_starts(seq_len, ulysses * ring, chunks)
    size = starts[index + 1] - starts[index]
    return [_shift(spans, starts[index]) for spans in ring_spans(size, ring)]


def chunked_rank_spans(seq_len: int, ulysses: int, ring: int, chunks: int, sp_rank: int) -> list[Span]:
    """The global spans SP rank ``sp_rank`` holds with sequence-chunked layers, in row order.

    The sequence is cut into ``chunks`` global chunks; each is sharded over the SP group exactly as a whole
    sequence would be (:func:`rank_spans`), and the rank's local chunk i is its share of global chunk i. So
    after the per-chunk Ulysses all-to-all the rank holds the whole global chunk i (for its heads), chunk i
    attends only chunks <= i, and every rank does the same causal work. ``chunks`` = 1 is :func:`rank_spans`."""
    if chunks == 1:
        return rank_spans(seq_len, ulysses, ring, sp_rank)
    sp = ulysses * ring
    if seq_len % chunked_pad_multiple(ulysses, ring, chunks):
        raise ValueError(f"{seq_len} tokens do not shard over {ulysses} x {ring} ranks in {chunks} chunks")
    starts = chunk_starts(seq_len, sp, chunks)
    out: list[Span] = []
    for i in range(chunks):
        size = starts[i + 1] - starts[i]
        out += _shift(rank_spans(size, ulysses, ring, sp_rank), starts[i])
    return join_adjacent(out)


def span_index(spans, device=None) -> torch.Tensor:
    """The global token indices of ``spans``, in order (to gather a rank's tokens from the sequence)."""
    return torch.cat([torch.arange(a, b, device=device) for a, b in spans])


def flat_ranges(seq_len: int, ring: int) -> list[int]:
    """:func:`ring_spans` flattened to ``[start, stop, start, stop, ...]`` per ring position, in order (how the
    ring attention op receives it: every ring position holds the same number of spans)."""
    return [x for spans in ring_spans(seq_len, ring) for span in spans for x in span]


def unflatten_ranges(ranges, ring: int) -> list[list[Span]]:
    values = list(ranges)
    if len(values) % (2 * ring):
        raise ValueError(f"{len(values)} range bounds do not describe {ring} ring positions")
    per = len(values) // ring
    return [[(values[j * per + i], values[j * per + i + 1]) for i in range(0, per, 2)] for j in range(ring)]


__all__ = ["chunk_ring_spans", "chunk_sizes", "chunk_starts", "chunked_pad_multiple", "chunked_rank_spans",
           "flat_ranges", "pad_multiple", "rank_spans", "ring_spans", "slice_spans", "span_index",
           "unflatten_ranges"]
