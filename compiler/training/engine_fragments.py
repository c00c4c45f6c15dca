"""Which part of each parameter's fp32 weight and optimizer states this rank holds, at every ZeRO stage, and how
to read and write it without gathering anything.

Every parameter is seen flattened (``numel`` elements); a rank's part is the range ``[offset, offset + length)``:

- ZeRO-3 (``param.ds_id``): the rank's partition, ``ds_tensor``: ``partition_size`` elements from ``rank *
  partition_size`` (the last one cut at ``numel``, DeepSpeed pads it). The fp32 master and the optimizer states
  are read and written with DeepSpeed's local accessors (``deepspeed.utils.safe_get_local_fp32_param``,
  ``safe_get_local_optimizer_state`` and ``safe_set_local_*``); a frozen parameter has no master, its
  ``ds_tensor`` is the weight.
- ZeRO-1/2 and DeepSpeed's bf16 optimizer (``param._hp_mapping``): the fragment of the parameter that falls in
  this rank's piece of the flat fp32 partition (``lp_fragment_address``: its start in the flattened parameter and
  its length; none when the parameter lies wholly in other ranks' pieces), read and written through the mapping's
  views of the fp32 master (``get_hp_fragment()``) and of each optimizer state (``get_hp_fragment(key)``). The
  replicated working weights are refreshed from the masters after a load (``update_lp_params``: one all-gather).
- Replicated (ZeRO-0, and frozen parameters below ZeRO-3): every rank holds all of it. Its fp32 master is the
  parameter itself in fp32; in bf16, DeepSpeed's ``FP16_UnfusedOptimizer`` keeps an fp32 copy of each parameter
  and the optimizer's states under that copy (:func:`replicated_masters`). A save splits the range evenly, so that
  every rank writes about 1/world of the bytes (:func:`even_range`); a load reads the whole tensor on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Part", "apply_loaded", "even_range", "finish_load", "load_targets", "parts", "prepare_load",
           "replicated_masters", "saved_tensors"]


@dataclass
class Part:
    """This rank's range of one parameter (``length`` 0: it holds none)."""

    name: str
    param: torch.nn.Parameter
    kind: str  # "zero3", "hp" or "replicated"
    numel: int
    offset: int
    length: int
    trainable: bool
    master: torch.Tensor | None = None  # replicated: the fp32 master (the parameter itself in fp32)


