"""Usable memory per rank, host<->device bandwidth and the host's own DRAM bandwidth.

The cost model (cost_models/memory.py) budgets the runtime's own footprint (CUDA context, NCCL buffers,
fragmentation) as a separate *reserve*; ``usable_memory_fraction`` is the share of ``memory_bytes`` the
system leaves to a training process *before* that reserve, so we add the footprint we observe back
rather than count it twice. The footprint itself is recorded for comparison with the reserve.

- GPU: at the end of the run (CUDA context and NCCL communicators exist), with the caching allocator
  emptied: ``overhead = total - free`` (context, NCCL, and anything else on the device: calibrate on
  otherwise idle GPUs), then a probe allocates chunks (1 GiB, then smaller down to 16 MiB) until the
  allocator refuses and frees them. usable = ``(allocatable + overhead) / total``.
- CPU: at the start of the run, with every rank process alive and torch loaded, before any measuring
  buffer exists: ``MemTotal`` and ``MemAvailable`` from /proc/meminfo and each rank's resident set
  (``VmRSS``, the CPU analogue of the CUDA context). A rank's share is ``MemTotal / ranks``; usable =
  ``(MemAvailable + sum of rank RSS) / MemTotal``. Nothing is allocated to probe: the node is shared,
  and the kernel would rather kill a process than refuse an allocation.
"""

from __future__ import annotations

import os

import torch

from autosp.profiling.calibration.timing import measure

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


def rss_bytes() -> float:
    """This process's resident set (``VmRSS``), 0 where /proc is missing."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return float(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def gpu_memory(device, min_chunk: int = 16 << 20, first_chunk: int = _GiB) -> dict:
    """Probe how much this rank can allocate on ``device`` (frees everything it took)."""
    torch.cuda.empty_cache()
    total = float(torch.cuda.get_device_properties(device).total_memory)
    free_before, _ = torch.cuda.mem_get_info(device)
    reserved = float(torch.cuda.memory_reserved(device))
    overhead = max(0.0, total - free_before - reserved)
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
    return {"total_bytes": total, "free_reported_bytes": float(free_before), "allocator_reserved_bytes": reserved,
            "overhead_bytes": overhead, "allocatable_bytes": float(allocated + reserved),
            "usable_fraction": min(1.0, (allocated + reserved + overhead) / total),
            "source": "torch.cuda allocation probe"}


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


def node_cpus() -> int:
    """The CPUs this process may run on (its affinity; all of the node's where that is not known)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def host_stream_bandwidth(nbytes: int, threads: int, settings) -> dict:
    """This node's sustained DRAM bandwidth, the figure CPU Adam streams through under optimizer offload: a triad
    ``a = b + 0.5 c`` over three fp32 host arrays of ``nbytes`` each on ``threads`` threads (2 reads and a write,
    3 x nbytes moved per pass; STREAM's triad). One rank per node runs it while the others wait, with every CPU
    the rank may use: the optimizer step has the node's cores to itself as well."""
    n = max(1, nbytes // 4)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        b = torch.ones(n, dtype=torch.float32)
        c = torch.ones(n, dtype=torch.float32)
        a = torch.empty_like(b)
        timing = measure(lambda: torch.add(b, c, alpha=0.5, out=a), lambda: None, settings)
    finally:
        torch.set_num_threads(before)
    moved = 3.0 * n * 4
    return {"bytes": n * 4.0, "threads": threads, "bytes_moved": moved, "seconds": timing["seconds"],
            "bandwidth": moved / timing["seconds"], "samples": timing["samples"]}


__all__ = ["gpu_memory", "host_device_bandwidth", "host_memory", "host_stream_bandwidth", "node_cpus", "rss_bytes"]
