"""Process groups for SP x DP.

Ranks are laid out SP-major: the SP group of rank r is the ``sp`` contiguous ranks
``[r // sp * sp, r // sp * sp + sp)``, so with the usual one-process-per-GPU launch an SP group stays
inside a node (the all-to-alls run on every layer and need the fast links) as long as ``sp`` divides
the devices per node. The DP groups take one rank from each SP group. DeepSpeed itself sees all
``dp * sp`` ranks as data parallel (see :mod:`autosp.compiler.runtime`); the DP groups are only used to
slice the batch.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch.distributed as dist

from autosp.errors import UsageError


@dataclass(frozen=True)
class Layout:
    sp: int
    dp: int
    rank: int
    sp_group: object       # ProcessGroup
    dp_group: object       # ProcessGroup
    world_group: object    # ProcessGroup over every rank

    @property
    def sp_rank(self) -> int:
        return self.rank % self.sp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.sp

    @property
    def world_size(self) -> int:
        return self.sp * self.dp


def make_layout(sp: int, dp: int) -> Layout:
    """Create (collectively, on every rank) the SP and DP groups of an sp x dp world."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != sp * dp:
        raise UsageError(f"the plan needs dp x sp = {dp} x {sp} = {dp * sp} processes but {world} were launched")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    if local and sp > 1 and (sp > local or local % sp):
        warnings.warn(f"SP groups of {sp} ranks do not fit in nodes of {local} processes: the all-to-alls will "
                      f"cross nodes", stacklevel=2)
    sp_group = dp_group = None
    for start in range(0, world, sp):  # every rank must take part in creating every group
        group = dist.new_group(list(range(start, start + sp))) if sp < world else dist.group.WORLD
        if rank // sp == start // sp:
            sp_group = group
    for offset in range(sp):
        group = dist.new_group(list(range(offset, world, sp))) if dp < world else dist.group.WORLD
        if rank % sp == offset:
            dp_group = group
    return Layout(sp=sp, dp=dp, rank=rank, sp_group=sp_group, dp_group=dp_group, world_group=dist.group.WORLD)
