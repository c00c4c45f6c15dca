"""The check's table: measured next to predicted, one line per row, and the files it is written to.

Memory. ``alloc`` is the measured allocated peak of one training step: on a GPU
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` (minus what was allocated before the
row began, normally nothing); on the CPU dry run the harness's static census plus the step's profiled
peak. It is compared with the cost model's total *without* its reserve (the reserve is CUDA context,
NCCL and allocator fragmentation, none of which is allocated memory). ``device`` (GPU only) is the
allocator's reserved peak plus the device memory outside the allocator (context, NCCL, library
handles): the figure the cost model's full total, reserve included, predicts and checks against capacity.

Time. ``step`` is the median of the timed steps (CUDA-synchronised), against the predicted step time.
Ratios are predicted / measured.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["entry", "format_line", "format_table", "header", "write_outputs"]

GIB = 1024 ** 3


def _ratio(pred, meas):
    return pred / meas if pred is not None and meas else None


def entry(row_spec, harness_row: dict) -> dict:
    """One table line (plain numbers; bytes and seconds) from a harness row."""
    pred = harness_row.get("prediction") or {}
    out = {"name": row_spec.name, "seq_len": harness_row["config"]["seq_len"], "knobs": row_spec.knob_dict(),
           "status": harness_row["status"], "error": harness_row.get("error")}
    predicted = {}
    if "memory" in pred:
        predicted = {"alloc": pred["memory"]["total"] - pred["memory"]["reserve"], "device": pred["memory"]["total"],
                     "step": pred["time"]["step"], "fits": pred["fits"]}
    out["predicted"] = predicted
    if harness_row["status"] != "ok":
        out["measured"], out["ratio"] = {}, {}
        return out
    mem, t = harness_row["memory"], harness_row["time"]
    cuda = mem.get("cuda")
    measured = {"alloc": mem["allocated_peak"], "step": t["step_median"], "step_spread": t["spread"],
                "first_step": t["first_step"], "setup": t["setup_seconds"],
                "saved_activations": mem["saved"]["activations"], "saved_on_host": mem["saved"].get("host", 0)}
    if cuda:
        measured["device"] = cuda["max_reserved"] + cuda["outside_allocator"]
        measured["leftover_before_row"] = cuda["leftover_before_row"]
    out["measured"] = measured
    out["ratio"] = {k: _ratio(predicted.get(k), measured.get(k)) for k in ("alloc", "device", "step")}
    if "kernels" in harness_row:
        out["kernels"] = harness_row["kernels"]
    return out


def kernel_line(k: dict) -> str:
    """One profiled step's device time by kind (studies/measure/kernels.py), as a line under its row."""
    if "error" in k:
        return f"{'':<18}   kernel breakdown failed: {k['error']}"
    kinds = ", ".join(f"{kind} {seconds:.3f}" for kind, seconds in k["seconds"].items())
    return (f"{'':<18}   one profiled step: {k['wall']:.3f} s wall, device busy {k['busy']:.3f} s ({kinds}), "
            f"idle {k['idle']:.3f} s")


def _knobs_text(knobs: dict) -> str:
    short = {"zero_stage": "z", "checkpointing": "ckpt:", "mlp_chunks": "mlp/", "loss_chunks": "loss/",
             "micro_batch": "mb", "grad_accum": "ga", "sequence_chunks": "seq/"}
    parts = []
    if "zero_stage" not in knobs:
        parts.append("z0")
    for k, v in sorted(knobs.items(), key=lambda kv: kv[0] != "zero_stage"):
        if isinstance(v, bool):
            parts.append(k.replace("_", "-"))
        else:
            parts.append(f"{short.get(k, k + '=')}{v}")
    return " ".join(parts)


def _num(value, fmt: str, scale: float = 1.0) -> str:
    if value is None:
        return format("-", ">" + fmt.split(".")[0]) if fmt[0].isdigit() else "-"
    return format(value / scale, fmt)


UNITS = {"GiB": 1024 ** 3, "MiB": 1024 ** 2}


def header(unit: str = "GiB") -> str:
    return (f"{'row':<18} {'S':>6}  {'knobs':<38} {'alloc ' + unit:>9} {'pred':>6} {'p/m':>5}  "
            f"{'device ' + unit:>10} {'pred':>6} {'p/m':>5}  {'step s':>7} {'pred':>7} {'p/m':>5}  {'1st s':>6}")


def format_line(e: dict, unit: str = "GiB") -> str:
    m, p, r = e["measured"], e["predicted"], e["ratio"]
    scale = UNITS[unit]
    head = f"{e['name']:<18} {e['seq_len']:>6}  {_knobs_text(e['knobs']):<38}"
    if e["status"] != "ok":
        pred = (f"predicted {_num(p.get('alloc'), '.1f', scale)} {unit}, {_num(p.get('step'), '.3f')} s"
                if p else "no prediction")
        return f"{head} {e['status'].upper()}: {e['error']} ({pred})"
    return (f"{head} {_num(m['alloc'], '9.2f', scale)} {_num(p.get('alloc'), '6.1f', scale)} "
            f"{_num(r['alloc'], '5.2f')}  {_num(m.get('device'), '10.2f', scale)} "
            f"{_num(p.get('device') if m.get('device') is not None else None, '6.1f', scale)} "
            f"{_num(r['device'], '5.2f')}  {_num(m['step'], '7.3f')} {_num(p.get('step'), '7.3f')} "
            f"{_num(r['step'], '5.2f')}  {_num(m['first_step'], '6.1f')}")


def format_table(entries: list[dict], title: str, unit: str = "GiB") -> str:
    top = header(unit)
    lines = [title, top, "-" * len(top)]
    for e in entries:
        lines.append(format_line(e, unit))
        if e.get("kernels"):
            lines.append(kernel_line(e["kernels"]))
    return "\n".join(lines)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_outputs(out_dir: Path, summary: dict, text: str) -> None:
    """``gpu_check.json`` (every figure, the harness rows included) and ``gpu_check.txt`` (the table)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_atomically(out_dir / "gpu_check.json", json.dumps(summary, indent=1, default=str))
    _write_atomically(out_dir / "gpu_check.txt", text + "\n")
