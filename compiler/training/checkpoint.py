"""Checkpoints that any plan can load, written by every rank at once through ``torch.distributed.checkpoint`` (DCP).

Layout of one checkpoint directory (``SPEngine.save_checkpoint(dir)``; ``autosp-train --save-dir`` keeps one
per saved step, ``step-00000004/`` ..., and a ``latest`` file naming the newest)::

    __0_0.distcp ...   one file per rank (DCP's): the rank's own fragments of every parameter's fp32 master weight
                       ("weight/NAME") and of every tensor state of the optimizer ("exp_avg/NAME", "exp_avg_sq/NAME"
                       for Adam), each a range of the flattened tensor; rank R's RNG states ("rng/rank-R": python,
                       numpy, torch, CUDA); in rank 0's, the engine's state ("engine": optimizer hyper-parameters and
                       scalar states such as Adam's step, the LR scheduler's state_dict, DeepSpeed's step counters)
    .metadata          DCP's global layout: every tensor's size and which rank's file holds which range of it
    config.json        the Hugging Face config of the model, when it has one
    meta.json          written last, by rank 0: format and version, the plan it was saved under, the model, every
                       parameter's shape, every file's size, and the caller's ``client_state``

What each rank writes. Its ZeRO partition as it holds it (:mod:`.engine_fragments`): at ZeRO-3 its partition of
every parameter, at ZeRO-1/2 its piece of the flat fp32 buffer, cut at parameter boundaries; parameters every
rank holds whole (ZeRO-0, frozen ones) are split evenly, so every rank writes about 1/world of the bytes. Nothing
is gathered: the previous format gathered every parameter and state to rank 0, one collective per tensor, and
rank 0 alone wrote all of it while the other ranks waited.

Resharding. A tensor is stored as ranges of its flattened form with their global offsets
(:mod:`.dcp_planners`), so a load asks DCP for whatever range the loading rank holds under its own plan (another
SP degree, ring, ZeRO stage, offload or GPU count) and DCP reads the overlapping pieces of the saving ranks'
files. Each rank reads on its own (``no_dist``), a group of tensors at a time, straight into its partition.

Why not DeepSpeed's own checkpoint files. ``DeepSpeedEngine.save_checkpoint`` writes each rank's flat optimizer
buffers, which load only under the same data-parallel world and ZeRO stage (DeepSpeed's universal checkpoint
converts them offline, as a second pass over the whole checkpoint). autosp changes the world (SP x DP: all ranks
are DeepSpeed's data-parallel world) and the ZeRO stage between plans, so it writes per-parameter ranges directly.

Atomicity. Everything is written into ``.NAME.partial`` next to the target (DCP fsyncs each file), then
``meta.json`` (fsynced) and the directory is renamed into place (and the parent fsynced): a checkpoint directory
without a readable ``meta.json`` is incomplete and never loaded. A failure (a full disk) on any rank is agreed on
by all ranks (DCP gathers every rank's write result), the partial directory is removed, and every rank raises the
same one-line error.

Asynchronous saves (``asynchronous=True``, ``autosp-train --async-save``): the rank's fragments are copied to
host memory (DCP's staging), ``dcp.async_save`` writes them in a background thread while training goes on, and
the partial directory is published when the write is complete (:class:`PendingSave`).

Format version 1 (``shard-*.safetensors`` with full tensors, ``engine.pt``, ``rng/rank-*.pt``: what autosp wrote
before DCP) is still read: resume, warm start and export (:mod:`.checkpoint_read`).
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
from dataclasses import asdict

from autosp.errors import AutospError, UsageError

__all__ = ["FORMAT", "META", "CheckpointWriteError", "PendingSave", "load_engine_checkpoint", "read_meta",
           "rng_state", "save_engine_checkpoint", "set_rng_state", "storage_writer", "write_file"]

FORMAT = "autosp-checkpoint"
VERSION = 2  # 1: rank 0 wrote safetensors shards of full tensors; 2: DCP, every rank its own fragments
META = "meta.json"
LOAD_BYTES = 1 << 28  # what one rank reads per DCP load on resume (its fragments of a few layers), beyond one tensor
# what a directory holds when a save into it began: it is an interrupted checkpoint, not some other directory
PARTIAL_SIGNS = (".metadata", "engine.pt", "rng", "config.json")


class CheckpointWriteError(AutospError):
    """Writing a checkpoint failed (a full disk, a vanished directory); the previous checkpoint is untouched."""

    exit_code = 1


# -- files ------------------------------------------------------------------------------------------
def write_file(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it (inside a partial directory: the rename of the directory is what
    publishes it)."""
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


