"""Hardware catalog: turn ``--hw ARG [--nodes K]`` into a :class:`~autosp.contract.specs.HardwareSpec`.

Grammar of ``ARG`` (case-insensitive; ``autosp-plan --list-hardware`` shows the names)::

    NAME            one device of accelerator NAME (one node of 1)
    NAMExN          N devices in all (``*`` works as well as ``x``):
                      N <= devices_per_node  -> one node of N devices      (h100x8: 1 node x 8)
                      N >  devices_per_node  -> N / devices_per_node full nodes; N must be a multiple
                                                of devices_per_node       (h100x32: 4 nodes x 8)
    PATH.toml       a custom cluster file (schema below)
    PATH.json       a HardwareSpec JSON, as ``autosp-calibrate`` writes it

``nodes=K`` (``--nodes K``) repeats a one-node spec K times: ``h100x8`` with ``nodes=4`` is 32 GPUs in 4
nodes of 8, ``h100x4`` with ``nodes=2`` is 2 nodes of 4. It is an error with a multi-node ``NAMExN``
or a file that already says ``nodes > 1``.

Custom cluster file (``.toml``)::

    name = "my-cluster"            # optional; defaults to the file name
    base = "h100"                  # optional: start from a catalog accelerator and override below
    devices_per_node = 8           # required without base
    nodes = 4                      # optional, default 1
    # accelerator (required without base): peak_flops (dense bf16 FLOP/s), memory_gib or memory_bytes,
    # memory_bandwidth (B/s)
    # links (per GPU, one direction; seconds): intra_node_bandwidth, intra_node_latency,
    #   inter_node_bandwidth, inter_node_latency, host_bandwidth (B/s), host_memory_gib or
    #   host_memory_bytes (per node), host_memory_bandwidth (B/s sustained, per node)
    # efficiency factors: matmul_efficiency, attention_efficiency, comm_efficiency,
    #   usable_memory_fraction
    # free text: description, source

The catalog lives in ``cost_models/catalog/hardware.toml``; every figure there cites its public source.
The efficiency factors are published defaults that calibration replaces with measurements.
Every failure is a one-line :class:`~autosp.errors.UsageError`. Nothing here imports torch.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
from functools import lru_cache
from pathlib import Path

from autosp.cost_models.catalog.aliases import alias_table
from autosp.cost_models.catalog.accelerators import DATA_FILE, accelerator_table, common_sources
from autosp.cost_models.catalog.hardware_checks import check_counts, validate_hardware, with_nodes
from autosp.contract.specs import AcceleratorSpec, HardwareSpec, from_dict, hardware_from_dict
from autosp.errors import UsageError
from autosp.files import read_json, read_text

GIB = 1024 ** 3

_LINK_KEYS = ("intra_node_bandwidth", "intra_node_latency", "inter_node_bandwidth", "inter_node_latency",
              "host_bandwidth", "host_memory_bandwidth", "matmul_efficiency", "attention_efficiency", "comm_efficiency",
              "usable_memory_fraction")
_ACCEL_KEYS = ("peak_flops", "memory_bandwidth")
_KNOWN_FILE_KEYS = frozenset(
    _LINK_KEYS + _ACCEL_KEYS + ("name", "base", "nodes", "devices_per_node", "memory_gib", "memory_bytes",
                                "host_memory_gib", "host_memory_bytes", "description", "source", "sources",
                                "aliases"))


def describe_grammar() -> str:
    """The ``--hw`` grammar in a few lines, for ``--help``."""
    names = ", ".join(catalog_names())
    return ("NAME (1 device) | NAMExN (N devices: one node when N <= devices per node, else N must fill whole "
            "nodes, e.g. h100x32 = 4 nodes x 8) | PATH.toml (custom cluster: base = \"h100\" plus overrides, "
            "devices_per_node, nodes, links) | PATH.json (calibrated HardwareSpec). --nodes K repeats a one-node "
            f"spec K times (h100x8 --nodes 4 = 32 GPUs). Accelerators: {names}.")


def _catalog() -> dict:
    return accelerator_table()


def catalog_names() -> list[str]:
    return list(_catalog())


@lru_cache(maxsize=None)
def _alias_table() -> dict[str, str]:
    return alias_table(_catalog())


def catalog_entry(name: str) -> dict:
    """The raw catalog entry (with its ``sources``) of an accelerator name or alias."""
    return dict(_catalog()[_alias_table()[name.lower()]])


def _build(name: str, entry: dict, devices_per_node: int, nodes: int, where: str) -> HardwareSpec:
    """A HardwareSpec from a flat dict of catalog-style keys (raises UsageError on bad values)."""
    def number(key, default=None, required=False):
        value = entry.get(key, default)
        if value is None:
            if required:
                raise UsageError(f"{where}: missing {key!r} (give it, or set base = \"h100\" to start from a "
                                 "catalog accelerator)")
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise UsageError(f"{where}: {key} must be a non-negative number, got {value!r}")
        return float(value)

    if "memory_bytes" in entry:
        memory = number("memory_bytes", required=True)
    else:
        memory = number("memory_gib", required=True) * GIB
    if "host_memory_bytes" in entry:
        host_memory = number("host_memory_bytes")
    else:
        host_memory = (number("host_memory_gib", 0.0)) * GIB
    for key, value in (("memory", memory), ("host_memory", host_memory)):
        if not math.isfinite(value):  # 1e308 GiB: finite as typed, infinite in bytes
            raise UsageError(f"{where}: {key}_gib / {key}_bytes must be a finite size, got {entry.get(key + '_gib', entry.get(key + '_bytes'))!r}")
    accel_name = str(entry.get("accelerator_name", name))
    sources = entry.get("sources", {})
    try:
        accelerator = AcceleratorSpec(
            name=accel_name, peak_flops=number("peak_flops", required=True), memory_bytes=memory,
            memory_bandwidth=number("memory_bandwidth", required=True),
            source=str(entry.get("source") or sources.get("peak_flops", "")))
        links = {k: number(k) for k in _LINK_KEYS if entry.get(k) is not None}
        for key in ("matmul_efficiency", "attention_efficiency", "comm_efficiency", "usable_memory_fraction"):
            if key in links and not 0 < links[key] <= 1:
                raise UsageError(f"{where}: {key} must be in (0, 1], got {links[key]!r}")
        total = devices_per_node * nodes
        label = f"{name}x{total}" if total > 1 else name
        if nodes > 1 and devices_per_node != entry.get("devices_per_node", devices_per_node):
            label += f"({nodes}x{devices_per_node})"  # not the catalog's full nodes: h100x4 --nodes 2 is no h100x8
        spec = HardwareSpec(
            name=label, accelerator=accelerator,
            devices_per_node=devices_per_node, nodes=nodes, host_memory_bytes=host_memory,
            source=str(entry.get("source") or f"autosp hardware catalog ({DATA_FILE.name}): {entry.get('description', name)}"),
            **links)
    except (ValueError, OverflowError) as err:
        raise UsageError(f"{where}: {err}") from None
    return validate_hardware(spec, where)


def _positive_int(value, what: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{where}: {what} must be a positive integer, got {value!r}")
    return value


def _split_count(arg: str) -> tuple[str, int | None]:
    """'h100x8' -> ('h100', 8); 'mi300xx8' -> ('mi300x', 8); 'h100' -> ('h100', None)."""
    table = _alias_table()
    key = arg.lower()
    if key in table:
        return table[key], None
    # every place where a separator is followed only by digits, longest name first
    for match in sorted(re.finditer(r"[x*×](\d+)$", key), key=lambda m: -m.start()):
        prefix = key[:match.start()]
        if prefix in table:
            return table[prefix], int(match.group(1))
    return "", None


def _unknown(arg: str) -> UsageError:
    table = _alias_table()
    if "," in arg:
        return UsageError(f"--hw {arg!r}: one cluster per plan; autosp-plan sweep --hw {arg} plans each of them")
    stem = re.sub(r"[x*×]\d+$", "", arg.lower())
    close = difflib.get_close_matches(stem, list(table), n=6, cutoff=0.5)
    names = list(dict.fromkeys(table[c] for c in close))[:3]  # several aliases of one entry: it once
    hint = f"did you mean {' or '.join(repr(n) for n in names)}? " if names else ""
    return UsageError(f"unknown hardware {arg!r}; {hint}use NAME, NAMExN (e.g. h100x8) or a cluster .toml/.json "
                      f"file; accelerators: {', '.join(catalog_names())}")


def _say_which(arg: str, name: str) -> None:
    """One note when ``arg`` names a card that comes in several catalog variants (a100: 40 GB and 80 GB), saying
    which one it means; the variant's own name says nothing."""
    typed = re.sub(r"[x*×]\d+$", "", arg.strip().lower())
    family = name.split("-")[0]
    variants = [n for n in catalog_names() if n.split("-")[0] == family]
    if typed != family or typed == name.lower() or len(variants) < 2:
        return
    memory = _catalog()[name].get("memory_gib") or _catalog()[name].get("memory_bytes", 0) / GIB
    others = ", ".join(n for n in variants if n != name)
    print(f"autosp-plan: note: --hw {arg} means {name} ({memory:g} GiB per device); write {others} for the "
          "other variant", file=sys.stderr, flush=True)


