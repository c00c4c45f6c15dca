"""One phrase for why a candidate does not fit: device memory, or the host memory its offloads need.

When offloaded activations or optimizer states exceed the node's host memory, the cost model marks the
activations infinite and says so in a note; "needs inf GiB per GPU" would hide that note, so the phrase
is the note instead.
"""

from __future__ import annotations

import math

from autosp.units import format_gib

__all__ = ["memory_shortfall"]


def memory_shortfall(est) -> str:
    """'needs 90.1 GiB per GPU, 79.2 GiB usable' or 'runs out of host memory: offload needs ...'."""
    if math.isfinite(est.memory.total):
        return f"needs {format_gib(est.memory.total)} per GPU, {format_gib(est.capacity_bytes)} usable"
    why = next((n for n in est.notes if "host memory" in n), "its offloads exceed the node's host memory")
    return f"runs out of host memory: {why}"
