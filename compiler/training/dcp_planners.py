"""torch.distributed.checkpoint planners for flat fragments: a rank's piece of a flattened tensor at a global offset.

A ZeRO partition is not a regular sharding of each parameter: ZeRO-1/2 cut one flat buffer of all parameters into
equal pieces, so a rank holds an arbitrary range of a parameter (often none, often the tail of one and the head of
the next); ZeRO-3 gives every rank ``ceil(numel / world)`` elements of each parameter, the last piece short or
empty. DTensor's ``Shard`` placements cannot say "elements 1,234 to 5,678" and ShardedTensor, which can, is
deprecated (torch 2.13: "Please use DTensor instead"). So the state dict holds plain 1-D tensors -- the fragments
themselves -- and these planners, DCP's documented extension point, tell DCP where each one lies in its tensor:

- :class:`FlatSavePlanner` writes ``state_dict[key]`` as the chunk ``[offset, offset + len)`` of a 1-D tensor of
  ``numel`` elements (DCP checks that the ranks' chunks tile every tensor exactly, without overlap);
- :class:`FlatLoadPlanner` reads the chunk ``[offset, offset + len)`` of the saved tensor into ``state_dict[key]``,
  whatever chunks the saving ranks wrote: DCP's resharding (``create_read_items_for_chunk_list``) computes the
  overlaps, so a checkpoint written by 2 ranks at ZeRO-1 loads into 4 ranks at ZeRO-3.

Keys not in the fragment table take DCP's default path; their values are ``bytes`` (the caller's ``torch.save``
of the engine's scalars or a rank's RNG states), and the load planner unpickles them with ``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import LoadPlan, SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

__all__ = ["FlatLoadPlanner", "FlatSavePlanner"]


@contextlib.contextmanager
def _only(planner, keep):
    """The planner's state dict narrowed to the keys ``keep`` accepts, for DCP's default planning of them."""
    full = planner.state_dict
    planner.state_dict = {k: v for k, v in full.items() if keep(k)}
    try:
        yield
    finally:
        planner.state_dict = full


class FlatSavePlanner(DefaultSavePlanner):
    """``fragments``: {key: (numel of the whole flattened tensor, offset of this rank's fragment)}."""

    def __init__(self, fragments: dict[str, tuple[int, int]]):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.fragments = fragments

    def create_local_plan(self) -> SavePlan:
        with _only(self, lambda key: key not in self.fragments):  # DCP's own plan for the other values
            plan = super().create_local_plan()
        items = [self._write_item(key, tensor) for key, tensor in self.state_dict.items() if key in self.fragments]
        self.plan = dataclasses.replace(plan, items=items + list(plan.items))
        return self.plan

    def _write_item(self, key: str, tensor: torch.Tensor) -> WriteItem:
        numel, offset = self.fragments[key]
        chunk = ChunkStorageMetadata(offsets=torch.Size([offset]), sizes=torch.Size([tensor.numel()]))
        return WriteItem(index=MetadataIndex(key, [offset]), type=WriteItemType.SHARD,
                         tensor_data=TensorWriteData(chunk=chunk, properties=TensorProperties.create_from_tensor(tensor),
                                                     size=torch.Size([numel])))

    def lookup_object(self, index: MetadataIndex):
        if index.fqn in self.fragments:
            return self.state_dict[index.fqn]
        return super().lookup_object(index)


class FlatLoadPlanner(DefaultLoadPlanner):
    """``fragments``: {key: (numel of the whole flattened tensor, offset of the fragment to read)}; the fragment's
    length is that of ``state_dict[key]`` (a 1-D buffer the read fills)."""

    def __init__(self, fragments: dict[str, tuple[int, int]]):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.fragments = fragments

    def create_local_plan(self) -> LoadPlan:
        stored = self.metadata.state_dict_metadata
        items = []
        for key, buffer in self.state_dict.items():
            if key not in self.fragments:
                continue
            if key not in stored:
                raise KeyError(f"{key} is not in the checkpoint")
            numel, offset = self.fragments[key]
            saved = tuple(getattr(stored[key], "size", ()))
            if saved != (numel,):
                raise ValueError(f"{key} has {saved} elements in the checkpoint and {numel} here")
            chunk = ChunkStorageMetadata(offsets=torch.Size([offset]), sizes=torch.Size([buffer.numel()]))
            items += create_read_items_for_chunk_list(key, stored[key], [chunk])
        with _only(self, lambda key: key not in self.fragments):
            items += super().create_local_plan().items
        return LoadPlan(items)

    def load_bytes(self, read_item, value) -> None:
        """Objects are stored as bytes (``torch.save`` output, decoded by the caller): nothing else is unpickled."""
        self.state_dict[read_item.dest_index.fqn] = torch.load(value, weights_only=True)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        if index.fqn in self.fragments:
            return self.state_dict[index.fqn]
        return super().lookup_tensor(index)
