"""Running the measurements on every rank: one process, N processes spawned here, or under torchrun.

Every rank measures compute and memory *at the same time* (on a CPU the ranks share the cores and the
memory bus exactly as training ranks do), then the collectives on each group size, then rank 0 gathers
every rank's raw results. Groups are ranks ``0..g-1`` for ``g`` = 2, 4, 8, ... up to the ranks on one node
(and that count itself); under a multi-node torchrun the whole world is one more, inter-node, group
(torchrun numbers the ranks of a node contiguously).
"""

from __future__ import annotations

import os
import socket
import tempfile
import json
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from autosp.profiling.calibration import collectives, compute, memory
from autosp.profiling.calibration.progress import Progress
from autosp.profiling.calibration.settings import Settings
from autosp.profiling.calibration.timing import synchronizer

PG_TIMEOUT = timedelta(seconds=300)


@dataclass(frozen=True)
class LaunchConfig:
    settings: Settings
    backend: str  # "gloo" or "nccl"
    threads: int  # intra-op threads per rank (CPU)
    progress: bool = True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_sizes(local_world: int, world: int) -> list:
    """``[(size, scope)]``: 2, 4, 8, ... and ``local_world`` within a node, then ``world`` across nodes."""
    sizes, g = [], 2
    while g <= local_world:
        sizes.append(g)
        g *= 2
    if local_world >= 2 and local_world not in sizes:
        sizes.append(local_world)
    out = [(s, "intra") for s in sizes]
    if world > local_world:
        out.append((world, "inter"))
    return out


