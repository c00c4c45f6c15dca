"""Where one measured step's device time goes: kernel time by kind, and the time the device sat idle.

A step the cost model under-predicts is either slower kernels than priced (attention, matmuls, copies) or a
device that waits for the host (launch overhead, synchronisations, host-side work such as an offloaded optimizer).
:func:`breakdown` profiles one extra step after the timed ones (``RunConfig.kernel_breakdown``, the GPU check's
``--kernel-breakdown ROWS``) and sums the device events by kind (:func:`kind_of`, from the kernel's name), with the
union of all events as the busy time; idle = the step's wall time - busy. Profiling slows the step a little (the
wall time is reported beside the timed median); the kinds' shares are what to read.

On a CPU (tests) it runs the same on the CPU's operator events, which nest, so there the kinds overlap.
"""

from __future__ import annotations

import time

__all__ = ["KINDS", "breakdown", "kind_of", "summarize"]

KINDS = (
    ("attention", ("flash", "fmha", "attn", "sdpa", "scaled_dot_product", "cudnn")),
    ("matmul", ("gemm", "cutlass", "xmma", "cublas", "nvjet", "aten::mm", "aten::addmm", "aten::bmm")),
    ("collective", ("nccl", "gloo", "all_to_all", "allgather", "reduce_scatter", "allreduce")),
    ("copy", ("memcpy", "memset", "aten::copy_")),
)
"""(kind, name fragments) in order of precedence; a device event whose lower-cased name holds a fragment is of
that kind, any other is "other"."""


def kind_of(name: str) -> str:
    lower = name.lower()
    for kind, fragments in KINDS:
        if any(f in lower for f in fragments):
            return kind
    return "other"


def _union_seconds(intervals: list[tuple[int, int]]) -> float:
    busy, end = 0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    return busy / 1e9


def summarize(events: list[tuple[str, int, int]], wall_seconds: float) -> dict:
    """``events``: (name, start ns, duration ns) of one step's device events. Seconds per kind, events per kind,
    busy (their union), idle (wall - busy), and the five longest kernels by total time."""
    seconds: dict[str, float] = {kind: 0.0 for kind, _ in KINDS}
    seconds["other"] = 0.0
    counts = dict.fromkeys(seconds, 0)
    by_name: dict[str, float] = {}
    for name, _start, duration in events:
        kind = kind_of(name)
        seconds[kind] += duration / 1e9
        counts[kind] += 1
        by_name[name] = by_name.get(name, 0.0) + duration / 1e9
    busy = _union_seconds([(start, start + duration) for _name, start, duration in events])
    top = sorted(by_name.items(), key=lambda item: -item[1])[:5]
    return {"wall": wall_seconds, "busy": busy, "idle": max(0.0, wall_seconds - busy), "seconds": seconds,
            "events": counts, "top": [{"name": name[:120], "seconds": s} for name, s in top]}


def breakdown(step, device) -> dict:
    """One step of ``step`` under the profiler: :func:`summarize` of its device events (CUDA kernels and copies on a
    GPU, operators on a CPU). Never raises: a failure comes back as ``{"error": ...}`` (the row keeps its timings)."""
    try:
        import torch
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        cuda = str(device).startswith("cuda")
        activity, wanted = (ProfilerActivity.CUDA, DeviceType.CUDA) if cuda else (ProfilerActivity.CPU, DeviceType.CPU)
        sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
        sync()
        with profile(activities=[activity]) as prof:
            t0 = time.perf_counter()
            step()
            sync()
            wall = time.perf_counter() - t0
        events = [(e.name(), e.start_ns(), e.duration_ns()) for e in prof.profiler.kineto_results.events()
                  if e.device_type() == wanted and e.duration_ns() > 0]
        return summarize(events, wall)
    except Exception as err:  # noqa: BLE001 - a diagnostic must not fail the row it describes
        return {"error": f"{type(err).__name__}: {err}"}