def even_range(numel: int, rank: int, world: int) -> tuple[int, int]:
    """(offset, length) of rank's share when ``numel`` elements are split evenly over ``world`` ranks."""
    share = -(-numel // world)
    start = min(numel, rank * share)
    return start, min(numel, start + share) - start


def _zero3_range(param) -> tuple[int, int]:
    import torch.distributed as dist

    size = int(param.ds_tensor.ds_numel)
    start = min(param.ds_numel, size * dist.get_rank(group=getattr(param, "ds_process_group", None)))
    return start, min(param.ds_numel, start + size) - start


def replicated_masters(optimizer) -> dict[int, torch.Tensor]:
    """{id(parameter): its fp32 master copy} under DeepSpeed's ``FP16_UnfusedOptimizer`` (bf16 at ZeRO-0 with a
    torch optimizer), whose inner optimizer holds the copies and keys its states by them; empty otherwise."""
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    if not isinstance(optimizer, FP16_UnfusedOptimizer):
        return {}
    return {id(p): master for low, high in zip(optimizer.fp16_groups, optimizer.fp32_groups)
            for p, master in zip(low, high)}


def parts(named, rank: int, world: int, *, loading: bool, masters: dict | None = None) -> list[Part]:
    """This rank's :class:`Part` of every parameter in ``named`` ((name, parameter) pairs). Replicated parameters:
    an even share when saving, the whole tensor when ``loading``; their fp32 masters from ``masters``
    (:func:`replicated_masters`), else the parameter itself."""
    masters = masters or {}
    out = []
    for name, p in named:
        if hasattr(p, "ds_id"):
            kind, numel = "zero3", int(p.ds_numel)
            offset, length = _zero3_range(p)
        elif hasattr(p, "_hp_mapping"):  # set (maybe to None) on every parameter of the optimizer's groups
            kind, numel = "hp", p.numel()
            mapping = p._hp_mapping
            offset, length = ((mapping.lp_fragment_address.start, mapping.lp_fragment_address.numel)
                              if mapping is not None else (0, 0))
        else:
            kind, numel = "replicated", p.numel()
            offset, length = (0, numel) if loading else even_range(numel, rank, world)
        out.append(Part(name, p, kind, numel, offset, length, bool(p.requires_grad),
                        masters.get(id(p), p) if kind == "replicated" else None))
    return out


# -- save ----------------------------------------------------------------------------------------------------
def _flat(tensor, part: Part):
    return tensor.detach().reshape(-1).narrow(0, part.offset, part.length)


def saved_tensors(part: Part, inner, keys) -> dict[str, torch.Tensor]:
    """{"weight" | state key: this rank's fragment as a 1-D fp32 tensor (a view where one exists)} for a part with
    ``length > 0``; optimizer states only for trainable parameters."""
    p = part.param
    keys = keys if part.trainable else ()
    if part.kind == "zero3":
        from deepspeed.utils import safe_get_local_fp32_param, safe_get_local_optimizer_state

        weight = safe_get_local_fp32_param(p) if part.trainable else None
        out = {"weight": (weight if weight is not None else p.ds_tensor).reshape(-1)[:part.length].float()}
        for key in keys:
            out[key] = safe_get_local_optimizer_state(p, key).reshape(-1)[:part.length]
        return out
    if part.kind == "hp":
        mapping = p._hp_mapping
        out = {"weight": mapping.get_hp_fragment().reshape(-1)}
        for key in keys:
            out[key] = mapping.get_hp_fragment(key).reshape(-1)
        return out
    out = {"weight": _flat(part.master, part).float()}
    for key in keys:
        out[key] = _flat(inner.state[part.master][key], part)
    return out


# -- load ----------------------------------------------------------------------------------------------------
def prepare_load(ds) -> None:
    """Before ZeRO-3 partitions are overwritten: release every gathered parameter (DeepSpeed's own checkpoint
    prologue), so that no full copy keeps the old values."""
    prologue = getattr(ds.optimizer, "checkpoint_event_prologue", None)
    if prologue is not None and any(hasattr(p, "ds_id") for p in ds.module.parameters()):
        prologue()


def load_targets(part: Part, inner, keys) -> dict[str, torch.Tensor]:
    """{"weight" | state key: the 1-D fp32 tensor a load reads ``part``'s range into}: the engine's own storage
    where it is a plain fp32 view (ZeRO-1/2's fragments of the fp32 masters and states, an fp32 replicated
    parameter and its states), else a new buffer that :func:`apply_loaded` hands to DeepSpeed's setters (ZeRO-3,
    whose partitions may live in host memory or on NVMe) or casts into the parameter."""
    p = part.param
    names = ["weight", *(keys if part.trainable else ())]
    if part.kind == "hp":  # (detached: the flat fp32 partition is a leaf that requires grad)
        return {key: p._hp_mapping.get_hp_fragment(None if key == "weight" else key).detach().reshape(-1)
                for key in names}
    if part.kind == "replicated":
        out = {}
        for key in names:
            target = (part.master if key == "weight" else inner.state[part.master][key]).detach()
            usable = target.dtype == torch.float32 and target.is_contiguous()
            out[key] = target.view(-1) if usable else torch.empty(part.length, dtype=torch.float32)
        return out
    return {key: torch.empty(part.length, dtype=torch.float32) for key in names}


def apply_loaded(part: Part, inner, values: dict[str, torch.Tensor]) -> None:
    """Hand a part's loaded ranges (``values``, from :func:`load_targets`) to the engine where they were not read
    in place: ZeRO-3's fp32 master, optimizer states and working weight through DeepSpeed's local setters, and a
    replicated parameter kept in another dtype (ZeRO-1/2 refresh their working weights in :func:`finish_load`)."""
    p = part.param
    with torch.no_grad():
        if part.kind == "zero3":
            from deepspeed.utils import safe_set_local_fp32_param, safe_set_local_optimizer_state

            size = p.ds_tensor.numel()

            def padded(value):  # the setters take the whole partition, DeepSpeed's padding of the last included
                if value.numel() == size:
                    return value
                full = torch.zeros(size, dtype=torch.float32, device=value.device)
                full[:part.length] = value
                return full

            weight = values["weight"]
            p.ds_tensor.data.reshape(-1)[:part.length].copy_(weight)
            if part.trainable:
                safe_set_local_fp32_param(p, padded(weight))
            for key, value in values.items():
                if key != "weight":
                    safe_set_local_optimizer_state(p, padded(value), key)
        elif part.kind == "replicated":
            for key, value in values.items():
                target = part.master.data if key == "weight" else inner.state[part.master][key]
                if value.data_ptr() != target.data_ptr():
                    target.copy_(value.view(target.shape))
            if part.master is not p:  # the bf16 working weight from its fp32 master
                p.data.copy_(part.master.data.view(p.shape))


def finish_load(ds) -> None:
    """After every part is written (collective): ZeRO-3 re-gathers its persistent parameters (the LM head a tiled
    loss keeps gathered), ZeRO-1/2 and the bf16 optimizer rebuild the replicated working weights from the
    fp32 masters."""
    optimizer = ds.optimizer
    persistent = getattr(optimizer, "persistent_parameters", None)
    if any(hasattr(p, "ds_id") for p in ds.module.parameters()):
        if persistent:
            persistent[0].partition(persistent)
        optimizer.checkpoint_event_epilogue()
    elif hasattr(optimizer, "update_lp_params") and any(hasattr(p, "_hp_mapping") for p in ds.module.parameters()):
        optimizer.update_lp_params()
