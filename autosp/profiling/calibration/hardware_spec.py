"""From raw measurements to a HardwareSpec, its measurements sidecar, and a readable summary.

No torch here: this runs on the gathered JSON. The rules (docs/calibration.md says the same), chosen so
that the cost model (cost_models/step_time.py, comm.py, memory.py) predicts the measured times for the
measured shapes:

- A synchronous training step runs at the pace of its slowest rank, so every per-rank rate is combined
  across ranks by taking the *slowest* rank (minimum rate, maximum time); the spread is recorded.
- ``peak_flops``: the best matmul rate measured in the profile dtype (plain matmuls and the linear
  forward+backward alike). MFU computed against a calibrated hardware file is relative to this, not to a
  datasheet.
- ``matmul_efficiency``: linear forward+backward rate (6 M K N FLOP) at the training shape / peak.
- ``attention_efficiency``: causal SDPA forward+backward rate at the longest sequence measured, FLOPs
  counted as flash-kernel work (7 B h S^2: forward 2 B h S^2, backward 2.5 x), / ``peak_flops``.
- ``intra_node_bandwidth`` / ``intra_node_latency``: beta / alpha of the all-to-all fit on the largest
  intra-node group; ``comm_efficiency`` = 1.0 because the bandwidths are already achieved rates (the cost
  model multiplies ``intra_node_bandwidth`` and ``host_bandwidth`` by it). Every collective's own fit is
  in the sidecar.
- ``memory_bytes`` x ``usable_memory_fraction``: what a rank may fill besides the runtime reserve
  (CUDA context, NCCL, torch itself) that the cost model budgets separately; see :mod:`.memory`.
"""

from __future__ import annotations

import math
import socket
from dataclasses import asdict
from datetime import datetime, timezone

from autosp.profiling.calibration.fit import COLLECTIVES, bus_factor, fit_alpha_beta
from autosp.contract.specs import AcceleratorSpec, HardwareSpec
from autosp.version import __version__

MEASUREMENTS_SCHEMA = "autosp-calibration-measurements"
MEASUREMENTS_VERSION = 1


def measurements_path_for(out_path: str) -> str:
    """``hw.json`` -> ``hw.measurements.json`` (``hw`` -> ``hw.measurements.json``)."""
    stem = out_path[:-5] if out_path.endswith(".json") else out_path
    return stem + ".measurements.json"


def _slowest(rates):
    rates = [float(r) for r in rates]
    return min(rates), (max(rates) / min(rates) - 1.0 if min(rates) > 0 else math.inf)


def _per_rank(raw, section, match):
    """For each rank, the record of compute ``section`` that ``match`` accepts (None when absent)."""
    out = []
    for rank in raw["ranks"]:
        found = [r for r in rank["compute"][section] if match(r)]
        out.append(found[0] if found else None)
    return out


def summarize_compute(raw) -> dict:
    """Every compute measurement combined across ranks: rate of the slowest rank and the spread."""
    first = raw["ranks"][0]["compute"]
    rows = []
    for section in ("matmul", "linear", "attention"):
        for rec in first[section]:
            key = {k: rec[k] for k in ("kind", "dtype", "shape", "seq_len") if k in rec}
            recs = _per_rank(raw, section, lambda r, key=key: all(r.get(k) == v for k, v in key.items()))
            rate, spread = _slowest(r["flops"] for r in recs)
            row = {**key, "flop": rec["flop"], "flops": rate, "rank_spread": spread,
                   "per_rank_flops": [r["flops"] for r in recs]}
            if "flop_full" in rec:
                row["flops_full_count"] = rate * rec["flop_full"] / rec["flop"]
            rows.append(row)
    copy_bw, copy_spread = _slowest(r["compute"]["copy"]["bandwidth"] for r in raw["ranks"])
    return {"rows": rows, "copy_bandwidth": copy_bw, "copy_rank_spread": copy_spread,
            "copy_bytes": first["copy"]["bytes"]}


