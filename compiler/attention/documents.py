"""Packed documents: where they are, from ``position_ids`` or sequence lengths (pure functions), and the
documents of the batch being trained (what the attention ops read).

Hugging Face's convention (``DataCollatorWithFlattening``, TRL padding-free training): several documents
are concatenated in one row, ``position_ids`` restart at 0 for every document, and labels are -100 at each
document's first token. A document boundary is wherever a position is not its predecessor plus one (the
rule transformers itself uses to find packed sequences), so positions that count up from any offset are
one document, and a restart at any value starts a new one.

- :func:`document_spans`: one row of ``position_ids`` -> the documents as half-open token spans;
- :func:`spans_from_seq_lens` / :func:`position_ids_from_spans`: the explicit form (lengths, or
  cumulative ``cu_seq_lens`` boundaries) and the positions it implies.

The attention ops (:mod:`.ring`, :mod:`.local`) need the documents of the batch at hand, which change at
every call while the compiled graph does not; the runtime publishes them here before it calls the model
(:func:`publish`), keyed by the engine, and the ops read them (:func:`published`) when they run, in the
forward and again in the backward of the same micro-batch (DeepSpeed runs forward, backward, forward, ...).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Span = tuple[int, int]

_PUBLISHED: dict[str, tuple] = {}


def document_spans(position_ids) -> list[Span]:
    """The documents of one row: maximal runs where each position is its predecessor plus one.
    ``position_ids``: a 1-D tensor or sequence of ints. ``[0,1,2,0,1,0]`` -> ``[(0, 3), (3, 5), (5, 6)]``."""
    if isinstance(position_ids, torch.Tensor):
        if position_ids.dim() != 1:
            raise ValueError(f"document_spans takes one row of position_ids, got shape {tuple(position_ids.shape)}")
        n = position_ids.numel()
        if n == 0:
            return []
        breaks = (torch.nonzero(position_ids[1:] - position_ids[:-1] != 1).flatten() + 1).tolist()
    else:
        values = list(position_ids)
        n = len(values)
        if n == 0:
            return []
        breaks = [i for i in range(1, n) if values[i] != values[i - 1] + 1]
    bounds = [0, *breaks, n]
    return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def spans_from_seq_lens(seq_lens: Sequence[int], total: int | None = None) -> list[Span]:
    """Documents of the given lengths, in order from token 0; they must cover ``total`` tokens when given."""
    lens = [int(n) for n in seq_lens]
    if any(n < 1 for n in lens):
        raise ValueError(f"document lengths must be positive, got {lens}")
    spans, start = [], 0
    for n in lens:
        spans.append((start, start + n))
        start += n
    if total is not None and start != total:
        raise ValueError(f"document lengths add up to {start} tokens, the sequence has {total}")
    return spans


def spans_from_cu_seq_lens(cu_seq_lens: Sequence[int], total: int | None = None) -> list[Span]:
    """Documents from cumulative boundaries ``[0, n1, n1+n2, ..., total]`` (FlashAttention's varlen form)."""
    bounds = [int(b) for b in cu_seq_lens]
    if len(bounds) < 2 or bounds[0] != 0:
        raise ValueError(f"cu_seq_lens must start at 0 and hold at least one document, got {bounds}")
    return spans_from_seq_lens([b - a for a, b in zip(bounds, bounds[1:])], total)


def position_ids_from_spans(spans: Sequence[Span]) -> torch.Tensor:
    """The Hugging Face positions of packed documents: 0, 1, ... restarting at every document."""
    return torch.cat([torch.arange(b - a) for a, b in spans]) if spans else torch.zeros(0, dtype=torch.int64)


def publish(key: str, rows: Sequence[Sequence[Span]] | None) -> None:
    """The documents of every row of the micro-batch about to run (global token spans), for engine ``key``;
    None (for the batch or a row): one document per row."""
    _PUBLISHED[key] = None if rows is None else tuple(
        None if row is None else tuple(tuple(s) for s in row) for row in rows)


def published(key: str, batch: int):
    """Per row of the running micro-batch: its documents (a tuple of spans) or None (one document)."""
    if key not in _PUBLISHED:
        raise RuntimeError(f"autosp: no documents published for engine {key!r} (the attention op ran outside "
                           f"the engine's call)")
    rows = _PUBLISHED[key]
    if rows is None:
        return (None,) * batch
    if len(rows) != batch:
        raise RuntimeError(f"autosp: documents published for {len(rows)} rows, the attention block has {batch}")
    return rows


__all__ = ["document_spans", "position_ids_from_spans", "publish", "published", "spans_from_cu_seq_lens",
           "spans_from_seq_lens"]