def storage_writer(path: str):
    """The DCP writer of a checkpoint's files: one file per rank, each fsynced (tests subclass it to fail)."""
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(path, single_file_per_rank=True, sync_files=True)


def _torch_bytes(obj) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _looks_partial(directory: str) -> bool:
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    return os.path.basename(directory.rstrip(os.sep)).endswith(".partial") or any(
        n in PARTIAL_SIGNS or n.endswith(".distcp") or (n.startswith("shard-") and n.endswith(".safetensors"))
        for n in names)


def read_meta(directory: str) -> dict:
    """The ``meta.json`` of a complete checkpoint; UsageError (one line) for anything else."""
    path = os.path.join(directory, META)
    if not os.path.isdir(directory):
        raise UsageError(f"checkpoint {directory} does not exist or is not a directory")
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        if _looks_partial(directory):
            raise UsageError(f"checkpoint {directory} is incomplete (no {META}: its save was interrupted)") from None
        raise UsageError(f"{directory} is not an autosp checkpoint (no {META}); give a checkpoint directory "
                         "(a --save-dir's step-N) or a --save-dir") from None
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


def _first_message(message: str | None) -> str | None:
    """The first rank's message, on every rank (None when no rank has one)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return message
    if not _agree(message is not None):
        return None
    messages = [None] * dist.get_world_size()
    dist.all_gather_object(messages, message)
    return next(m for m in messages if m is not None)


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
def save_engine_checkpoint(engine, directory: str, client_state: dict | None = None, *,
                           asynchronous: bool = False):
    """Write ``engine``'s full training state to ``directory`` (see the module docstring). Collective: every rank
    calls it with the same directory (on a filesystem all ranks see). Returns the directory, or with
    ``asynchronous`` a :class:`PendingSave` whose :meth:`~PendingSave.wait` (collective) returns it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from autosp.compiler.training.dcp_planners import FlatSavePlanner

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
            os.makedirs(partial)
            config = getattr(ds.module, "config", None)
            if hasattr(config, "to_json_string"):
                write_file(os.path.join(partial, "config.json"), config.to_json_string().encode())
        except OSError as err:
            failure = err
    _fail_together(failure, partial, directory, rank)

    inner = _inner_optimizer(ds)
    keys, scalars = _broadcast_object(_optimizer_keys(inner) if inner is not None else ([], {}))
    state, fragments = _state_dict(ds, inner, keys, scalars, rank, world)
    meta = _meta(engine, inner, keys, scalars, world, client_state)
    planner = FlatSavePlanner(fragments)
    if asynchronous:
        future = dcp.async_save(state, storage_writer=storage_writer(partial), planner=planner,
                                process_group=_dcp_group())
        return PendingSave(future, partial, directory, meta, rank)
    try:
        dcp.save(state, storage_writer=storage_writer(partial), planner=planner, process_group=_dcp_group())
    except (Exception, CheckpointException) as err:  # noqa: BLE001 - DCP raises the same one on every rank
        failure = err
    _fail_together(failure, partial, directory, rank)
    _finish(partial, directory, meta, rank)
    return directory


def _state_dict(ds, inner, keys: list, scalars: dict, rank: int, world: int) -> tuple[dict, dict]:
    """This rank's DCP state dict ({key: its fragment, or bytes}) and the fragments' places ({key: (numel,
    offset)})."""
    from autosp.compiler.training.checkpoint_read import rng_key
    from autosp.compiler.training.engine_fragments import parts, replicated_masters, saved_tensors

    state, fragments = {}, {}
    masters = replicated_masters(ds.optimizer)
    for part in parts(named_parameters(ds.module), rank, world, loading=False, masters=masters):
        if part.length == 0:
            continue
        for key, tensor in saved_tensors(part, inner, keys).items():
            state[f"{key}/{part.name}"] = tensor
            fragments[f"{key}/{part.name}"] = (part.numel, part.offset)
    state[rng_key(rank)] = _torch_bytes(rng_state())
    if rank == 0:
        state["engine"] = _torch_bytes({
            "param_groups": [{k: v for k, v in group.items() if k != "params"}
                             for group in (inner.param_groups if inner is not None else [])],
            "scalars": scalars,
            "lr_scheduler": ds.lr_scheduler.state_dict() if getattr(ds, "lr_scheduler", None) is not None else None,
            "counters": {k: int(getattr(ds, k, 0)) for k in ("global_steps", "global_samples", "micro_steps",
                                                               "skipped_steps")},
        })
    return state, fragments


