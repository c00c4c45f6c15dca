"""Is a HardwareSpec something the cost model can price? Checked wherever one enters the planner.

A cluster file, a calibrated hardware file, a plan's ``hardware`` section or a HardwareSpec passed to
``autosp.plan`` may carry figures that make the cost model divide by zero or overflow (``peak_flops =
0``, ``memory_gib = 1e308``, no inter-node bandwidth on a multi-node cluster), or counts that make the
search run for hours (``h100x8000000000``). :func:`validate_hardware` turns each into one line that
names the field and the file.

A profile from ``autosp-calibrate`` on one node has no inter-node figures (nothing was measured across
nodes). Planning it for several nodes is the usual path, so :func:`with_nodes` takes them from the
catalog entry of the same accelerator when the profile's device name matches one, records that in the
spec's ``source`` (so the plan carries it) and says it on stderr; for any other device it asks for them.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import replace

from autosp.contract.specs import HardwareSpec
from autosp.errors import UsageError

__all__ = ["MAX_DEVICES", "MAX_DEVICES_PER_NODE", "LIMITS", "catalog_twin", "check_counts", "validate_hardware",
           "with_nodes"]

MAX_DEVICES = 2**17
"""131,072 accelerators: more than the largest training clusters built so far (about 100k GPUs). The
search and its what-would-fit hints grow with the cluster; a count far beyond this is a typo that would
keep the planner busy for hours."""
MAX_DEVICES_PER_NODE = 1024
"""One node (one scale-up domain: NVLink, Infinity Fabric) of up to 1,024 devices; NVL72 racks have 72."""

GB, GIB, TIB = 1e9, 2**30, 2**40
LIMITS = {  # field: (least, most, unit, what a unit mistake looks like) -- outside these a figure is a unit mistake
    "accelerator.peak_flops": (1e8, 1e17, "FLOP/s", "FLOP/s, not TFLOP/s"),
    "accelerator.memory_bytes": (GIB / 4, 4 * TIB, "bytes", "memory_gib is GiB, not MiB or bytes"),
    "accelerator.memory_bandwidth": (1e9, 1e14, "bytes/s", "bytes/s, not GB/s"),
    "intra_node_bandwidth": (1e7, 1e13, "bytes/s", "bytes/s per device, not GB/s or bits/s"),
    "inter_node_bandwidth": (1e6, 1e13, "bytes/s", "bytes/s per device, not GB/s or Gbit/s"),
    "host_bandwidth": (1e7, 1e13, "bytes/s", "bytes/s, not GB/s"),
    "intra_node_latency": (1e-8, 1e-2, "s", "seconds, not microseconds"),
    "inter_node_latency": (1e-8, 1e-2, "s", "seconds, not microseconds"),
    "host_memory_bytes": (GIB / 4, 256 * TIB, "bytes", "host_memory_gib is GiB per node, not MiB or bytes"),
    "host_memory_bandwidth": (1e8, 1e13, "bytes/s", "bytes/s per node, not GB/s"),
}
"""Plausible ranges, wide enough for a laptop CPU profile and the largest accelerators and nodes announced
(a 288 GB HBM device, 8 TB/s HBM, 1.8 TB/s NVLink, 2.5 PFLOP/s dense bf16; the catalog's sources), yet narrow
enough that a figure in the wrong unit falls out: an 80 GB memory typed in MiB (81920 -> 80 TiB), a bandwidth in
GB/s (450 -> 450 B/s), a latency in microseconds (5 -> 5 s), peak TFLOP/s (989). A link or host figure may be
0 (none: one device per node, one node, no host offload); the rules below say when it is needed."""
_OPTIONAL = ("intra_node_bandwidth", "inter_node_bandwidth", "host_bandwidth", "intra_node_latency",
             "inter_node_latency", "host_memory_bytes", "host_memory_bandwidth")


def _shown(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value:.4g} bytes ({value / GIB:,.6g} GiB)"
    if unit == "bytes/s":
        return f"{value:.4g} bytes/s ({value / GB:,.6g} GB/s)"
    return f"{value:.4g} {unit}"
_FRACTIONS = ("matmul_efficiency", "attention_efficiency", "comm_efficiency", "usable_memory_fraction")


def _say(message: str) -> None:
    print(f"autosp-plan: note: {message}", file=sys.stderr, flush=True)


def check_counts(devices_per_node, nodes, where: str) -> None:
    """Refuse device counts beyond :data:`MAX_DEVICES` (and nodes beyond :data:`MAX_DEVICES_PER_NODE`)."""
    if devices_per_node > MAX_DEVICES_PER_NODE:
        raise UsageError(f"{where}: {devices_per_node:,} devices per node is more than autosp plans for "
                         f"({MAX_DEVICES_PER_NODE:,}); is the count right?")
    if devices_per_node * nodes > MAX_DEVICES:
        raise UsageError(f"{where}: {nodes:,} node(s) x {devices_per_node:,} = {devices_per_node * nodes:,} devices is "
                         f"more than autosp plans for ({MAX_DEVICES:,}); is the count right?")


def _number(value, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{where}: {name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise UsageError(f"{where}: {name} must be a finite number, got {value!r}")
    return float(value)


def validate_hardware(spec: HardwareSpec, where: str) -> HardwareSpec:
    """``spec`` itself when the cost model can price it; otherwise one UsageError naming the field."""
    if not isinstance(spec, HardwareSpec):
        raise UsageError(f"{where}: not a HardwareSpec")
    for name in ("devices_per_node", "nodes"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{where}: {name} must be a positive integer, got {value!r}")
    check_counts(spec.devices_per_node, spec.nodes, where)
    for name, (least, most, unit, hint) in LIMITS.items():
        owner = spec.accelerator if name.startswith("accelerator.") else spec
        field = name.split(".")[-1]
        value = _number(getattr(owner, field), name, where)
        if value < 0:
            raise UsageError(f"{where}: {field} must be non-negative, got {value!r}")
        if value == 0 and field in _OPTIONAL:
            continue
        if value == 0:
            raise UsageError(f"{where}: {field} is 0 or missing; give it ({unit})")
        if value < least or value > most:
            raise UsageError(f"{where}: {field} = {_shown(value, unit)} is outside the plausible range "
                             f"{_shown(least, unit)} to {_shown(most, unit)}; is the unit right? ({hint})")
    for name in _FRACTIONS:
        value = _number(getattr(spec, name), name, where)
        if not 0 < value <= 1:
            raise UsageError(f"{where}: {name} must be in (0, 1], got {value!r}")
    if spec.devices_per_node > 1 and spec.intra_node_bandwidth <= 0:
        raise UsageError(f"{where}: {spec.devices_per_node} devices per node need intra_node_bandwidth (bytes/s per "
                         "device, one direction) > 0")
    if spec.nodes > 1 and spec.inter_node_bandwidth <= 0:
        raise UsageError(f"{where}: {spec.nodes} nodes need inter_node_bandwidth (bytes/s per device, one "
                         "direction) > 0 and inter_node_latency (s)")
    return spec


def catalog_twin(device_name: str, memory_bytes: float) -> str | None:
    """The catalog accelerator a measured device is (its model number appears in the device name, e.g.
    'NVIDIA H100 80GB HBM3' -> 'h100'); the closest in memory when several share it; None if none."""
    from autosp.cost_models.catalog.accelerators import accelerator_table as _catalog

    words = set(re.split(r"[^a-z0-9]+", device_name.lower()))
    found = []
    for name, entry in _catalog().items():
        model = name.split("-")[0]
        if model in words:
            memory = entry.get("memory_bytes") or entry.get("memory_gib", 0) * 2**30
            found.append((abs(memory - memory_bytes), name))
    return min(found)[1] if found else None


def with_nodes(spec: HardwareSpec, nodes: int, where: str) -> HardwareSpec:
    """``spec`` on ``nodes`` nodes; a one-node profile gets its inter-node figures from the catalog twin of
    its accelerator (said on stderr and recorded in ``source``), or a UsageError asking for them."""
    if nodes == spec.nodes:
        return spec
    if spec.nodes > 1:
        raise UsageError(f"{where} already describes {spec.nodes} nodes; drop --nodes")
    check_counts(spec.devices_per_node, nodes, where)
    spec = replace(spec, nodes=nodes)
    if nodes > 1 and spec.inter_node_bandwidth <= 0:
        spec = _borrow_inter_node(spec, where)
    return spec


def _borrow_inter_node(spec: HardwareSpec, where: str) -> HardwareSpec:
    from autosp.cost_models.catalog.accelerators import accelerator_table as _catalog, common_sources

    twin = catalog_twin(spec.accelerator.name, spec.accelerator.memory_bytes)
    if twin is None:
        raise UsageError(
            f"{where} was measured on one node and has no inter-node figures, which --nodes {spec.nodes} needs: "
            "calibrate across nodes (torchrun --nnodes N ... -m autosp.profiling.calibrate --out FILE) or "
            "add inter_node_bandwidth (bytes/s per device, one direction) and inter_node_latency (s) to it")
    entry = _catalog()[twin]
    sources = entry.get("sources", {})
    note = (f"inter-node figures ({entry['inter_node_bandwidth'] / 1e9:g} GB/s per device, "
            f"{entry['inter_node_latency'] * 1e6:g} us) taken from the catalog entry {twin}, as {where} measured "
            "one node only")
    _say(note)
    source = (f"{spec.source}; {note} (sources: {sources.get('inter_node_bandwidth', '')}; "
              f"{sources.get('inter_node_latency') or common_sources().get('inter_node_latency', '')})")
    return replace(spec, inter_node_bandwidth=float(entry["inter_node_bandwidth"]),
                   inter_node_latency=float(entry["inter_node_latency"]), source=source)

