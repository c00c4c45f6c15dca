"""Process groups for SP x DP, the SP group itself Ulysses x Ring.

Ranks are laid out SP-major: the SP group of rank g is the ``sp`` contiguous ranks
``[g // sp * sp, g // sp * sp + sp)``, so with the usual one-process-per-GPU launch an SP group stays
inside a node as long as ``sp`` divides the devices per node. The DP groups take one rank from each SP
group. DeepSpeed itself sees all ``dp * sp`` ranks as data parallel (see :mod:`autosp.compiler.runtime`);
the DP groups are only used to slice the batch.

2-D SP (``ring`` > 1): the SP group of P = U x R ranks (U = ``sp // ring``) is split twice. SP rank
``r * U + u`` (u < U, r < R) is

- Ulysses rank u of the *Ulysses group* of ring position r: the U consecutive SP ranks ``r*U .. r*U+U-1``
  (inside a node whenever U divides the devices per node: the all-to-alls run on every layer and need the
  fast links); the all-to-alls run over it;
- ring rank r of the *ring group* of Ulysses rank u: the R SP ranks ``u, U+u, 2U+u, ...``, strided by U
  (they cross nodes when P does not fit one); ring attention passes key/value blocks around it with P2P
  sends that overlap attention compute.

Example: P = 8 = U 4 x R 2 on nodes of 4 GPUs: Ulysses groups {0,1,2,3} and {4,5,6,7} (one per node),
ring groups {0,4}, {1,5}, {2,6}, {3,7} (across the two nodes). ``ring=1`` is plain Ulysses (the
Ulysses group is the SP group, no ring group); ``ring=sp`` is pure ring attention (no all-to-all).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch.distributed as dist

from autosp.contract.specs import Candidate
from autosp.errors import UsageError


@dataclass(frozen=True)
class Layout:
    """This rank's place in the candidate's SP x DP layout and its process groups (the degrees are the
    candidate's: ``candidate.sp``, ``.dp``, ``.ring``, ``.ulysses``)."""

    candidate: Candidate
    rank: int
    sp_group: object       # ProcessGroup
    dp_group: object       # ProcessGroup
    world_group: object    # ProcessGroup over every rank
    ulysses_group: object = None   # ProcessGroup of the all-to-alls (the SP group when ring == 1; None when
                                   # ring == sp: no all-to-all)
    ring_group: object = None      # ProcessGroup of ring attention (None when ring == 1)

    @property
    def sp_rank(self) -> int:
        return self.rank % self.candidate.sp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.candidate.sp


def _new_group(ranks: list[int], world: int):
    return dist.new_group(ranks) if len(ranks) < world else dist.group.WORLD


def make_layout(candidate: Candidate) -> Layout:
    """Create (collectively, on every rank) the SP, Ulysses, ring and DP groups of the candidate's sp x dp world."""
    sp, dp, ring = candidate.sp, candidate.dp, candidate.ring
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != sp * dp:
        raise UsageError(f"the plan needs dp x sp = {dp} x {sp} = {dp * sp} processes but {world} were launched")
    if ring < 1 or sp % ring:
        raise UsageError(f"ring={ring} must divide sp={sp}")
    ulysses = sp // ring
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    if local and ulysses > 1 and (ulysses > local or local % ulysses):
        warnings.warn(f"Ulysses groups of {ulysses} ranks do not fit in nodes of {local} processes: the all-to-alls "
                      f"will cross nodes", stacklevel=2)
    sp_group = dp_group = ulysses_group = ring_group = None
    # every rank must take part in creating every group, in the same order
    for start in range(0, world, sp):
        group = _new_group(list(range(start, start + sp)), world)
        if rank // sp == start // sp:
            sp_group = group
    for offset in range(sp):
        group = _new_group(list(range(offset, world, sp)), world)
        if rank % sp == offset:
            dp_group = group
    if ring > 1:
        for start in range(0, world, sp):
            if ulysses > 1:
                for r in range(ring):
                    ranks = [start + r * ulysses + u for u in range(ulysses)]
                    group = _new_group(ranks, world)
                    if rank in ranks:
                        ulysses_group = group
            for u in range(ulysses):
                ranks = [start + r * ulysses + u for r in range(ring)]
                group = _new_group(ranks, world)
                if rank in ranks:
                    ring_group = group
    else:
        ulysses_group = sp_group
    return Layout(candidate=candidate, rank=rank, sp_group=sp_group, dp_group=dp_group,
                  world_group=dist.group.WORLD, ulysses_group=ulysses_group, ring_group=ring_group)


__all__ = ["Layout", "make_layout"]
