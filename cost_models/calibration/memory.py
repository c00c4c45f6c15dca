"""Usable memory per rank and host<->device bandwidth.

- GPU: the device's total memory, and a probe of what one rank can really allocate once its CUDA
  context, the process group and the calibration's own buffers exist: allocate chunks (1 GiB, then
  smaller down to 16 MiB) until the allocator refuses, add them up, free them.
- CPU: the node's RAM from /proc/meminfo (``MemTotal``, ``MemAvailable``), read while every rank
  process is alive with torch loaded; a rank's share is ``MemTotal / ranks`` of which
  ``MemAvailable / MemTotal`` is usable. Nothing is allocated: the node is shared, and the kernel would
  rather kill a process than refuse an allocation.
"""

from __future__ import annotations

import os

import torch

from autosp.cost_models.calibration.timing import measure

_GiB = 1 << 30


def host_memory() -> dict:
    """``{"total_bytes", "available_bytes", "source"}`` of this node's RAM."""
    try:
        fields = {}
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                fields[key] = int(rest.split()[0]) * 1024
        return {"total_bytes": float(fields["MemTotal"]), "available_bytes": float(fields["MemAvailable"]),
                "source": "/proc/meminfo MemTotal, MemAvailable"}
    except (OSError, KeyError, ValueError, IndexError):
        page = os.sysconf("SC_PAGE_SIZE")
        return {"total_bytes": float(os.sysconf("SC_PHYS_PAGES") * page),
                "available_bytes": float(os.sysconf("SC_AVPHYS_PAGES") * page),
                "source": "sysconf SC_PHYS_PAGES, SC_AVPHYS_PAGES (free, not reclaimable: pessimistic)"}


def cpu_memory(local_ranks: int) -> dict:
    host = host_memory()
    return {**host, "ranks": local_ranks,
            "per_rank_bytes": host["total_bytes"] / local_ranks,
            "per_rank_usable_bytes": host["available_bytes"] / local_ranks,
            "usable_fraction": host["available_bytes"] / host["total_bytes"]}


def gpu_memory(device, min_chunk: int = 16 << 20, first_chunk: int = _GiB) -> dict:
    """Probe how much this rank can allocate on ``device`` (frees everything it took)."""
    torch.cuda.empty_cache()
    total = float(torch.cuda.get_device_properties(device).total_memory)
    free_before, _ = torch.cuda.mem_get_info(device)
    held, allocated, chunk = [], 0, first_chunk
    try:
        for _ in range(100_000):
            if chunk < min_chunk:
                break
            try:
                held.append(torch.empty(chunk, dtype=torch.uint8, device=device))
                allocated += chunk
            except torch.cuda.OutOfMemoryError:
                chunk //= 4
    finally:
        del held
        torch.cuda.empty_cache()
    return {"total_bytes": total, "free_reported_bytes": float(free_before), "allocatable_bytes": float(allocated),
            "usable_fraction": allocated / total, "source": "torch.cuda allocation probe"}


def host_device_bandwidth(nbytes: int, device, sync, settings) -> dict:
    """Pinned host -> device and device -> host copy rates (bytes/s) of ``nbytes``."""
    n = max(1, nbytes // 4)
    host = torch.zeros(n, dtype=torch.float32, pin_memory=True)
    dev = torch.zeros(n, dtype=torch.float32, device=device)
    h2d = measure(lambda: dev.copy_(host, non_blocking=True), sync, settings)
    d2h = measure(lambda: host.copy_(dev, non_blocking=True), sync, settings)
    size = n * 4.0
    return {"bytes": size, "h2d": size / h2d["seconds"], "d2h": size / d2h["seconds"],
            "h2d_samples": h2d["samples"], "d2h_samples": d2h["samples"]}
