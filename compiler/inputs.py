"""Per-rank inputs: the runtime half of the exact SP semantics (docs/design.md section 2).

Every rank receives the full batch. :func:`shard_batch` turns it into this rank's inputs:

1. validate: a user ``attention_mask`` must be right padding (ones then zeros) and every label at a
   padded position must be ``ignore_index``; it is then dropped, because under causal attention real
   tokens never see later pads and the pads' own predictions are ignored. Left padding and a mask with
   holes are errors. Packed documents come as ``position_ids`` restarting per document (Hugging Face's
   convention), or as ``seq_lens`` / ``cu_seq_lens`` (which then give those ``position_ids``): each row's
   documents are found (:func:`~autosp.compiler.attention.documents.document_spans`) and returned as
   global token spans, for the attention ops; the labels are the user's (-100 at each document's first
   token, in the convention, so no target crosses a boundary);
2. take this DP rank's rows;
3. shift the labels by one over the *full* sequence (the last position gets ``ignore_index``);
4. pad S up to a multiple of P (with a ring of R > 1 ranks: of P and 2R) and of ``pad_to_multiple_of``
   with pad tokens whose labels are ignored; never truncate;
5. take this SP rank's tokens of input ids, shifted labels and position ids: the contiguous chunk
   ``[r*s, (r+1)*s)`` (Ulysses), or with a ring its zigzag share (:mod:`autosp.compiler.attention.layout`:
   ring position r holds chunks r and 2R-1-r of 2R, split over its U Ulysses ranks), labels and positions
   permuted with the tokens; with sequence-chunked layers (``chunks`` > 1) the same within each of the
   ``chunks`` global chunks (:func:`~autosp.compiler.attention.layout.chunked_rank_spans`). Every returned
   tensor is a fresh, contiguous tensor (Dynamo would merge an input passed twice, e.g. ``labels is
   input_ids``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from autosp.compiler.attention.documents import (
    document_spans,
    position_ids_from_spans,
    spans_from_cu_seq_lens,
    spans_from_seq_lens,
)
from autosp.compiler.attention.layout import chunked_pad_multiple, chunked_rank_spans, span_index
from autosp.errors import UsageError


@dataclass
class LocalBatch:
    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor | None
    global_len: int        # S after padding
    local_len: int         # S / P
    seq_len: int           # S as given
    n_valid: int           # valid targets in this DP rank's rows (all SP shards together)
    spans: list            # the global token spans this rank holds, in order
    documents: list | None = None  # per row of this DP rank: its packed documents (global spans, pads in the
    #                                last one); None when every row is one sequence
    real: torch.Tensor | None = None  # [rows, local] 1.0 where this rank's token is real: neither a pad the runtime
    #                                   appended nor one the attention_mask marks (the router loss counts these)


def _check_attention_mask(mask: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> None:
    if mask.shape != labels.shape:
        raise UsageError(f"attention_mask has shape {tuple(mask.shape)} but the batch is {tuple(labels.shape)}")
    if mask.dim() != 2:
        raise UsageError("only a 2-D [batch, seq] attention_mask (padding mask) is supported with sequence "
                         "parallelism; 4-D masks are not")
    m = mask.to(torch.int64)
    if not bool(((m == 0) | (m == 1)).all()):
        raise UsageError("attention_mask must hold only 0 and 1")
    if bool((m[:, 1:] > m[:, :-1]).any()):
        if bool((m[:, 0] == 0).any()) and bool((m[:, -1] == 1).any()):
            raise UsageError("left-padded attention_mask is not supported with sequence parallelism: pad on the "
                             "right (causal attention then needs no mask)")
        raise UsageError("attention_mask has holes (packed documents or left padding): not supported with sequence "
                         "parallelism, only right padding is")
    bad = (m == 0) & (labels != ignore_index)
    if bool(bad.any()):
        raise UsageError(f"labels at padded positions (attention_mask == 0) must be ignore_index={ignore_index}: "
                         f"autosp drops the right-padding mask (causal attention makes it unnecessary), and the "
                         f"predictions at pad positions are exact only when they are ignored")


def _check_position_ids(position_ids: torch.Tensor, shape) -> torch.Tensor:
    if not isinstance(position_ids, torch.Tensor):
        raise UsageError("position_ids must be a [batch, seq] tensor")
    if position_ids.dim() == 1:
        position_ids = position_ids.unsqueeze(0)
    if position_ids.dim() != 2 or position_ids.shape[-1] != shape[1] or position_ids.shape[0] not in (1, shape[0]):
        raise UsageError(f"position_ids of shape {tuple(position_ids.shape)} do not match the batch {tuple(shape)}")
    if position_ids.is_floating_point() or bool((position_ids < 0).any()):
        raise UsageError("position_ids must be non-negative integers")
    return position_ids.expand(shape[0], -1)


def _rows_from_lengths(seq_lens, cu_seq_lens, shape) -> list:
    """Each row's documents from ``seq_lens`` (one list of lengths for every row, or one per row) or
    ``cu_seq_lens`` (cumulative boundaries over the flattened batch, FlashAttention's varlen form)."""
    batch, seq = shape
    if seq_lens is not None and cu_seq_lens is not None:
        raise UsageError("pass seq_lens or cu_seq_lens, not both")
    try:
        if cu_seq_lens is not None:
            bounds = [int(b) for b in (cu_seq_lens.flatten().tolist() if isinstance(cu_seq_lens, torch.Tensor)
                                       else cu_seq_lens)]
            if any(b not in bounds for b in range(0, batch * seq + 1, seq)):
                raise ValueError(f"cu_seq_lens must hold every row boundary (multiples of {seq} up to {batch * seq})")
            spans = spans_from_cu_seq_lens(bounds, batch * seq)
            return [[(a - r * seq, b - r * seq) for a, b in spans if r * seq <= a < (r + 1) * seq] for r in range(batch)]
        lens = seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else list(seq_lens)
        if lens and all(isinstance(n, (list, tuple)) for n in lens):
            if len(lens) != batch:
                raise ValueError(f"seq_lens has {len(lens)} rows, the batch {batch}")
            return [spans_from_seq_lens(row, seq) for row in lens]
        return [spans_from_seq_lens(lens, seq)] * batch
    except (TypeError, ValueError) as err:
        name = "cu_seq_lens" if cu_seq_lens is not None else "seq_lens"
        raise UsageError(f"{name}: {err}") from None


def shard_batch(input_ids: torch.Tensor, labels: torch.Tensor, *, sp: int, sp_rank: int, dp: int, dp_rank: int,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                ignore_index: int = -100, pad_token_id: int = 0, pad_to_multiple_of: int = 1,
                micro_batch: int | None = None, make_position_ids: bool = False,
                device: torch.device | str | None = None, ring: int = 1, chunks: int = 1, seq_lens=None,
                cu_seq_lens=None) -> LocalBatch:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise UsageError("input_ids must be a [batch, seq] tensor")
    if not isinstance(labels, torch.Tensor) or labels.shape != input_ids.shape:
        raise UsageError("labels must be a tensor with the same [batch, seq] shape as input_ids")
    batch, seq = input_ids.shape
    if batch % dp:
        raise UsageError(f"the batch of {batch} sequences does not split over {dp} data-parallel groups")
    if micro_batch is not None and batch != dp * micro_batch:
        raise UsageError(f"expected the full batch of dp x micro_batch = {dp} x {micro_batch} = {dp * micro_batch} "
                         f"sequences on every rank, got {batch}")
    if attention_mask is not None:
        _check_attention_mask(attention_mask, labels, ignore_index)
    if position_ids is not None:
        position_ids = _check_position_ids(position_ids, input_ids.shape)
    if seq_lens is not None or cu_seq_lens is not None:
        rows = _rows_from_lengths(seq_lens, cu_seq_lens, input_ids.shape)
        implied = torch.stack([position_ids_from_spans(r) for r in rows]).to(input_ids.device)
        if position_ids is not None and not torch.equal(position_ids.to(implied.device), implied):
            raise UsageError("position_ids and seq_lens/cu_seq_lens describe different documents: pass one of them")
        position_ids = implied
    elif position_ids is None and make_position_ids:
        position_ids = torch.arange(seq, device=input_ids.device).unsqueeze(0).expand(batch, -1)

    rows = slice(dp_rank * (batch // dp), (dp_rank + 1) * (batch // dp))
    ids, lab = input_ids[rows], labels[rows]
    real = attention_mask[rows].to(ids.device, torch.float32) if attention_mask is not None \
        else torch.ones(ids.shape, device=ids.device)
    pos = position_ids[rows] if position_ids is not None else None

    shifted = torch.full_like(lab, ignore_index)
    shifted[:, :-1] = lab[:, 1:]

    if ring < 1 or sp % ring:
        raise UsageError(f"ring={ring} must divide sp={sp}")
    shard_multiple = chunked_pad_multiple(sp // ring, ring, chunks)
    multiple = shard_multiple * pad_to_multiple_of // math.gcd(shard_multiple, pad_to_multiple_of)
    total = -(-seq // multiple) * multiple
    if total < sp * chunks:  # every rank needs at least one token per chunk
        total = -(-(sp * chunks) // multiple) * multiple
    extra = total - seq
    if extra:
        ids = torch.cat([ids, ids.new_full((ids.shape[0], extra), pad_token_id)], dim=1)
        shifted = torch.cat([shifted, shifted.new_full((shifted.shape[0], extra), ignore_index)], dim=1)
        real = torch.cat([real, real.new_zeros((real.shape[0], extra))], dim=1)
        if pos is not None:
            pos = torch.cat([pos, pos[:, -1:] + torch.arange(1, extra + 1, device=pos.device)], dim=1)

    documents = None
    if pos is not None:
        documents = [document_spans(row) for row in pos]
        if all(len(d) == 1 for d in documents):
            documents = None

    local = total // sp
    spans = chunked_rank_spans(total, sp // ring, ring, chunks, sp_rank)
    if len(spans) == 1:
        chunk = slice(*spans[0])
    else:
        chunk = span_index(spans, device=ids.device)

    def take(t):
        return None if t is None else t[:, chunk].to(device=device).contiguous().clone()

    return LocalBatch(input_ids=take(ids), labels=take(shifted), position_ids=take(pos), global_len=total,
                      local_len=local, seq_len=seq, n_valid=int((shifted != ignore_index).sum()), spans=spans,
                      documents=documents, real=take(real))


__all__ = ["LocalBatch", "shard_batch"]