def resolve_hardware(arg: str, nodes: int | None = None) -> HardwareSpec:
    """Parse ``--hw`` (see the module docstring for the grammar)."""
    if not isinstance(arg, str) or not arg.strip():
        raise UsageError("no hardware given; pass e.g. --hw h100x8 (one node of 8 H100s)")
    arg = arg.strip()
    if nodes is not None:
        nodes = _positive_int(nodes, "--nodes", "hardware")
    lower = arg.lower()
    if lower.endswith(".toml"):
        return hardware_from_toml(arg, nodes)
    if lower.endswith(".json"):
        return hardware_from_json(arg, nodes)

    name, count = _split_count(arg)
    if not name:
        if os.path.exists(arg):
            raise UsageError(f"hardware file {arg!r} must end in .toml (custom cluster) or .json (calibrated spec)")
        raise _unknown(arg)
    entry = _catalog()[name]
    _say_which(arg, name)
    per_node = int(entry["devices_per_node"])
    count = 1 if count is None else count
    if count < 1:
        raise UsageError(f"hardware {arg!r}: the device count must be at least 1")
    check_counts(min(count, per_node), max(1, count // per_node) * (nodes or 1), f"hardware {arg!r}")
    if count <= per_node:
        dpn, n_nodes = count, 1
    else:
        if count % per_node:
            lo, hi = (count // per_node) * per_node, (count // per_node + 1) * per_node
            raise UsageError(f"hardware {arg!r}: {count} devices do not fill whole {name} nodes of {per_node}; "
                             f"use {name}x{lo} or {name}x{hi}, or {name}x{per_node} --nodes K")
        dpn, n_nodes = per_node, count // per_node
    if nodes is not None:
        if n_nodes > 1:
            raise UsageError(f"hardware {arg!r} already spans {n_nodes} nodes; drop --nodes or write "
                             f"{name}x{dpn} --nodes {nodes}")
        n_nodes = nodes
    from autosp.cost_models.catalog.attention_kernels import with_kernel

    # the catalog's attention figure is FlashAttention-2's; price the kernel the compiler runs there by default
    return with_kernel(_build(name, entry, dpn, n_nodes, f"hardware catalog entry {name!r}"))


def hardware_from_toml(path: str | os.PathLike, nodes: int | None = None) -> HardwareSpec:
    """A custom cluster file (schema in the module docstring)."""
    where = os.fspath(path)
    text = read_text(path, "cluster file ")
    import tomllib  # here, not at the top: the catalogs themselves are read from their JSON memo (parsed.py)

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"cluster file {where} is not valid TOML: {str(err).splitlines()[0]}") from None
    except RecursionError:
        raise UsageError(f"cluster file {where} nests tables too deeply to be a cluster file") from None
    unknown = sorted(set(data) - _KNOWN_FILE_KEYS)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(_KNOWN_FILE_KEYS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(f"cluster file {where}: unknown key {unknown[0]!r}{hint}")
    entry: dict = {}
    accel_name = None
    if "base" in data:
        base = str(data["base"])
        name, count = _split_count(base)
        if not name or count is not None:
            raise UsageError(f"cluster file {where}: base {base!r} is not a catalog accelerator "
                             f"({', '.join(catalog_names())})")
        entry = {k: v for k, v in _catalog()[name].items() if k not in ("aliases",)}
        accel_name = name
        # an explicit memory size in the file replaces the base's, whichever unit either uses
        if "memory_bytes" in data or "memory_gib" in data:
            entry.pop("memory_bytes", None), entry.pop("memory_gib", None)
        if "host_memory_bytes" in data or "host_memory_gib" in data:
            entry.pop("host_memory_bytes", None), entry.pop("host_memory_gib", None)
        entry.pop("sources", None)
    entry.update({k: v for k, v in data.items() if k not in ("base", "nodes", "name")})
    stem = os.path.splitext(os.path.basename(where))[0]
    cluster_name = str(data.get("name", stem))
    entry["accelerator_name"] = accel_name or cluster_name
    entry.setdefault("source", f"cluster file {os.path.abspath(where)}"
                     + (f" (base {accel_name} from the autosp catalog)" if accel_name else ""))
    if "devices_per_node" not in entry:
        raise UsageError(f"cluster file {where}: missing 'devices_per_node' (or set base = \"h100\")")
    dpn = _positive_int(entry["devices_per_node"], "devices_per_node", f"cluster file {where}")
    file_nodes = _positive_int(data.get("nodes", 1), "nodes", f"cluster file {where}")
    check_counts(dpn, max(file_nodes, nodes or 1), f"cluster file {where}")
    if nodes is not None:
        if file_nodes > 1 and nodes != file_nodes:
            raise UsageError(f"cluster file {where} already says nodes = {file_nodes}; drop --nodes or edit the file")
        file_nodes = nodes
    spec = _build(cluster_name, entry, dpn, file_nodes, f"cluster file {where}")
    return spec


def hardware_from_json(path: str | os.PathLike, nodes: int | None = None) -> HardwareSpec:
    """A HardwareSpec JSON (``dataclasses.asdict`` of a HardwareSpec, as autosp-calibrate writes it)."""
    from dataclasses import replace

    where = os.fspath(path)
    data = read_json(path, "hardware file ")
    if isinstance(data, dict) and isinstance(data.get("hardware"), dict) and "accelerator" not in data:
        data = data["hardware"]  # a plan file: reuse its hardware
    if not isinstance(data, dict) or not isinstance(data.get("accelerator"), dict):
        raise UsageError(f"hardware file {where} is not a HardwareSpec JSON (no 'accelerator' object)")
    try:
        spec = hardware_from_dict(data)
    except KeyError as missing:
        raise UsageError(f"hardware file {where} is missing field {missing}") from None
    except (TypeError, ValueError) as err:
        raise UsageError(f"invalid hardware file {where}: {err}") from None
    if nodes is not None and nodes != spec.nodes:
        spec = with_nodes(spec, nodes, f"hardware file {where}")
    return validate_hardware(spec, f"hardware file {where}")


def list_hardware() -> list[HardwareSpec]:
    """One full node of every catalog accelerator (``NAMEx<devices_per_node>``)."""
    return [resolve_hardware(f"{name}x{entry['devices_per_node']}") if entry["devices_per_node"] > 1
            else resolve_hardware(name) for name, entry in _catalog().items()]


__all__ = ["DATA_FILE", "catalog_entry", "catalog_names", "common_sources", "describe_grammar", "hardware_from_dict",
           "hardware_from_json", "hardware_from_toml", "list_hardware", "resolve_hardware"]
