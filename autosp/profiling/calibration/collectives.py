"""Collective times per group size and message size (all-to-all, all-reduce, all-gather, reduce-scatter).

Every rank of the group loops the collective; a sample is the mean time of one call over the loop, the
rank's figure the median sample (the fastest is kept too), and the group's figure the slowest rank's (a collective is done when its
last rank is). Buffers are zeros, so repeated all-reduces never overflow. Message sizes follow
:mod:`.fit` (the larger of a rank's input and output buffers) and are rounded down to a multiple of the
group size so every rank gets an equal share.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from autosp.profiling.calibration.fit import COLLECTIVES, bus_factor, median
from autosp.profiling.calibration.timing import inner_count, time_samples

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _make_op(collective: str, numel: int, group_size: int, group, device, dtype):
    """A zero-argument callable running one collective of ``numel`` elements (the larger buffer)."""
    big = torch.zeros(numel, device=device, dtype=dtype)
    if collective == "all_to_all":
        out = torch.empty_like(big)
        return lambda: dist.all_to_all_single(out, big, group=group)
    if collective == "all_reduce":
        return lambda: dist.all_reduce(big, group=group)
    small = torch.zeros(numel // group_size, device=device, dtype=dtype)
    if collective == "all_gather":
        return lambda: _all_gather(big, small, group=group)
    if collective == "reduce_scatter":
        return lambda: _reduce_scatter(small, big, group=group)
    raise ValueError(f"unknown collective {collective!r}")


def comm_dtype(device, profile_dtype: str):
    """bf16 on GPU for a bf16 profile (what training sends); fp32 otherwise (gloo's best-supported type)."""
    return torch.bfloat16 if device.type == "cuda" and profile_dtype == "bf16" else torch.float32


def count_collective_items(group_sizes, settings) -> int:
    return len(group_sizes) * len(COLLECTIVES) * len(settings.message_sizes)


def sweep_group(group_size: int, group, device, sync, settings, tick=lambda label: None) -> dict:
    """Run every collective at every message size on one group; call on every member rank.

    Returns ``{collective: {"supported": bool, "error": str, "points": [...]}}`` with this rank's times.
    """
    dtype = comm_dtype(device, settings.profile_dtype)
    elem = torch.tensor([], dtype=dtype).element_size()
    results = {}
    for collective in COLLECTIVES:
        entry = {"supported": True, "error": "", "points": []}
        results[collective] = entry
        try:  # a backend that lacks the collective raises at once, on every rank alike
            _make_op(collective, group_size, group_size, group, device, dtype)()
            sync()
        except (RuntimeError, NotImplementedError, ValueError) as err:
            entry["supported"], entry["error"] = False, str(err).splitlines()[0][:200]
            for _ in settings.message_sizes:
                tick(f"{collective} g={group_size} (unsupported)")
            continue
        sizes = []
        for size in settings.message_sizes:
            numel = max(group_size, (size // elem) // group_size * group_size)
            if numel not in [n for n, _ in sizes]:
                sizes.append((numel, _make_op(collective, numel, group_size, group, device, dtype)))
        wanted = []
        for numel, op in sizes:
            tick(f"{collective} g={group_size} {_human_bytes(numel * elem)}")
            for _ in range(max(1, settings.warmup)):
                op()
            sync()
            one = time_samples(op, sync, 0, 1, 1)[0]
            wanted.append(inner_count(one, settings.target_seconds, settings.max_inner))
        # Every member must loop the same number of times: agree on the largest count any rank asked for.
        agreed = torch.tensor(wanted, device=device, dtype=torch.int64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
        inners = [int(v) for v in agreed.tolist()]
        # Round-robin over the sizes, so that a burst of outside load lands on all sizes alike instead of
        # bending the size -> time curve the fit reads.
        samples = [[] for _ in sizes]
        for _ in range(settings.comm_reps):
            for i, (_, op) in enumerate(sizes):
                samples[i] += time_samples(op, sync, 0, 1, inners[i])
        for (numel, _), inner, times in zip(sizes, inners, samples):
            nbytes = numel * elem
            entry["points"].append({
                "bytes": nbytes, "link_bytes": bus_factor(collective, group_size) * nbytes,
                "seconds": median(times), "min_seconds": min(times), "samples": times, "inner": inner})
        del sizes
    return results


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} GiB"


__all__ = ["comm_dtype", "count_collective_items", "sweep_group"]