def _meta(engine, inner, keys: list, scalars: dict, world: int, client_state) -> dict:
    """The checkpoint's meta.json, less its file sizes (added once the files are written)."""
    ds = engine.ds_engine
    c = engine.candidate
    params = {name: {"shape": list(p.ds_shape if _is_zero3(p) else p.shape), "trainable": bool(p.requires_grad)}
              for name, p in named_parameters(ds.module)}
    return {"format": FORMAT, "version": VERSION, "storage": "torch.distributed.checkpoint",
            "autosp_version": _version(), "world": world, "candidate": asdict(c), "plan": c.short(),
            "dtype": engine.dtype, "step": int(ds.global_steps), "model": model_description(ds.module),
            "optimizer": {"class": type(inner).__name__ if inner else None, "tensor_states": keys,
                          "scalars": scalars},
            "params": params, "files": {}, "client_state": client_state or {}}


def _finish(partial: str, directory: str, meta: dict, rank: int) -> None:
    """Rank 0 writes meta.json (every rank's files are complete: DCP returned on all of them) and publishes the
    directory; a failure is every rank's error (collective)."""
    failure = None
    if rank == 0:
        try:
            _write_meta_and_publish(partial, directory, meta)
        except OSError as err:
            failure = err
    _fail_together(failure, partial, directory, rank)


def _write_meta_and_publish(partial: str, directory: str, meta: dict) -> None:
    files = {name: os.path.getsize(os.path.join(partial, name)) for name in sorted(os.listdir(partial))}
    write_file(os.path.join(partial, META), json.dumps({**meta, "files": files}, indent=1, default=str).encode())
    fsync_dir(partial)
    _publish(partial, directory)


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


def _reason(failure) -> str:
    """One line for what went wrong: an OSError's own words (DCP wraps each rank's exception)."""
    if isinstance(failure, OSError):
        return failure.strerror or str(failure)
    for err in (getattr(failure, "failures", None) or {}).values():  # DCP's: {rank: (exception, traceback)}
        err = err[0] if isinstance(err, tuple) else err
        while err is not None and not isinstance(err, OSError):
            err = err.__cause__ or err.__context__
        if err is not None:
            return err.strerror or str(err)
    return str(failure).splitlines()[0][:200] if failure is not None else "another rank could not write"


def _fail_together(failure, partial: str, directory: str, rank: int) -> None:
    """When any rank failed to write its part, every rank raises the same line and the partial directory goes."""
    reason = _first_message(None if failure is None else _reason(failure))
    if reason is None:
        return
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
    raise CheckpointWriteError(f"cannot write checkpoint {directory}: {reason}; nothing was saved (any earlier "
                               "checkpoint is intact)")


class PendingSave:
    """An asynchronous save under way: DCP writes the staged fragments in a background thread; the partial
    directory is published by :meth:`poll` (rank 0, after any step, once the write is complete) or
    :meth:`wait` (every rank: before the next save and at exit)."""

    def __init__(self, future, partial: str, directory: str, meta: dict, rank: int):
        self.future, self.partial, self.directory, self.meta, self.rank = future, partial, directory, meta, rank
        self.published = False
        self._error: Exception | None = None

    def poll(self) -> bool:
        """Rank 0: publish when the write is complete and succeeded; True when it was published now. (DCP's
        success on rank 0 means every rank's files are written: it gathers their results before returning.)"""
        if self.rank != 0 or self.published or self._error is not None or not self.future.done():
            return False
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            self.future.result()
            _write_meta_and_publish(self.partial, self.directory, self.meta)
            self.published = True
        except (Exception, CheckpointException) as err:  # noqa: BLE001 - reported by wait(), agreed by all ranks
            self._error = err
        return self.published

    def wait(self) -> str:
        """Wait for the write and publish it (collective); the one-line error of any rank's failure."""
        from torch.distributed.checkpoint.api import CheckpointException

        failure = self._error
        if failure is None:
            try:
                self.future.result()
            except (Exception, CheckpointException) as err:  # noqa: BLE001 - the same on every rank
                failure = err
        if failure is None:
            self.poll()
            failure = self._error
        _fail_together(failure, self.partial, self.directory, self.rank)
        return self.directory


