"""How many rank processes and threads a calibration may start here, checked before any is started.

``--ranks 1000`` starts a thousand Python processes that each load torch: the kernel kills them for
memory minutes later. ``--threads 100000`` makes every rank's thread pool fail to start. Both are numbers
typed by a person, so both are bounded here with one line that says the largest count this machine takes.
No torch import: this runs before the launch.
"""

from __future__ import annotations

from autosp.errors import UsageError

__all__ = ["RANK_BYTES", "THREADS_PER_CORE", "available_memory", "check_launch", "check_thread_count"]

RANK_BYTES = {True: 0.5 * 2**30, False: 1.0 * 2**30}
"""Host memory one CPU rank needs, quick (True) and full runs: 220 MiB resident with torch loaded at the
start (studies/results/calibrated-cpux*.measurements.json, memory[0].rank_rss_bytes) plus the measuring
buffers (memory copies of 32 MiB / 128 MiB, twice; matmul operands; causal attention's backward at the
longest sequence), rounded up."""
THREADS_PER_CORE = 4
"""Ranks x threads beyond this many per core only measure the operating system's scheduler."""


def available_memory() -> float | None:
    """MemAvailable of this machine in bytes (None where /proc/meminfo is missing)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_launch(device: str, ranks: int, threads: int, cores: int, quick: bool) -> None:
    """Refuse a launch this machine cannot hold: too many CPU ranks for its memory, or too many threads."""
    if device == "cpu":
        available = available_memory()
        need = ranks * RANK_BYTES[quick]
        if available is not None and need > available:
            most = max(1, int(available // RANK_BYTES[quick]))
            raise UsageError(f"--ranks {ranks} would need about {need / 2**30:,.0f} GiB of host memory "
                             f"({RANK_BYTES[quick] / 2**30:g} GiB per rank process) and this machine has "
                             f"{available / 2**30:,.1f} GiB available; use --ranks {most} or fewer")
        if threads * ranks > THREADS_PER_CORE * cores:
            most = max(1, THREADS_PER_CORE * cores // ranks)
            raise UsageError(f"--threads {threads} x {ranks} rank(s) is more than {THREADS_PER_CORE} threads per "
                             f"core on {cores} core(s); use --threads {most} or fewer (default: cores / ranks = "
                             f"{max(1, cores // ranks)})")


def check_thread_count(threads) -> None:
    """Before anything else: a thread count must be a positive number a thread pool can hold."""
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be at least 1, got {threads}")
    if threads is not None and threads > 1024:
        raise UsageError(f"--threads {threads} is more than any CPU rank uses (1,024); give the threads your "
                         "training ranks use")