def fit_collectives(raw) -> list:
    """One entry per (group, collective): points (slowest rank per size), alpha-beta fit, bandwidths."""
    entries = []
    for group in raw["groups"]:
        g = group["size"]
        members = [r for r in raw["ranks"] if str(g) in r["collectives"]]
        for collective in COLLECTIVES:
            per_rank = [m["collectives"][str(g)][collective] for m in members]
            entry = {"group_size": g, "scope": group["scope"], "collective": collective,
                     "bus_factor": bus_factor(collective, g), "supported": all(p["supported"] for p in per_rank)}
            if not entry["supported"]:
                entry["error"] = next(p["error"] for p in per_rank if not p["supported"])
                entries.append(entry)
                continue
            points = []
            for i, pt in enumerate(per_rank[0]["points"]):
                times = [p["points"][i]["seconds"] for p in per_rank]
                t = max(times)
                fastest = max(p["points"][i].get("min_seconds", p["points"][i]["seconds"]) for p in per_rank)
                points.append({"bytes": pt["bytes"], "link_bytes": pt["link_bytes"], "seconds": t,
                               "min_seconds": fastest, "per_rank_seconds": times,
                               "algbw": pt["bytes"] / t, "busbw": pt["link_bytes"] / t})
            entry["points"] = points
            # "fit" (medians) feeds the profile; "fit_min" (fastest samples) shows the noise floor.
            for key, col in (("fit", "seconds"), ("fit_min", "min_seconds")):
                entry[key] = _fit_points(points, col)
            entries.append(entry)
    return entries


def _fit_points(points, col: str) -> dict | None:
    """The alpha-beta fit of ``points[*][col]``; when the times do not grow with size (noise swamps the
    bandwidth term), fall back to alpha = the smallest message's time, beta = the largest message's bus
    bandwidth (both pessimistic), and say so in ``method``."""
    xs, ts = [p["link_bytes"] for p in points], [p[col] for p in points]
    try:
        fit = fit_alpha_beta(xs, ts)
        return {"alpha": fit.alpha, "beta": fit.beta, "max_rel_error": fit.max_rel_error, "points": fit.points,
                "method": "weighted least squares (relative residuals)"}
    except ValueError as err:
        if not points or xs[-1] <= 0:
            return None
        alpha, beta = ts[0], xs[-1] / ts[-1]
        worst = max(abs(alpha + x / beta - t) / t for x, t in zip(xs, ts))
        return {"alpha": alpha, "beta": beta, "max_rel_error": worst, "points": len(points),
                "method": f"fallback (least squares failed: {err}): alpha = smallest message time, "
                          "beta = largest message bus bandwidth"}


def cpu_memory(host: dict, rank_rss, local_ranks: int) -> dict:
    """Per-rank figures from a node snapshot ``host`` and the ranks' resident sets ``rank_rss``."""
    runtime = float(sum(rank_rss))
    usable = min(host["total_bytes"], host["available_bytes"] + runtime)
    return {**host, "ranks": local_ranks, "rank_rss_bytes": list(rank_rss),
            "per_rank_bytes": host["total_bytes"] / local_ranks,
            "per_rank_usable_bytes": usable / local_ranks,
            "per_rank_runtime_bytes": runtime / max(1, len(rank_rss)),
            "usable_fraction": usable / host["total_bytes"]}


def _link_figures(entries, scope: str):
    """``(bandwidth, latency, group size, collective)`` for the largest group of ``scope``, or None.

    The all-to-all's fit (Ulysses' collective); if it is missing, the slowest other collective's."""
    sizes = [e["group_size"] for e in entries if e["scope"] == scope and e.get("fit")]
    if not sizes:
        return None
    g = max(sizes)
    fits = {e["collective"]: e["fit"] for e in entries if e["scope"] == scope and e["group_size"] == g and e.get("fit")}
    name = "all_to_all" if "all_to_all" in fits else min(fits, key=lambda k: fits[k]["beta"])
    return fits[name]["beta"], fits[name]["alpha"], g, name


