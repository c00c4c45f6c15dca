"""What the passes need to know about the run: the process groups, this rank's place, the lengths.

One :class:`SPContext` lives for the life of an engine. The runtime fills in the per-call fields
(``local_len``, ``global_len``) before it calls the compiled model, so a recompilation for a new
sequence length sees the right numbers (Dynamo compiles synchronously inside that call, and its shape
guards make sure a graph compiled for one local length only ever runs at that length).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from autosp.contract.specs import Candidate


@dataclass
class PassStats:
    """What the passes did, summed over every graph compiled for this engine."""

    graphs: int = 0
    attention: int = 0
    masks_removed: int = 0
    mask_inputs_verified: int = 0
    positions_offset: int = 0
    losses: int = 0
    label_shifts_removed: int = 0
    mlps_tiled: int = 0
    losses_tiled: int = 0
    attention_overlapped: int = 0
    layers_chunked: int = 0
    notes: list = field(default_factory=list)
    partitions: list = field(default_factory=list)  # checkpointing.PartitionReport of every partitioned graph


@dataclass
class SPContext:
    """The plan's :class:`~autosp.contract.specs.Candidate` (every knob the passes apply: tiling, overlap,
    checkpointing, offloads, the ring split, sequence chunks) and this rank's runtime facts. Built once, complete,
    by :func:`autosp.compiler.api.attach_sp`; the runtime only fills in the per-call lengths (and, the first time a
    batch turns out packed, the documents' rule key)."""

    candidate: Candidate
    sp_rank: int
    sp_group: str                 # ProcessGroup.group_name of this rank's SP group
    world_group: str              # the group the loss statistics are summed over (every rank)
    grad_world_size: int          # ranks DeepSpeed averages gradients over (dp * sp)
    ignore_index: int = -100
    positions_from_runtime: bool = False
    local_len: int = 0            # s = S / P of the call being compiled
    global_len: int = 0           # S after padding
    ulysses_group: str | None = None  # group of the all-to-alls (default: sp_group; None when ring == sp)
    ring_group: str | None = None     # group of ring attention (ring > 1)
    # Packed documents / sliding windows (attention/documents.py, attention/local.py): ``rule`` is the key under
    # which the runtime publishes each call's documents; non-empty: every attention becomes a span-restricted
    # op (span_attention after Ulysses, ring_attention with the rule). ``layer_windows``: per decoder layer,
    # its sliding window in tokens or None (global); None: no layer has one.
    rule: str = ""
    layer_windows: tuple | None = None
    router_key: str = ""          # MoE: the key this engine publishes its real tokens under (router_loss.py)
    param_layers: dict = field(default_factory=dict)  # id(parameter) -> its decoder layer (ZeRO-3 fragments)
    stats: PassStats = field(default_factory=PassStats)

    def __post_init__(self):
        if self.ulysses_group is None and self.candidate.ring == 1:
            self.ulysses_group = self.sp_group

    @property
    def fragments(self) -> bool:
        """Graph breaks are expected: ZeRO-3's module hooks gather each layer's parameters."""
        return self.candidate.zero_stage == 3

    @property
    def windows(self) -> frozenset:
        """The distinct sliding windows of the model's layers."""
        return frozenset(w for w in self.layer_windows or () if w is not None)

    @property
    def spans(self) -> list:
        """The global token spans this rank holds, in the order of its rows (:mod:`.attention.layout`: one
        contiguous chunk without a ring, zigzag chunks with one; with sequence-chunked layers the rank's share of
        every global chunk)."""
        c = self.candidate
        if c.ring == 1 and c.sequence_chunks == 1:
            return [(self.sp_rank * self.local_len, (self.sp_rank + 1) * self.local_len)]
        from autosp.compiler.attention.layout import chunked_rank_spans

        return chunked_rank_spans(self.global_len, c.ulysses, c.ring, c.sequence_chunks, self.sp_rank)

    @property
    def ring_ranges(self) -> list[int]:
        """Every ring position's spans, flattened: what ``autosp_ops::ring_attention`` is given."""
        from autosp.compiler.attention.layout import flat_ranges

        return flat_ranges(self.global_len, self.candidate.ring)


_KEYS = itertools.count()


def unique_key(prefix: str) -> str:
    """A key no other engine of this process uses (the documents' rule, the router's tokens)."""
    return f"{prefix}-{next(_KEYS):x}"


__all__ = ["PassStats", "SPContext", "unique_key"]
