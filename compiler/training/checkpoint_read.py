"""Reading a checkpoint's tensors and objects in one process, without a process group: ranges of tensors into
buffers the caller owns, whole weights a few at a time (export, warm start), and the pickled objects.

Two formats, one interface (:class:`Reader`):

- version 2 (DCP): ``dcp.load(..., no_dist=True)`` with :class:`~.dcp_planners.FlatLoadPlanner`, which reads only
  the byte ranges of the ``__R_0.distcp`` files that overlap the requested ranges (resharding is DCP's job);
- version 1 (``shard-*.safetensors``, ``engine.pt``, ``rng/rank-*.pt``, what autosp wrote before DCP): the whole
  tensor is read lazily with ``safetensors.safe_open`` and the range cut from it.

Both name tensors ``weight/NAME`` (the fp32 master weight of parameter NAME, flattened) and ``STATE/NAME`` (an
optimizer state, ``exp_avg/NAME``), and objects ``engine`` and ``rng/rank-RRRRR``.
"""

from __future__ import annotations

import io
import os
import warnings

import torch

__all__ = ["FULL_READ_BYTES", "Reader", "full_weights", "rng_key"]

FULL_READ_BYTES = 1 << 30  # what one read of whole weights (export, warm start) holds at most, beyond one tensor


def rng_key(rank: int) -> str:
    return f"rng/rank-{rank:05d}"


class Reader:
    """The tensors and objects of the checkpoint ``directory`` whose ``meta.json`` is ``meta``."""

    def __init__(self, directory: str, meta: dict):
        self.directory, self.meta = directory, meta
        self.dcp = int(meta.get("version", 1)) >= 2

    # -- tensors ------------------------------------------------------------------------------------------
    def fill(self, wants: dict[str, tuple[int, int, torch.Tensor]]) -> None:
        """Fill each buffer of ``wants`` ({key: (numel of the whole flattened tensor, offset, 1-D buffer)}) with
        the elements ``[offset, offset + len(buffer))`` of the saved tensor ``key``."""
        if not wants:
            return
        if self.dcp:
            from autosp.compiler.training.dcp_planners import FlatLoadPlanner

            state = {key: buffer for key, (_, _, buffer) in wants.items()}
            planner = FlatLoadPlanner({key: (numel, offset) for key, (numel, offset, _) in wants.items()})
            self._dcp_load(state, planner)
            return
        from safetensors import safe_open

        handles = {}
        for key, (numel, offset, buffer) in wants.items():
            name = key.split("/", 1)[1]
            file = self.meta["params"][name]["shard"]
            if file not in handles:
                handles[file] = safe_open(os.path.join(self.directory, file), framework="pt")
            tensor = handles[file].get_tensor(key).reshape(-1)
            if tensor.numel() != numel:
                raise ValueError(f"{key} has {tensor.numel()} elements in the checkpoint and {numel} here")
            with torch.no_grad():
                buffer.copy_(tensor[offset:offset + buffer.numel()])

    # -- objects -----------------------------------------------------------------------------------------
    def objects(self, keys) -> dict:
        """{key: object} for the keys the checkpoint holds (``engine``, ``rng/rank-RRRRR``)."""
        if self.dcp:
            from autosp.compiler.training.dcp_planners import FlatLoadPlanner

            stored = self._dcp_metadata().state_dict_metadata
            state = {key: None for key in keys if key in stored}
            if state:
                self._dcp_load(state, FlatLoadPlanner({}))
            # engine: plain values; RNG states hold numpy's and python's state tuples (autosp wrote them)
            return {key: torch.load(io.BytesIO(blob), weights_only=key == "engine") for key, blob in state.items()}
        files = {"engine": "engine.pt", **{key: f"{key}.pt" for key in keys if key.startswith("rng/")}}
        out = {}
        for key in keys:
            path = os.path.join(self.directory, files[key])
            if os.path.exists(path):
                out[key] = torch.load(path, map_location="cpu", weights_only=key == "engine")
        return out

    # -- DCP ---------------------------------------------------------------------------------------------
    def _dcp_metadata(self):
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(self.directory).read_metadata()

    def _dcp_load(self, state: dict, planner) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            with warnings.catch_warnings():  # one process reading on its own is what is meant here
                warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
                dcp.load(state, storage_reader=dcp.FileSystemReader(self.directory), planner=planner, no_dist=True)
        except CheckpointException as err:  # a BaseException whose text is a traceback: its cause, in one line
            raise ValueError(_cause(err)) from None


def _cause(err) -> str:
    for exc, _ in getattr(err, "failures", {}).values():
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return str(err).splitlines()[0]


def full_weights(directory: str, meta: dict, names=None, budget: int = FULL_READ_BYTES):
    """(name, fp32 weight in its shape) of every parameter (``names``: these only), in the checkpoint's order,
    read a group of at most ``budget`` bytes at a time (one tensor when a tensor is larger)."""
    reader = Reader(directory, meta)
    params = meta["params"]
    group, size = [], 0

    def read(group):
        wants = {}
        for name in group:
            numel = _numel(params[name]["shape"])
            wants[f"weight/{name}"] = (numel, 0, torch.empty(numel, dtype=torch.float32))
        reader.fill(wants)
        return [(name, wants[f"weight/{name}"][2].view(params[name]["shape"])) for name in group]

    for name in params if names is None else names:
        nbytes = 4 * _numel(params[name]["shape"])
        if group and size + nbytes > budget:
            yield from read(group)
            group, size = [], 0
        group.append(name)
        size += nbytes
    if group:
        yield from read(group)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
