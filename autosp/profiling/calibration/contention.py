"""How much of the machine other work took while calibrating (Linux ``/proc/stat`` and rusage).

A calibration on a shared machine measures what was left over. Snapshot before and after measuring; the
CPU time the whole machine spent busy minus the CPU time of this process and its (reaped) children is
other processes' share. Under torchrun the other ranks are separate processes this one cannot account
for, so there only the load average is reported.
"""

from __future__ import annotations

import os
import resource


def _proc_stat():
    try:
        with open("/proc/stat", encoding="ascii") as f:
            parts = f.readline().split()
    except OSError:
        return None
    if not parts or parts[0] != "cpu":
        return None
    values = [int(v) for v in parts[1:9]] + [0] * max(0, 8 - len(parts[1:9]))
    user, nice, system, idle, iowait, irq, softirq, steal = values[:8]
    return {"busy": user + nice + system + irq + softirq + steal, "idle": idle + iowait, "steal": steal}


def _own_cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def snapshot() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {"stat": _proc_stat(), "own_cpu": _own_cpu_seconds(), "load1": load[0]}


def report(before: dict, after: dict, cores: int, own_children_counted: bool = True) -> dict:
    """``{"load1_before", "load1_after", "other_cpu_share", "steal_share"}`` (shares of all cores' time)."""
    out = {"cores": cores, "load1_before": before["load1"], "load1_after": after["load1"],
           "other_cpu_share": None, "steal_share": None}
    if before["stat"] and after["stat"]:
        tick = os.sysconf("SC_CLK_TCK")
        busy = after["stat"]["busy"] - before["stat"]["busy"]
        total = busy + after["stat"]["idle"] - before["stat"]["idle"]
        if total > 0:
            out["steal_share"] = (after["stat"]["steal"] - before["stat"]["steal"]) / total
            if own_children_counted:
                ours = (after["own_cpu"] - before["own_cpu"]) * tick
                out["other_cpu_share"] = max(0.0, (busy - ours) / total)
    return out


__all__ = ["report", "snapshot"]