def _short_device(name: str, device: str) -> str:
    if device == "cpu":
        return "cpu"
    for token in name.replace("-", " ").split():
        t = token.lower()
        if any(c.isdigit() for c in t) and t[0].isalpha():
            return t
    return "gpu"


def build_hardware_spec(raw, *, name: str | None = None, measurements_file: str = "", command=(), now=None,
                  contention: dict | None = None):
    """``(HardwareSpec, sidecar dict)`` from the raw result of :mod:`.launch`."""
    settings = raw["settings"]
    dtype = settings["profile_dtype"]
    device = raw["device"]
    local_world, world = raw["local_world_size"], raw["world_size"]
    comp = summarize_compute(raw)
    rows = comp["rows"]
    matmul_rows = [r for r in rows if r["kind"] in ("matmul", "linear_fwd_bwd") and r["dtype"] == dtype]
    linear = next(r for r in rows if r["kind"] == "linear_fwd_bwd" and r["dtype"] == dtype)
    attn = max((r for r in rows if r["kind"] == "attention_fwd_bwd" and r["dtype"] == dtype),
               key=lambda r: r["seq_len"])
    peak = max(r["flops"] for r in matmul_rows)

    node = raw["ranks"][0]
    host_memory = node["host_memory"]["total_bytes"]
    mems, memory_bytes, usable_fraction, host_bw, host_note, memory_note = _memory_figures(raw, comp)
    entries = fit_collectives(raw)
    intra = _link_figures(entries, "intra")
    inter = _link_figures(entries, "inter")

    device_name = raw["ranks"][0]["device_name"]
    threads = raw["ranks"][0]["threads"]
    now = now or datetime.now(timezone.utc).isoformat(timespec="seconds")
    kind = _short_device(device_name, device)
    mode = "quick" if settings["quick"] else "full"
    where = (f"autosp-calibrate {__version__} ({mode}) on {socket.gethostname()} at {now}; torch "
             f"{raw['torch_version']}, {raw['backend'] or 'no'} backend, {world} rank(s)")
    if measurements_file:
        where += f"; raw measurements: {measurements_file}"
    acc_name = f"{device_name} ({threads} thread{'s' if threads != 1 else ''}/rank)" if device == "cpu" else device_name
    accelerator = AcceleratorSpec(
        name=f"{acc_name}, measured {dtype}", peak_flops=peak, memory_bytes=memory_bytes,
        memory_bandwidth=comp["copy_bandwidth"], source=where)
    spec = HardwareSpec(
        name=name or f"calibrated-{kind}x{local_world}",
        accelerator=accelerator,
        devices_per_node=local_world,
        nodes=max(1, world // local_world),
        intra_node_bandwidth=intra[0] if intra else 0.0,
        intra_node_latency=intra[1] if intra else 0.0,
        inter_node_bandwidth=inter[0] if inter else 0.0,
        inter_node_latency=inter[1] if inter else 0.0,
        host_bandwidth=host_bw,
        host_memory_bytes=host_memory,
        host_memory_bandwidth=_host_memory_bandwidth(raw),
        matmul_efficiency=linear["flops"] / peak,
        attention_efficiency=attn["flops"] / peak,
        comm_efficiency=1.0,
        usable_memory_fraction=usable_fraction,
        source=where,
        attention_kernel=raw.get("attention_kernel", ""),  # the kernel the attention measurement ran
    )
    derivation = _derivation(raw, dtype, linear, attn, intra, inter, host_note, memory_note)
    sidecar = _sidecar(raw, spec, now=now, command=command, contention=contention, derivation=derivation,
                       comp=comp, mems=mems, entries=entries)
    return spec, sidecar


def _host_memory_bandwidth(raw) -> float:
    """The slowest node's host triad bandwidth (one measuring rank per node), 0 when none measured it (a
    measurements file from before the host triad)."""
    rates = [r["host_stream"]["bandwidth"] for r in raw["ranks"] if r.get("host_stream")]
    return min(rates) if rates else 0.0


def _memory_figures(raw, comp: dict):
    """(memory per rank, device memory, usable fraction, host bandwidth, and how the last two were derived)."""
    device, local_world = raw["device"], raw["local_world_size"]
    node = raw["ranks"][0]
    if device == "cuda":
        mems = [r["gpu_memory"] for r in raw["ranks"]]
        memory_bytes = min(m["total_bytes"] for m in mems)
        usable_fraction = min(m["usable_fraction"] for m in mems)
        host_bw = min(min(r["host_bandwidth"]["h2d"], r["host_bandwidth"]["d2h"]) for r in raw["ranks"])
        host_note = "min over ranks of min(pinned host->device, device->host) copy rate, bytes/s"
        memory_note = ("min over ranks of (allocatable + runtime overhead) / total after the CUDA context and "
                       "NCCL exist; the overhead itself is in memory[*].overhead_bytes")
    else:
        same_node = [r for r in raw["ranks"] if r["host"] == node["host"]]
        mem = cpu_memory(node["host_memory"], [r["rss_at_start"] for r in same_node], local_world)
        mems = [mem]
        memory_bytes = mem["per_rank_bytes"]
        usable_fraction = mem["usable_fraction"]
        host_bw = comp["copy_bandwidth"] / 2
        host_note = "CPU: bytes copied per second by a host memory copy (memory_bandwidth / 2)"
        memory_note = ("(MemAvailable + resident sets of the rank processes at start) / MemTotal; the rank "
                       "processes' own footprint is memory[0].per_rank_runtime_bytes")
    return mems, memory_bytes, usable_fraction, host_bw, host_note, memory_note


def _derivation(raw, dtype: str, linear: dict, attn: dict, intra, inter, host_note: str, memory_note: str) -> dict:
    """How each field of the HardwareSpec was derived from the measurements (the sidecar's ``derivation``)."""
    device, local_world = raw["device"], raw["local_world_size"]
    lin_shape = "x".join(map(str, linear["shape"]))

    def link(what, fig, scope):
        if not fig:
            return "0: not measured (" + ("one rank)" if scope == "intra" else "one node)")
        return f"{what} of the {fig[3]} fit on {fig[2]} ranks ({scope}-node)"

    return {
        "peak_flops": f"best {dtype} matmul rate measured (slowest rank per shape), FLOP/s",
        "matmul_efficiency": f"linear fwd+bwd {dtype} {lin_shape} rate {linear['flops']:.4g} (6MKN) / peak_flops",
        "attention_efficiency": (f"causal SDPA fwd+bwd {dtype} S={attn['seq_len']} rate {attn['flops']:.4g} "
                                 "(7*B*h*S^2: forward 2BhS^2, backward 2.5x) / peak_flops"),
        "memory_bandwidth": "device memory copy, (read + write) bytes / s, slowest rank",
        "memory_bytes": ("GPU total memory (torch total_memory)" if device == "cuda"
                         else f"node MemTotal / {local_world} ranks"),
        "usable_memory_fraction": memory_note,
        "host_bandwidth": host_note,
        "host_memory_bytes": "node MemTotal (whole node, not per rank)",
        "host_memory_bandwidth": ("host triad a = b + 0.5 c over three fp32 arrays, 3 x bytes / s, on every CPU of "
                                  "one rank per node while the others wait; slowest node"),
        "intra_node_bandwidth": link("beta (bus bandwidth, bytes/s)", intra, "intra"),
        "intra_node_latency": link("alpha (seconds per call)", intra, "intra"),
        "inter_node_bandwidth": link("beta (bus bandwidth, bytes/s)", inter, "inter"),
        "inter_node_latency": link("alpha (seconds per call)", inter, "inter"),
        "comm_efficiency": "1.0: the bandwidths above are measured, achieved rates",
    }


def _sidecar(raw, spec: HardwareSpec, *, now: str, command, contention, derivation: dict, comp: dict, mems: list,
             entries) -> dict:
    """The measurements sidecar: every raw figure behind the spec, and where it was measured."""
    settings, device = raw["settings"], raw["device"]
    local_world, world = raw["local_world_size"], raw["world_size"]
    device_name, threads = raw["ranks"][0]["device_name"], raw["ranks"][0]["threads"]
    dtype = settings["profile_dtype"]
    return {
        "schema": MEASUREMENTS_SCHEMA,
        "schema_version": MEASUREMENTS_VERSION,
        "autosp_version": __version__,
        "created_at": now,
        "hardware_name": spec.name,
        "hardware_fingerprint": spec.fingerprint(),
        "command": list(command),
        "environment": {"host": socket.gethostname(), "device": device, "device_name": device_name,
                        "threads_per_rank": threads, "ranks": world, "ranks_per_node": local_world,
                        "backend": raw["backend"], "torch_version": raw["torch_version"],
                        "cuda_version": raw["cuda_version"], "profile_dtype": dtype,
                        "contention": contention},
        "settings": settings,
        "derivation": derivation,
        "compute": comp,
        "memory": mems,
        "host_bandwidth": [r["host_bandwidth"] for r in raw["ranks"]],
        "host_stream": [r.get("host_stream") for r in raw["ranks"]],
        "collectives": entries,
        "raw_per_rank": [{"rank": r["rank"], "host": r["host"], "compute": r["compute"]} for r in raw["ranks"]],
    }


def non_finite_fields(spec: HardwareSpec) -> list:
    """Names of numeric fields that are negative, NaN or infinite (should be none)."""
    bad = []
    for key, value in list(asdict(spec).items()) + [(f"accelerator.{k}", v)
                                                    for k, v in asdict(spec.accelerator).items()]:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value) or value < 0:
                bad.append(key)
    return bad


