"""Measure what a training step keeps for its backward: the bytes autograd saves, per rank.

Every tensor the compiled graph keeps for the backward passes through ``ctx.save_for_backward`` of
AOTAutograd's autograd function, hence through ``torch.autograd.graph.saved_tensors_hooks``::

    with measure_saved(engine.module) as saved:
        loss = engine(input_ids=ids, labels=labels)
    saved.device_bytes, saved.host_bytes

Tensors are counted once per storage (whole storage bytes: a saved view keeps its base alive), parameters
and buffers of the model are left out (they are model states, not activations). ``host_bytes`` are the
copies activation offload made (:func:`autosp.compiler.passes.offload.is_host_copy`; on CUDA also any other
saved tensor on the CPU): the memory offload moved off the device. On a CPU-only machine host and device are
the same memory; the split still shows what offload moved.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch


@dataclass
class SavedBytes:
    device_bytes: int = 0
    host_bytes: int = 0
    tensors: int = 0
    storages: set = field(default_factory=set)
    _skip: set = field(default_factory=set)

    @property
    def total_bytes(self) -> int:
        return self.device_bytes + self.host_bytes

    def pack(self, t: torch.Tensor):
        from autosp.compiler.passes.offload import is_host_copy

        self.tensors += 1
        if isinstance(t, torch.nn.Parameter):
            return t
        try:
            storage = t.untyped_storage()
            key = (t.device, storage.data_ptr())
        except (RuntimeError, NotImplementedError):
            return t
        if key in self._skip or key in self.storages:
            return t
        self.storages.add(key)
        host = is_host_copy(t) or (t.device.type == "cpu" and torch.cuda.is_available())
        if host:
            self.host_bytes += storage.nbytes()
        else:
            self.device_bytes += storage.nbytes()
        return t

    @staticmethod
    def unpack(t):
        return t


@contextlib.contextmanager
def measure_saved(module: torch.nn.Module | None = None):
    """Count the tensors saved for backward inside the block (see the module docstring)."""
    record = SavedBytes()
    if module is not None:
        for t in list(module.parameters()) + list(module.buffers()):
            try:
                record._skip.add((t.device, t.untyped_storage().data_ptr()))
            except (RuntimeError, NotImplementedError):
                pass
    with torch.autograd.graph.saved_tensors_hooks(record.pack, record.unpack):
        yield record


__all__ = ["SavedBytes", "measure_saved"]