def torchrun_env() -> dict | None:
    """The ranks torchrun (or any env:// launcher) gave this process, or None when not launched so."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    from autosp.errors import UsageError

    def number(name: str, default: str) -> int:
        value = os.environ.get(name, default)
        try:
            return int(value)
        except ValueError:
            raise UsageError(f"the launcher set {name}={value!r}, not an integer") from None

    world = number("WORLD_SIZE", "")
    return {"rank": number("RANK", ""), "world": world, "local_rank": number("LOCAL_RANK", os.environ["RANK"]),
            "local_world": number("LOCAL_WORLD_SIZE", str(world))}


def _device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def run_rank(rank: int, world: int, local_rank: int, local_world: int, cfg: LaunchConfig,
             init_method: str | None) -> dict | None:
    """Measure on this rank; returns the gathered raw results on rank 0 and None elsewhere."""
    settings = cfg.settings
    if settings.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(cfg.threads)
    sync = synchronizer(device)
    distributed = world > 1
    ctrl = None
    if distributed:
        dist.init_process_group(cfg.backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=PG_TIMEOUT)
        ctrl = dist.new_group(backend="gloo") if cfg.backend != "gloo" else None
    try:
        groups = group_sizes(local_world, world) if distributed else []
        handles = [(g, scope, None if g == world else dist.new_group(list(range(g)))) for g, scope in groups]
        total = compute.count_compute_items(settings) + 2 + (settings.device == "cuda")
        total += collectives.count_collective_items(groups, settings)
        progress = Progress(total, enabled=cfg.progress and rank == 0)
        mine = {"rank": rank, "local_rank": local_rank, "host": socket.gethostname(),
                "device_name": _device_name(device), "threads": torch.get_num_threads()}
        if distributed:
            dist.barrier(group=ctrl)  # every rank alive with torch loaded, no measuring buffer yet
        mine["rss_at_start"] = memory.rss_bytes()
        mine["host_memory"] = memory.host_memory()
        if distributed:
            dist.barrier(group=ctrl)  # start together: the ranks contend for shared resources as in training
        mine["compute"] = compute.run_compute(device, sync, settings, progress.tick)
        mine["host_bandwidth"] = None
        if settings.device == "cuda":
            progress.tick("host<->device copies")
            mine["host_bandwidth"] = memory.host_device_bandwidth(settings.host_copy_bytes, device, sync, settings)
        mine["collectives"] = {}
        for g, scope, handle in handles:
            dist.barrier(group=ctrl)
            if rank < g:
                mine["collectives"][str(g)] = collectives.sweep_group(g, handle, device, sync, settings,
                                                                      progress.tick)
            else:
                for _ in range(collectives.count_collective_items([(g, scope)], settings)):
                    progress.tick("waiting")
        if distributed:
            dist.barrier(group=ctrl)
        progress.tick("host memory bandwidth")  # one rank per node, the others wait: the node's DRAM to itself
        mine["host_stream"] = (memory.host_stream_bandwidth(settings.host_stream_bytes, memory.node_cpus(), settings)
                               if local_rank == 0 else None)
        if distributed:
            dist.barrier(group=ctrl)
        progress.tick("usable memory")
        mine["gpu_memory"] = memory.gpu_memory(device) if settings.device == "cuda" else None
        if distributed:
            gathered = [None] * world if rank == 0 else None
            dist.gather_object(mine, gathered, dst=0, group=ctrl)
        else:
            gathered = [mine]
        progress.close("measured")
        if rank != 0:
            return None
        return {"ranks": gathered, "groups": [{"size": g, "scope": s} for g, s in groups],
                "world_size": world, "local_world_size": local_world, "backend": cfg.backend if distributed else None,
                "device": settings.device, "torch_version": torch.__version__,
                "cuda_version": torch.version.cuda, "settings": asdict(settings),
                "attention_kernel": _attention_kernel(torch, settings.device)}
    finally:
        if distributed:
            dist.destroy_process_group()


def _attention_kernel(torch, device: str) -> str:
    """The kernel SDPA ran the attention measurement with here (the machine's default: the same rule as the
    compiler's, cost_models/catalog/attention_kernels.py); '' on CPU (its figure is not per kernel)."""
    from autosp.cost_models.catalog.attention_kernels import available, machine_of

    if device != "cuda":
        return ""
    kernel = available(machine_of(torch))[0]
    return kernel if kernel in ("flash2", "cudnn") else ""  # SDPA's own default order runs one of these


def _spawn_entry(rank: int, world: int, cfg: LaunchConfig, init_method: str, result_path: str) -> None:
    raw = run_rank(rank, world, rank, world, cfg, init_method)
    if rank == 0:
        with open(result_path, "w", encoding="utf-8") as f:
            json.dump(raw, f)


class WorkerFailed(RuntimeError):
    """A rank process raised; the message is the last line of its traceback."""


def run_spawned(world: int, cfg: LaunchConfig) -> dict:
    """Spawn ``world`` rank processes on this machine (free TCP port on 127.0.0.1) and return rank 0's result."""
    import torch.multiprocessing as mp

    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(cfg.threads)  # read by each child's OpenMP runtime at start-up
    try:
        with tempfile.TemporaryDirectory(prefix="autosp-calibrate-") as tmp:
            result_path = os.path.join(tmp, "raw.json")
            init_method = f"tcp://127.0.0.1:{free_port()}"
            try:
                mp.spawn(_spawn_entry, args=(world, cfg, init_method, result_path), nprocs=world, join=True)
            except (mp.ProcessRaisedException, mp.ProcessExitedException) as err:  # a rank raised, or was killed
                lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
                raise WorkerFailed(lines[-1] if lines else str(err)) from None
            with open(result_path, encoding="utf-8") as f:
                return json.load(f)
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved


def run_single(cfg: LaunchConfig) -> dict:
    """One rank, in this process (no process group, no collectives)."""
    saved = torch.get_num_threads()
    try:
        return run_rank(0, 1, 0, 1, cfg, None)
    finally:
        torch.set_num_threads(saved)


def run_torchrun(env: dict, cfg: LaunchConfig) -> dict | None:
    """This process is one rank of a torchrun launch (env://); rank 0 gets the result, the others None."""
    return run_rank(env["rank"], env["world"], env["local_rank"], env["local_world"], cfg, "env://")


__all__ = ["PG_TIMEOUT", "LaunchConfig", "WorkerFailed", "free_port", "group_sizes", "run_rank", "run_single",
           "run_spawned", "run_torchrun", "torchrun_env"]