# ----------------------------------------------------------------------------------------------- summary

def _si(value: float, unit: str) -> str:
    if value == 0:
        return f"0 {unit}"
    value = float(f"{value:.3g}")  # round first, so 999.99e6 prints as 1 G, not 1e+03 M
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _gib(value: float) -> str:
    return f"{value / 2**30:.1f} GiB"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


def format_summary(spec: HardwareSpec, sidecar: dict, compare: HardwareSpec | None = None,
                   elapsed: float | None = None) -> str:
    env = sidecar["environment"]
    lines = []
    head = f"{spec.name}: {env['ranks']} rank(s) of {env['device_name']}"
    if env["device"] == "cpu":
        head += f", {env['threads_per_rank']} thread(s)/rank"
    head += f", backend {env['backend'] or 'none'}, profile dtype {env['profile_dtype']}"
    if elapsed is not None:
        head += f", {elapsed:.1f} s"
    lines.append(head)
    busy = env.get("contention") or {}
    if (busy.get("other_cpu_share") or 0) > 0.10 or (busy.get("steal_share") or 0) > 0.10:
        lines.append(f"warning: other processes used {busy.get('other_cpu_share') or 0:.0%} and the hypervisor "
                     f"stole {busy.get('steal_share') or 0:.0%} of the CPU time while measuring; the figures are "
                     "what was left over (rerun on a quiet machine for steadier ones)")
    elif busy.get("other_cpu_share") is None and busy.get("load1_after", 0) > busy.get("cores", 1):
        lines.append(f"warning: load average {busy['load1_after']:.1f} on {busy['cores']} cores while measuring")
    lines.append("")
    lines.append("measured (slowest rank)")
    for row in sidecar["compute"]["rows"]:
        what = {"matmul": "matmul", "linear_fwd_bwd": "linear fwd+bwd",
                "attention_fwd_bwd": "causal attention fwd+bwd"}[row["kind"]]
        shape = "x".join(map(str, row["shape"])) if "shape" in row else f"S={row['seq_len']}"
        spread = f"  (ranks differ by {row['rank_spread']:.0%})" if row["rank_spread"] > 0.15 else ""
        lines.append(f"  {what:<25} {row['dtype']:<5} {shape:<18} {_si(row['flops'], 'FLOP/s'):>14}{spread}")
    lines.append(f"  {'memory copy':<25} {'':<5} {_bytes(sidecar['compute']['copy_bytes']):<18} "
                 f"{_si(sidecar['compute']['copy_bandwidth'], 'B/s'):>14}")
    for stream in (s for s in sidecar.get("host_stream") or () if s):
        lines.append(f"  {'host triad (' + str(stream['threads']) + ' threads)':<25} {'':<5} "
                     f"{_bytes(stream['bytes']) + ' x 3':<18} {_si(stream['bandwidth'], 'B/s'):>14}")
    entries = sidecar["collectives"]
    if entries:
        lines.append("")
        lines.append("collectives: t = alpha + f(P) * bytes / beta  (beta: bus bandwidth per rank; fit on medians,")
        lines.append("             'fastest' on each size's fastest sample; * = fallback, least squares failed)")
        lines.append(f"  {'group':>5}  {'collective':<15} {'alpha':>10} {'beta':>12} {'worst err':>10} "
                     f"{'fastest beta':>13}")
        for e in entries:
            if not e["supported"]:
                lines.append(f"  {e['group_size']:>5}  {e['collective']:<15} unsupported: {e['error']}")
            elif not e.get("fit"):
                lines.append(f"  {e['group_size']:>5}  {e['collective']:<15} no fit")
            else:
                f, fm = e["fit"], e.get("fit_min")
                star = "*" if f["method"].startswith("fallback") else " "
                lines.append(f"  {e['group_size']:>5}  {e['collective']:<15} {_us(f['alpha']):>10} "
                             f"{_si(f['beta'], 'B/s'):>12}{star}{f['max_rel_error']:>9.0%} "
                             f"{_si(fm['beta'], 'B/s') if fm else '-':>13}")
    lines.append("")
    rows = _profile_rows(spec)
    other = dict(_profile_rows(compare)) if compare else {}
    title = f"  {'profile field':<28} {'measured':>16}"
    if compare:
        title += f" {compare.name:>16}"
    lines.append("hardware file" + (f" (vs catalog {compare.name})" if compare else ""))
    lines.append(title)
    for key, text in rows:
        line = f"  {key:<28} {text:>16}"
        if compare:
            line += f" {other.get(key, ''):>16}"
        lines.append(line)
    lines.append(f"  {'fingerprint':<28} {spec.fingerprint():>16}")
    return "\n".join(lines)


