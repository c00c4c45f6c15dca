"""Checkpoints that any plan can load: full fp32 weights and per-parameter optimizer states, per tensor.

Layout of one checkpoint directory (``SPEngine.save_checkpoint(dir)``; ``autosp-train --save-dir`` keeps one
per saved step, ``step-00000004/`` ..., and a ``latest`` file naming the newest)::

    shard-00000.safetensors ...  per parameter NAME: "weight/NAME" (fp32 master weights) and "STATE/NAME" for
                                 every tensor state of the optimizer ("exp_avg/NAME", "exp_avg_sq/NAME" for Adam)
    engine.pt                    optimizer hyper-parameters and scalar states (Adam's step), the LR scheduler's
                                 state_dict, DeepSpeed's step counters (torch.save of plain values only)
    rng/rank-00000.pt ...        each rank's RNG states (python, numpy, torch, CUDA)
    config.json                  the Hugging Face config of the model, when it has one
    meta.json                    written last: format, the plan it was saved under, the model, every parameter's
                                 shape and shard, every file's size, and the caller's ``client_state``

Why not DeepSpeed's own checkpoint files. ``DeepSpeedEngine.save_checkpoint`` writes each rank's ZeRO partition
of the flat optimizer buffers; those only load under the same data-parallel world and ZeRO stage, and DeepSpeed's
universal checkpoint (``ds_to_universal.py``) converts them offline into per-parameter files, but only from ZeRO
1-3 checkpoints, as a separate step that reads the whole checkpoint again. autosp changes the world (SP x DP: all
ranks are DeepSpeed's data-parallel world) and the ZeRO stage between plans, so it writes the per-parameter form
directly, with DeepSpeed's own accessors for the full fp32 parameter and optimizer state of a parameter at any
ZeRO stage (``deepspeed.utils.safe_get_full_fp32_param`` / ``safe_get_full_optimizer_state`` and their
``safe_set_*`` counterparts, the same tensor-fragment mapping universal checkpoints load through). One tensor is
gathered at a time and at most ``SHARD_BYTES`` are held before a shard is written, so no rank ever holds the whole
model; on load every rank reads only the tensors of its own parameters, lazily (``safetensors.safe_open``), and
keeps its own partition.

Atomicity. Everything is written into ``.NAME.partial`` next to the target, each file fsynced, then ``meta.json``
(fsynced) and the directory is renamed into place (and the parent fsynced): a checkpoint directory without a
readable ``meta.json`` is incomplete and never loaded. A failure (a full disk) on any rank is agreed on by all
ranks, the partial directory is removed, and every rank raises the same one-line error.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict

from autosp.errors import AutospError, UsageError

__all__ = ["FORMAT", "META", "CheckpointWriteError", "load_engine_checkpoint", "read_meta", "rng_state",
           "save_engine_checkpoint", "set_rng_state", "write_file"]

FORMAT = "autosp-checkpoint"
VERSION = 1
META = "meta.json"
SHARD_BYTES = 1 << 30  # what rank 0 holds before writing a shard (the gathered tensors of a few layers)


class CheckpointWriteError(AutospError):
    """Writing a checkpoint failed (a full disk, a vanished directory); the previous checkpoint is untouched."""

    exit_code = 1


# -- files ------------------------------------------------------------------------------------------
def write_file(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it (inside a partial directory: the rename of the directory is what
    publishes it). The one writer of checkpoint bytes (tests make it fail with ENOSPC)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _torch_bytes(obj) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def read_meta(directory: str) -> dict:
    """The ``meta.json`` of a complete checkpoint; UsageError (one line) for anything else."""
    path = os.path.join(directory, META)
    if not os.path.isdir(directory):
        raise UsageError(f"checkpoint {directory} does not exist or is not a directory")
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"checkpoint {directory} is incomplete (no {META}: its save was interrupted)") from None
    except (OSError, ValueError) as err:
        raise UsageError(f"checkpoint {directory} is corrupt ({META} unreadable: {str(err)[:120]})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UsageError(f"{directory} is not an autosp checkpoint ({META} has no format {FORMAT!r})")
    if meta.get("version", 0) > VERSION:
        raise UsageError(f"checkpoint {directory} has format version {meta.get('version')}, newer than this "
                         f"autosp reads ({VERSION}); upgrade autosp")
    for name, size in meta.get("files", {}).items():
        file = os.path.join(directory, name)
        try:
            actual = os.path.getsize(file)
        except OSError:
            raise UsageError(f"checkpoint {directory} is corrupt: {name} is missing") from None
        if actual != size:
            raise UsageError(f"checkpoint {directory} is corrupt: {name} is {actual:,} bytes, {META} says {size:,}")
    return meta


# -- RNG ----------------------------------------------------------------------------------------------
def rng_state() -> dict:
    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# -- what the engine holds ------------------------------------------------------------------------------
def named_parameters(module) -> list:
    """(name, parameter) once per parameter (tied weights under their first name), in module order."""
    seen, out = set(), []
    for name, param in module.named_parameters():
        if id(param) not in seen:
            seen.add(id(param))
            out.append((name, param))
    return out


def _inner_optimizer(ds_engine):
    """The torch optimizer that holds the states (DeepSpeed's ZeRO / bf16 wrappers keep it as .optimizer)."""
    opt = ds_engine.optimizer
    import torch

    while opt is not None and not isinstance(opt, torch.optim.Optimizer) and hasattr(opt, "optimizer"):
        opt = opt.optimizer
    return opt


def _is_zero3(param) -> bool:
    return hasattr(param, "ds_id")


def _full_weight(param):
    """This parameter's full fp32 master weight (collective under ZeRO 1-3: every rank must call it)."""
    from deepspeed.utils import safe_get_full_fp32_param

    value = safe_get_full_fp32_param(param)
    if value is None:
        if _is_zero3(param):  # a frozen ZeRO-3 parameter has no master copy: gather the weight itself
            import deepspeed

            with deepspeed.zero.GatheredParameters([param]):
                return param.detach().float().cpu().clone()
        return param.detach().float().cpu().clone()
    return value.detach().float().cpu()


def _optimizer_keys(inner) -> tuple[list, dict]:
    """(tensor state keys, {scalar key: value}) of the optimizer, read from its first parameter's state."""
    import torch

    for state in inner.state.values():
        tensors, scalars = [], {}
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                tensors.append(key)
            elif isinstance(value, torch.Tensor):
                scalars[key] = value.item()
            elif isinstance(value, (int, float)):
                scalars[key] = value
        return sorted(tensors), scalars
    return [], {}


def _full_state(ds_engine, inner, param, key):
    from deepspeed.utils import safe_get_full_optimizer_state

    if hasattr(param, "_hp_mapping") or _is_zero3(param):
        return safe_get_full_optimizer_state(param, key).detach().float().cpu()
    return inner.state[param][key].detach().float().cpu()  # ZeRO-0 fp32: the parameter is the master


def _agree(failed: bool) -> bool:
    """True when any rank failed (all ranks get the same answer)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if failed else 0.0])
    if dist.is_initialized():
        if dist.get_backend() == "nccl":
            flag = flag.cuda()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _barrier():
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _rank_world():
    import torch.distributed as dist

    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def model_description(module) -> dict:
    """What the checkpoint says about its model: its class, its Hugging Face config or reference spec."""
    out = {"class": f"{type(module).__module__}.{type(module).__qualname__}"}
    spec = getattr(module, "spec", None)
    if spec is not None and hasattr(spec, "n_layers"):
        out["kind"] = "reference"
        out["spec"] = asdict(spec)
    elif hasattr(getattr(module, "config", None), "to_dict"):
        out["kind"] = "hf"
        out["model_type"] = module.config.model_type
    else:
        out["kind"] = "module"
    return out


# -- save -----------------------------------------------------------------------------------------------
def save_engine_checkpoint(engine, directory: str, client_state: dict | None = None) -> str:
    """Write ``engine``'s full training state to ``directory`` (see the module docstring). Collective: every rank
    calls it with the same directory (on a filesystem all ranks see). Returns the directory."""
    ds = engine.ds_engine
    rank, world = _rank_world()
    directory = os.path.abspath(directory)
    parent, name = os.path.split(directory)
    partial = os.path.join(parent, f".{name}.partial")
    failure = None
    if rank == 0:
        try:
            os.makedirs(parent, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)  # a save killed earlier
            os.makedirs(os.path.join(partial, "rng"))
        except OSError as err:
            failure = err
    _fail_together(failure, partial, directory, rank)

    inner = _inner_optimizer(ds)
    keys, scalars = _optimizer_keys(inner) if inner is not None else ([], {})
    keys_agreed = _broadcast_object((keys, scalars))
    keys, scalars = keys_agreed
    params, files, failure = _write_shards(ds, inner, keys, partial, rank)
    failure = _write_states(ds, inner, scalars, partial, rank, files, failure)
    _fail_together(failure, partial, directory, rank)
    if rank == 0:
        meta = _meta(engine, inner, keys, scalars, params, files, partial, world, client_state)
        try:
            write_file(os.path.join(partial, META), json.dumps(meta, indent=1, default=str).encode())
            fsync_dir(os.path.join(partial, "rng"))
            fsync_dir(partial)
            _publish(partial, directory)
        except OSError as err:
            failure = err
    _fail_together(failure, partial, directory, rank)
    return directory


def _write_shards(ds, inner, keys: list, partial: str, rank: int):
    """Every parameter's full weight and optimizer states, gathered, in safetensors shards of about SHARD_BYTES:
    ({parameter: its shape and shard}, {file: bytes}, the first OSError of rank 0 or None)."""
    from safetensors.torch import save as safetensors_bytes

    params, files, pending, pending_bytes, shard = {}, {}, {}, 0, 0
    failure = None

    def flush():
        nonlocal pending, pending_bytes, shard, failure
        if not pending_bytes:
            return
        file = f"shard-{shard:05d}.safetensors"
        if rank == 0 and failure is None:
            try:
                data = safetensors_bytes(pending)
                write_file(os.path.join(partial, file), data)
                files[file] = len(data)
            except OSError as err:
                failure = err
        shard += 1
        pending, pending_bytes = {}, 0

    # Every rank runs the same loop (the gathers are collectives) and counts the same bytes, so all agree on
    # which shard holds which parameter; only rank 0 keeps and writes the tensors.
    for pname, param in named_parameters(ds.module):
        weight = _full_weight(param)
        tensors = {f"weight/{pname}": weight}
        for key in keys:
            tensors[f"{key}/{pname}"] = _full_state(ds, inner, param, key)
        if rank == 0:
            pending.update({k: v.contiguous() for k, v in tensors.items()})
        params[pname] = {"shape": list(weight.shape), "shard": f"shard-{shard:05d}.safetensors"}
        pending_bytes += sum(v.numel() * 4 for v in tensors.values())
        if pending_bytes >= SHARD_BYTES:
            flush()
    flush()
    return params, files, failure


def _write_states(ds, inner, scalars: dict, partial: str, rank: int, files: dict, failure):
    """This rank's RNG state; on rank 0 the engine's state (optimizer groups and scalars, scheduler, counters) and
    the model config. Returns the first failure (``failure`` if one came before)."""
    module = ds.module
    rng_file = f"rng/rank-{rank:05d}.pt"
    try:
        write_file(os.path.join(partial, rng_file), _torch_bytes(rng_state()))
    except OSError as err:
        failure = failure or err
    if rank == 0 and failure is None:
        try:
            engine_state = {
                "param_groups": [{k: v for k, v in group.items() if k != "params"}
                                 for group in (inner.param_groups if inner is not None else [])],
                "scalars": scalars,
                "lr_scheduler": ds.lr_scheduler.state_dict() if getattr(ds, "lr_scheduler", None) is not None
                else None,
                "counters": {k: int(getattr(ds, k, 0)) for k in ("global_steps", "global_samples", "micro_steps",
                                                                   "skipped_steps")},
            }
            data = _torch_bytes(engine_state)
            write_file(os.path.join(partial, "engine.pt"), data)
            files["engine.pt"] = len(data)
            config = getattr(module, "config", None)
            if hasattr(config, "to_json_string"):
                data = config.to_json_string().encode()
                write_file(os.path.join(partial, "config.json"), data)
                files["config.json"] = len(data)
        except OSError as err:
            failure = err
    return failure


def _meta(engine, inner, keys: list, scalars: dict, params: dict, files: dict, partial: str, world: int,
          client_state) -> dict:
    """The checkpoint's meta.json (rank 0, once every rank's files are written): what it holds and for which plan."""
    ds = engine.ds_engine
    for r in range(world):
        rf = os.path.join(partial, f"rng/rank-{r:05d}.pt")
        files[f"rng/rank-{r:05d}.pt"] = os.path.getsize(rf)
    c = engine.candidate
    return {"format": FORMAT, "version": VERSION, "autosp_version": _version(), "world": world,
            "candidate": asdict(c), "plan": c.short(), "dtype": engine.dtype, "step": int(ds.global_steps),
            "model": model_description(ds.module), "optimizer": {"class": type(inner).__name__ if inner else None,
                                                                 "tensor_states": keys, "scalars": scalars},
            "params": params, "files": files, "client_state": client_state or {}}


def _publish(partial: str, directory: str) -> None:
    """Rename the finished partial directory into place (an existing checkpoint of the same name is moved
    aside first and removed after: a crash in between leaves ``.NAME.old``, still loadable by hand)."""
    parent, name = os.path.split(directory)
    old = os.path.join(parent, f".{name}.old")
    if os.path.exists(directory):
        shutil.rmtree(old, ignore_errors=True)
        os.rename(directory, old)
    os.rename(partial, directory)
    fsync_dir(parent)
    shutil.rmtree(old, ignore_errors=True)


def _fail_together(failure, partial: str, directory: str, rank: int) -> None:
    """When any rank failed to write its part, every rank raises the same line and the partial directory goes."""
    if not _agree(failure is not None):
        return
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
    reason = (failure.strerror or str(failure)) if isinstance(failure, OSError) else "another rank could not write"
    raise CheckpointWriteError(f"cannot write checkpoint {directory}: {reason}; nothing was saved (any earlier "
                               "checkpoint is intact)")


def _broadcast_object(obj):
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _version() -> str:
    from autosp.version import __version__

    return __version__


# -- load -----------------------------------------------------------------------------------------------
def check_model(meta: dict, module, directory: str) -> None:
    """The checkpoint's parameters against the model's: same names and shapes, else one line."""
    params = meta["params"]
    ours = {name: list(p.ds_shape if _is_zero3(p) else p.shape) for name, p in named_parameters(module)}
    if set(ours) != set(params):
        missing = sorted(set(ours) - set(params))
        extra = sorted(set(params) - set(ours))
        first = (missing or extra)[0]
        raise UsageError(f"checkpoint {directory} holds another model: {len(missing)} of this model's parameters "
                         f"missing, {len(extra)} unknown (first: {first})")
    for name, shape in ours.items():
        if params[name]["shape"] != shape:
            what = "vocabulary" if "embed" in name or "lm_head" in name else "shape"
            raise UsageError(f"checkpoint {directory} holds another model ({what}): {name} is "
                             f"{tuple(params[name]['shape'])} there and {tuple(shape)} here")


def load_engine_checkpoint(engine, directory: str, *, load_optimizer: bool = True) -> dict:
    """Load a checkpoint written by :func:`save_engine_checkpoint` (under any plan) into ``engine``: weights,
    optimizer states and hyper-parameters, the LR scheduler, DeepSpeed's step counters and, when the world
    size is unchanged, this rank's RNG states. Returns the checkpoint's ``meta`` (``meta['client_state']`` is
    what the caller saved). Collective under ZeRO-3 (every rank calls it)."""
    import torch
    from safetensors import safe_open

    meta = read_meta(directory)
    ds = engine.ds_engine
    module = ds.module
    check_model(meta, module, directory)
    inner = _inner_optimizer(ds)
    keys = meta["optimizer"]["tensor_states"] if load_optimizer else []
    scalars = meta["optimizer"]["scalars"]
    if keys and inner is not None:
        _ensure_optimizer_states(ds, inner, keys, scalars)
    handles = {}
    try:
        for name, param in named_parameters(module):
            file = meta["params"][name]["shard"]
            if file not in handles:
                handles[file] = safe_open(os.path.join(directory, file), framework="pt")
            reader = handles[file]
            weight = reader.get_tensor(f"weight/{name}")
            _set_weight(param, weight)
            for key in keys:
                _set_state(inner, param, reader.get_tensor(f"{key}/{name}"), key)
    except (OSError, KeyError, RuntimeError, ValueError) as err:  # a damaged shard
        raise UsageError(f"checkpoint {directory} is corrupt: {str(err).splitlines()[0][:160]}") from None
    finally:
        handles.clear()
    try:
        state = torch.load(os.path.join(directory, "engine.pt"), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable engine.pt is the same corrupt checkpoint
        raise UsageError(f"checkpoint {directory} is corrupt: engine.pt unreadable ({type(err).__name__})") from None
    if load_optimizer and inner is not None:
        groups = state["param_groups"]
        for i, group in enumerate(inner.param_groups):
            saved = groups[i] if i < len(groups) else (groups[0] if groups else {})
            for key, value in saved.items():
                if key in group:
                    group[key] = value
        if state["lr_scheduler"] is not None and getattr(ds, "lr_scheduler", None) is not None:
            ds.lr_scheduler.load_state_dict(state["lr_scheduler"])
    for key, value in state["counters"].items():
        setattr(ds, key, value)
    rank, world = _rank_world()
    rng_file = os.path.join(directory, f"rng/rank-{rank:05d}.pt")
    if meta["world"] == world and os.path.exists(rng_file):
        set_rng_state(torch.load(rng_file, weights_only=False))
    return meta


def _ensure_optimizer_states(ds, inner, keys, scalars) -> None:
    """Create the optimizer's per-parameter states (zeros) when the engine has not stepped yet (torch
    optimizers create them lazily at their first step), then link DeepSpeed's ZeRO-1/2 views of them."""
    import torch

    holders = getattr(ds.optimizer, "fp32_partitioned_groups_flat", None)  # ZeRO-3 fills param_groups per step
    if holders is None:
        holders = [p for group in inner.param_groups for p in group["params"]]
    for p in holders:
        state = inner.state[p]
        if not state:
            for key in keys:
                state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
        for key, value in scalars.items():  # torch keeps Adam's step as a float32 scalar tensor
            old = state.get(key)
            state[key] = type(old)(value) if isinstance(old, (int, float)) else torch.tensor(float(value))
    link = getattr(ds.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if link is not None:
        link()


def _set_weight(param, value) -> None:
    import torch
    from deepspeed.utils import safe_set_full_fp32_param

    with torch.no_grad():
        if _is_zero3(param):
            import deepspeed

            safe_set_full_fp32_param(param, value.to(param.ds_tensor.device))
            with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
                param.data.copy_(value.to(param.device, param.dtype))
            return
        if hasattr(param, "_hp_mapping"):
            safe_set_full_fp32_param(param, value.to(param.device))
        param.data.copy_(value.to(param.device, param.dtype))


def _set_state(inner, param, value, key) -> None:
    import torch
    from deepspeed.utils import safe_set_full_optimizer_state

    with torch.no_grad():
        if hasattr(param, "_hp_mapping") or _is_zero3(param):
            safe_set_full_optimizer_state(param, value, key)
        else:
            inner.state[param][key].copy_(value.to(inner.state[param][key].device))
