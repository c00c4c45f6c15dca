"""``python -m studies.gpu_check --reprice FILE``: a GPU check's measured rows priced again by today's cost model.

A GPU is lent rarely; the cost model changes often. This reads a committed ``gpu_check.json`` (every row's full
configuration and measurements are in it), prices each measured row again (``--hw``, default the file's hardware)
and prints the allocated peak and the step time, measured, as predicted when the check ran, and as predicted now.
The allocated peak is compared with the prediction without its reserve, as the check itself does (report.py).
Nothing runs on a device.
"""

from __future__ import annotations

import dataclasses
import json

GIB = 1024 ** 3


def _config(row: dict):
    from autosp.contract.specs import ModelSpec
    from studies.measure import RunConfig

    cfg = dict(row["config"])
    model = dict(cfg.pop("model"))
    for name in ("sliding_layers", "dense_layers"):
        model[name] = tuple(model.get(name, ()))
    cfg["doc_lens"] = tuple(cfg.get("doc_lens", ()))
    names = {f.name for f in dataclasses.fields(RunConfig)}
    return RunConfig(model=ModelSpec(**model), **{k: v for k, v in cfg.items() if k in names})


def reprice_rows(path: str, hw_name: str | None = None) -> tuple[dict, object, list[dict]]:
    """(the check's summary, the hardware priced with, one dict per measured row: label, measured allocated peak and
    step time, and predicted / measured then and now for both)."""
    from autosp.cost_models import estimate
    from autosp.cost_models.catalog.hardware import resolve_hardware

    with open(path) as f:
        summary = json.load(f)
    hw = resolve_hardware(hw_name or summary["hardware"])
    rows = []
    for row in summary["harness_rows"]:
        if row.get("status") != "ok":
            continue
        cfg = _config(row)
        est = estimate(cfg.model, hw, cfg.workload(), cfg.candidate())
        alloc, step = row["memory"]["allocated_peak"], row["time"]["step_median"]
        rows.append({"label": row["label"], "allocated": alloc, "step": step,
                     "alloc_then": (row["prediction"]["memory"]["total"] - row["prediction"]["memory"]["reserve"])
                     / alloc,
                     "alloc_now": (est.memory.total - est.memory.reserve) / alloc,
                     "step_then": row["prediction"]["time"]["step"] / step, "step_now": est.time.step / step})
    return summary, hw, rows


def reprice_lines(path: str, hw_name: str | None = None) -> list[str]:
    summary, hw, rows = reprice_rows(path, hw_name)
    lines = [f"{path}: {summary.get('device', '?')}, priced again with {hw.name} (then: {summary['hardware']})",
             f"{'row':<18} {'alloc GiB':>9} {'then':>6} {'now':>6}   {'step s':>7} {'then':>6} {'now':>6}",
             "-" * 66]
    for r in rows:
        lines.append(f"{r['label']:<18} {r['allocated'] / GIB:>9.2f} {r['alloc_then']:>6.2f} {r['alloc_now']:>6.2f}   "
                     f"{r['step']:>7.3f} {r['step_then']:>6.2f} {r['step_now']:>6.2f}")
    lines.append("then/now: predicted / measured, by the cost model when the check ran and today's")
    return lines


__all__ = ["reprice_lines", "reprice_rows"]