def _profile_rows(spec: HardwareSpec):
    a = spec.accelerator
    return [
        ("peak_flops", _si(a.peak_flops, "FLOP/s")),
        ("matmul_efficiency", f"{spec.matmul_efficiency:.3f}"),
        ("  achieved matmul", _si(a.peak_flops * spec.matmul_efficiency, "FLOP/s")),
        ("attention_efficiency", f"{spec.attention_efficiency:.3f}"),
        ("  achieved attention", _si(a.peak_flops * spec.attention_efficiency, "FLOP/s")),
        ("memory_bytes", _gib(a.memory_bytes)),
        ("usable_memory_fraction", f"{spec.usable_memory_fraction:.3f}"),
        ("memory_bandwidth", _si(a.memory_bandwidth, "B/s")),
        ("devices_per_node x nodes", f"{spec.devices_per_node} x {spec.nodes}"),
        ("intra_node_bandwidth", _si(spec.intra_node_bandwidth, "B/s")),
        ("comm_efficiency", f"{spec.comm_efficiency:.3f}"),
        ("intra_node_latency", _us(spec.intra_node_latency)),
        ("inter_node_bandwidth", _si(spec.inter_node_bandwidth, "B/s")),
        ("inter_node_latency", _us(spec.inter_node_latency)),
        ("host_bandwidth", _si(spec.host_bandwidth, "B/s")),
        ("host_memory_bytes", _gib(spec.host_memory_bytes)),
        ("host_memory_bandwidth", _si(spec.host_memory_bandwidth, "B/s")),
    ]


__all__ = ["MEASUREMENTS_SCHEMA", "MEASUREMENTS_VERSION", "build_hardware_spec", "non_finite_fields", "cpu_memory",
           "fit_collectives", "format_summary", "measurements_path_for", "summarize_compute"]