_DCP_GROUP = []


def _dcp_group():
    """A gloo group of all ranks for DCP's planning collectives (small pickled plans, host memory): an
    asynchronous save runs them in a background thread, which must not share a group with the training's
    collectives, and ``async_save`` refuses a group without a CPU backend (NCCL, the training's on GPUs).
    Created at the first save, which every rank makes."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    if not _DCP_GROUP:
        _DCP_GROUP.append(dist.new_group(backend="gloo"))
    return _DCP_GROUP[0]


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
    """Load a checkpoint written by :func:`save_engine_checkpoint` (under any plan, either format version) into
    ``engine``: weights, optimizer states and hyper-parameters, the LR scheduler, DeepSpeed's step counters and,
    when the world size is unchanged, this rank's RNG states. Returns the checkpoint's ``meta``
    (``meta['client_state']`` is what the caller saved). Collective (every rank calls it)."""
    from autosp.compiler.training.checkpoint_read import Reader, rng_key
    from autosp.compiler.training.engine_fragments import finish_load, parts, prepare_load, replicated_masters

    meta = read_meta(directory)
    ds = engine.ds_engine
    check_model(meta, ds.module, directory)
    inner = _inner_optimizer(ds)
    keys = meta["optimizer"]["tensor_states"] if load_optimizer and inner is not None else []
    if keys:
        _ensure_optimizer_states(ds, inner, keys, meta["optimizer"]["scalars"])
    rank, world = _rank_world()
    reader = Reader(directory, meta)
    prepare_load(ds)
    problem, objects = None, {}
    try:
        mine = parts(named_parameters(ds.module), rank, world, loading=True, masters=replicated_masters(ds.optimizer))
        _load_parts(reader, mine, inner, keys, meta)
        objects = reader.objects(["engine", rng_key(rank)])
        if "engine" not in objects:
            raise KeyError("no engine state")
    except Exception as err:  # noqa: BLE001 - any unreadable piece is the same corrupt checkpoint
        problem = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}" if str(err) else type(err).__name__
    problem = _first_message(problem)
    if problem is not None:
        raise UsageError(f"checkpoint {directory} is corrupt ({problem}); resume from an earlier one")
    finish_load(ds)
    _restore_engine_state(ds, inner, objects["engine"], load_optimizer)
    if meta["world"] == world and rng_key(rank) in objects:
        set_rng_state(objects[rng_key(rank)])
    return meta


def _load_parts(reader, all_parts, inner, keys, meta) -> None:
    """Read this rank's ranges, a group of about LOAD_BYTES at a time (in place where the engine's storage allows,
    :func:`~.engine_fragments.load_targets`), and hand them to the engine."""
    from autosp.compiler.training.engine_fragments import apply_loaded, load_targets

    group, size = [], 0

    def flush():
        wants, loaded = {}, []
        for part in group:
            saved_states = meta["params"][part.name].get("trainable", True)
            targets = load_targets(part, inner, keys if saved_states else ())
            for key, target in targets.items():
                wants[f"{key}/{part.name}"] = (part.numel, part.offset, target)
            loaded.append((part, targets))
        reader.fill(wants)
        for part, targets in loaded:
            apply_loaded(part, inner, targets)

    for part in all_parts:
        if part.length == 0:
            continue
        group.append(part)
        size += part.length * 4 * (1 + len(keys))
        if size >= LOAD_BYTES:
            flush()
            group, size = [], 0
    if group:
        flush()


def _restore_engine_state(ds, inner, state: dict, load_optimizer: bool) -> None:
    """Optimizer hyper-parameters, the LR scheduler and DeepSpeed's counters from the saved engine state."""
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
