"""Timing an operation on CPU or GPU: warm-up, an inner loop long enough to time, the median of repeats."""

from __future__ import annotations

import math
import time

import torch

from autosp.profiling.calibration.fit import median

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def synchronizer(device: torch.device):
    """A function that waits until the device has finished its queued work."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def inner_count(one_call_seconds: float, target_seconds: float, max_inner: int) -> int:
    """How many calls make one timed sample last about ``target_seconds``."""
    if one_call_seconds <= 0:
        return max_inner
    return max(1, min(max_inner, math.ceil(target_seconds / one_call_seconds)))


def time_samples(fn, sync, warmup: int, reps: int, inner: int) -> list:
    """``reps`` samples of the mean time of one call (each sample loops ``fn`` ``inner`` times)."""
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / inner)
    return samples


def measure(fn, sync, settings) -> dict:
    """Time ``fn`` locally (no collective agreement needed): ``{"seconds", "samples", "inner"}``.

    The first call (after the warm-up) sizes the inner loop; the result is the median sample.
    """
    for _ in range(max(1, settings.warmup)):
        fn()
    sync()
    start = time.perf_counter()
    fn()
    sync()
    inner = inner_count(time.perf_counter() - start, settings.target_seconds, settings.max_inner)
    samples = time_samples(fn, sync, 0, settings.reps, inner)
    return {"seconds": median(samples), "samples": samples, "inner": inner}


__all__ = ["TORCH_DTYPES", "inner_count", "measure", "synchronizer", "time_samples"]
