"""Predicted next to measured: the columns the cost-model studies print.

The cost model predicts a GPU's peak as parameters + gradients + optimizer states + activations +
logits/loss + comm buffers + *reserve* (CUDA context, NCCL buffers, fragmentation). A CPU run has no
CUDA context and c10's CPU allocator does not cache, so the comparable measured figure is the
*allocated* peak (static census + the step's dynamic peak, :mod:`studies.measure.memory`) against the
prediction **without** the reserve. The saved-for-backward bytes (what the compiled graph keeps,
measured with saved-tensor hooks) are compared with the cost model's ``kept`` activations: the part of
the prediction that checkpointing, offload and tiling move.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from autosp.contract.specs import HardwareSpec

MIB = 2 ** 20
RESULTS = Path(__file__).resolve().parents[1] / "results"


def calibrated_cpu(ranks: int, recalibrate: bool = False) -> HardwareSpec:
    """The calibrated hardware file of this machine with ``ranks`` gloo ranks (cached in studies/results/).

    Runs ``autosp-calibrate --quick --ranks N`` when the file is missing (20-60 s on 2 cores)."""
    from autosp.cost_models.catalog.hardware import resolve_hardware

    path = RESULTS / f"calibrated-cpux{ranks}.json"
    if recalibrate or not path.exists():
        RESULTS.mkdir(parents=True, exist_ok=True)
        print(f"calibrating this CPU with {ranks} rank(s) -> {path} ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "autosp.profiling.calibrate", "--quick", "--ranks", str(ranks),
                        "--out", str(path), "--no-progress"], check=True, stdout=subprocess.DEVNULL)
    return resolve_hardware(str(path))


def predicted(cfg, hw: HardwareSpec) -> dict:
    """The cost model's figures for one RunConfig: saved activations, allocated peak, step time."""
    from autosp.cost_models import estimate
    from autosp.cost_models.memory import activation_bytes
    from autosp.cost_models.shapes import Shapes

    est = estimate(cfg.model, hw, cfg.workload(), cfg.candidate())
    kept, _transient, _per_layer, _host = activation_bytes(Shapes(cfg.model, cfg.workload(), cfg.candidate()),
                                                          cfg.candidate())
    return {"saved": kept, "peak": est.memory.total - est.memory.reserve, "step": est.time.step,
            "memory": {k: getattr(est.memory, k) for k in ("parameters", "gradients", "optimizer_states",
                                                            "activations", "logits_loss", "comm_buffers")}}


def measured(row: dict) -> dict:
    """The measured counterparts from one harness row (studies.measure.harness)."""
    mem = row["memory"]
    return {"saved": mem["saved"]["activations"], "peak": mem["allocated_peak"], "step": row["time"]["step_median"],
            "spread": row["time"]["spread"], "other_cpu": row["contention"].get("other_cpu_share")}


def rows_with_predictions(cfgs, raw: list[dict], hw: HardwareSpec) -> list[dict]:
    """One row per configuration (a study's table): its label, status and config and, when it ran, the measured
    figures beside the cost model's (:func:`measured`, :func:`predicted`) and the harness's raw row."""
    rows = []
    for cfg, row in zip(cfgs, raw):
        out = {"label": cfg.label, "status": row["status"], "config": cfg.to_dict()}
        if row["status"] == "ok":
            out.update(measured=measured(row), predicted=predicted(cfg, hw), raw=row)
        else:
            out["error"] = row.get("error")
        rows.append(out)
    return rows


def stored_rows(name: str) -> tuple[dict, list, list[dict]]:
    """(the results file, its configurations, their raw harness rows) of ``results/<name>.json``: what a study's
    ``--repredict`` predicts again without measuring."""
    import json

    from studies.measure.harness import RunConfig

    old = json.loads((RESULTS / f"{name}.json").read_text())
    return old, [RunConfig.from_dict(r["config"]) for r in old["rows"]], [r.get("raw") or r for r in old["rows"]]


def study_rows(name: str, make_configs, hw: HardwareSpec, repredict: bool) -> tuple[int, list, list[dict]]:
    """(tokens per sequence, configurations, rows with predictions) of a study: measured now (``make_configs()``,
    one harness run), or with ``repredict`` the stored measurements of ``results/<name>.json`` predicted again."""
    import sys

    from studies.measure.harness import measure_many

    if repredict:
        old, cfgs, raw = stored_rows(name)
        return old["seq"], cfgs, rows_with_predictions(cfgs, raw, hw)
    cfgs = make_configs()
    print(f"{name}: measuring {len(cfgs)} settings at SP={cfgs[0].sp}, {cfgs[0].seq_len} tokens, "
          f"{cfgs[0].model.name} ...", file=sys.stderr, flush=True)
    return cfgs[0].seq_len, cfgs, rows_with_predictions(cfgs, measure_many(cfgs, hardware=None), hw)


def save_study(name: str, text: str, hw: HardwareSpec, seq: int, model, rows: list[dict]) -> int:
    """Print a study's table and write ``results/<name>.{txt,json}``; the exit status: 0 when every row ran."""
    from dataclasses import asdict

    print(text)
    write_json(RESULTS / f"{name}.json", {"environment": environment(), "hardware": hw.name, "seq": seq,
                                          "model": asdict(model), "rows": rows})
    (RESULTS / f"{name}.txt").write_text(text, encoding="utf-8")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def pct_error(pred: float, meas: float) -> float | None:
    """Signed error of the prediction in % of the measurement."""
    if not meas:
        return None
    return 100.0 * (pred - meas) / meas


def summary(errors: list) -> dict:
    """Median and maximum absolute % error (None entries skipped)."""
    values = [abs(e) for e in errors if e is not None]
    if not values:
        return {"n": 0, "median_abs_pct": None, "max_abs_pct": None}
    return {"n": len(values), "median_abs_pct": statistics.median(values), "max_abs_pct": max(values)}


def fmt_ratio(pred: float, meas: float) -> str:
    return f"{pred / meas:5.2f}" if meas else "  -  "


def fmt_pct(value: float | None) -> str:
    return "    -" if value is None else f"{value:+6.1f}%"


def environment() -> dict:
    import platform

    import torch

    return {"cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine()}


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    tmp.replace(path)
