"""Blockwise attention without masks: the kernel layer of ring attention (and of later sequence chunking).

- :mod:`.pieces`: which (query rows, key rows) rectangles of two blocks attend, and how (full or causal
  diagonal), from the global token spans each block holds; the one place the attention rule lives;
- :mod:`.kernels`: one piece's SDPA with its log-sum-exp, and its backward given the merged output and
  log-sum-exp (CPU flash kernels; CUDA memory-efficient kernels);
- :mod:`.merge`: merging partial results by log-sum-exp; :mod:`.sinks`: attention sinks (gpt-oss) merged once after
  every partial result, and their gradient;
- :mod:`.blockwise`: one query block over one key/value block (forward into accumulators, backward);
- :mod:`.layout`: the zigzag (head-tail) token layout of Ulysses x Ring;
- :mod:`.documents`: packed documents from ``position_ids`` / ``seq_lens`` / ``cu_seq_lens`` (pure functions) and
  each call's documents, published for the ops; :mod:`.local`: rows with different documents, and
  ``autosp_ops::span_attention`` (documents and windows after Ulysses); :mod:`.flex_cuda`: its opt-in, untested
  FlexAttention path on CUDA;
- :mod:`.ring`: ``autosp_ops::ring_attention`` and its backward, over the ring process group (imported by
  the backend; not re-exported here so that the sharding code needs no process groups).
"""

from autosp.compiler.attention.blockwise import block_backward, block_forward
from autosp.compiler.attention.documents import (
    document_spans,
    position_ids_from_spans,
    spans_from_cu_seq_lens,
    spans_from_seq_lens,
)
from autosp.compiler.attention.kernels import sdpa_with_lse, sdpa_with_lse_backward
from autosp.compiler.attention.layout import flat_ranges, pad_multiple, rank_spans, ring_spans, span_index
from autosp.compiler.attention.merge import empty_accumulators, merge_into, merge_partials
from autosp.compiler.attention.pieces import Piece, attention_pieces, span_pieces

__all__ = ["Piece", "attention_pieces", "block_backward", "block_forward", "document_spans", "empty_accumulators",
           "flat_ranges", "position_ids_from_spans", "spans_from_cu_seq_lens", "spans_from_seq_lens",
           "merge_into", "merge_partials", "pad_multiple", "rank_spans", "ring_spans", "sdpa_with_lse",
           "sdpa_with_lse_backward", "span_index", "span_pieces"]
