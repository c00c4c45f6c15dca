"""``python -m studies.gpu_check``: its rows exercise every knob the compiler builds at SP=1 and fit an
H200, it runs from a checkout without the install, its CPU dry run measures and predicts every row
end to end, bad input is one line and exit 2, and a deadline stops the ranks, keeping what finished."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
if str(ROOT) not in sys.path:  # studies/ is a plain folder of scripts, run from the repository root
    sys.path.insert(0, str(ROOT))

from studies.gpu_check import rows  # noqa: E402

BUILT_AT_SP1 = {"zero_stage", "micro_batch", "grad_accum", "checkpointing", "mlp_chunks", "loss_chunks",
                "offload_activations", "offload_optimizer"}


def test_rows_exercise_every_knob_the_compiler_builds_at_sp1():
    compilable = rows.compilable_knobs()
    assert BUILT_AT_SP1 <= set(compilable)
    assert set(compilable).isdisjoint(rows.NOT_AT_SP1)
    assert compilable["checkpointing"] == ("none", "selective", "sequence", "full")
    assert rows.missing_knobs(rows.ROWS) == {}
    # the coverage check can fail: the plain first row alone leaves almost everything out
    missing = rows.missing_knobs(rows.ROWS[:1])
    assert BUILT_AT_SP1 <= set(missing)
    assert missing["zero_stage"] == (1, 2, 3) and missing["checkpointing"] == ("selective", "sequence", "full")
    assert len({r.name for r in rows.ROWS}) == len(rows.ROWS)


def test_rows_fit_an_h200_at_several_lengths():
    from autosp.cost_models.catalog.hardware import resolve_hardware
    from studies.gpu_check.check import CheckOptions, _configs, _fit_problem, _model

    hw = resolve_hardware("h200")
    configs = _configs(CheckOptions(out=ROOT / "unused"), rows.ROWS, _model(False), "inductor")
    assert configs[0].model.name == "llama-3.2-1b" and configs[0].dtype == "bf16"
    for cfg in configs:
        assert cfg.sp == 1 and cfg.world == 1
        assert _fit_problem(cfg, hw, 139 * 2**30) is None, cfg.label
    assert len({c.seq_len for c in configs}) >= 4
    # a row that cannot fit is reported, not run
    too_long = _configs(CheckOptions(out=ROOT / "unused"), [rows.row("huge", 1 << 21)], _model(False), "inductor")[0]
    assert "GiB" in _fit_problem(too_long, hw, 139 * 2**30)


def test_autosp_imports_from_a_bare_checkout():
    """Without site-packages (-S: no editable install, no optuna) the bootstrap maps autosp.* onto the
    top-level folders the way pyproject.toml's package-dir does."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from studies.bootstrap import ensure_autosp; "
            "ensure_autosp(); import autosp.contract.specs as s, autosp.cost_models.catalog.hardware as h; "
            "print(s.__file__); print(h.resolve_hardware('h200').name)")
    out = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT)], capture_output=True, text=True,
                         cwd="/", timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines == [str(ROOT / "autosp" / "contract" / "specs.py"), "h200"]


@pytest.mark.parametrize("argv, needle", [
    (["--rows", "base-8k,nope"], "unknown row(s) nope"),
    (["--hw", "nope"], "unknown hardware 'nope'"),
    (["--time-budget", "0"], "--time-budget must be positive"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, tmp_path, capsys):
    from studies.gpu_check.__main__ import main

    out = tmp_path / "out"
    assert main(argv + ["--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and needle in captured.err
    assert not out.exists()  # nothing half-written


def test_table_line_of_a_cuda_row():
    """The GPU columns (never produced on this machine) from a harness row shaped as the CUDA path makes it."""
    from studies.gpu_check import report

    gib = 2**30
    harness_row = {
        "status": "ok", "config": {"seq_len": 32768},
        "prediction": {"memory": {"total": 80 * gib, "reserve": 5 * gib}, "time": {"step": 1.5}, "fits": True},
        "memory": {"allocated_peak": 60 * gib, "saved": {"activations": 9 * gib, "host": 3 * gib},
                   "cuda": {"max_allocated": 61 * gib, "allocated_at_start": 20 * gib, "max_reserved": 64 * gib,
                            "outside_allocator": 1 * gib, "device_total": 140 * gib, "leftover_before_row": gib}},
        "time": {"step_median": 2.0, "spread": 0.01, "first_step": 70.0, "setup_seconds": 80.0}}
    e = report.entry(rows.row("offload-32k", 32768, checkpointing="sequence", offload_activations=True), harness_row)
    assert e["measured"]["device"] == 65 * gib and e["measured"]["saved_on_host"] == 3 * gib
    assert e["ratio"] == {"alloc": 75 / 60, "device": 80 / 65, "step": 0.75}
    line = report.format_line(e)
    assert line.split()[:5] == ["offload-32k", "32768", "z0", "ckpt:sequence", "offload-activations"]
    assert line.split()[5:] == ["60.00", "75.0", "1.25", "65.00", "80.0", "1.23", "2.000", "1.500", "0.75", "70.0"]


def test_optimizer_offload_rows_wait_for_the_cpu_adam_build(tmp_path):
    from studies.gpu_check import cpu_adam
    from studies.gpu_check.check import CheckOptions, _configs

    configs = _configs(CheckOptions(out=tmp_path, dry_run=True, steps=1), rows.ROWS, rows.DRY_RUN_MODEL, "aot_eager")
    status = tmp_path / "status.json"
    plain = next(c for c in configs if not c.offload_optimizer)
    offload = next(c for c in configs if c.offload_optimizer)
    cpu_adam.require_cpu_adam(str(status), plain)  # other rows never wait (no status file exists)
    status.write_text(json.dumps({"ok": False, "seconds": 12.0, "error": "CalledProcessError: ninja failed"}))
    with pytest.raises(RuntimeError, match="could not be built in 12 s: CalledProcessError: ninja failed"):
        cpu_adam.require_cpu_adam(str(status), offload)
    status.write_text(json.dumps({"ok": True, "seconds": 70.0, "error": ""}))
    cpu_adam.require_cpu_adam(str(status), offload)


def _dry_run(tmp_path, *extra):
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    return subprocess.run([sys.executable, "-m", "studies.gpu_check", "--dry-run", "--out", str(tmp_path), *extra],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800)


@pytest.mark.slow
def test_dry_run_measures_and_predicts_every_row(tmp_path):
    # a budget far above the ~100 s the dry run takes on an idle machine: every row must run even under load
    run = _dry_run(tmp_path, "--time-budget", "1500", "--kernel-breakdown", "base-8k,chunks-64k")
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    table = (tmp_path / "gpu_check.txt").read_text()
    assert result["mode"] == "dry-run" and result["complete"] and result["knobs_not_exercised"] == {}
    assert result["attention_kernels"][0].startswith("attention kernels: no CUDA device") and "attention kernels" in run.stdout
    assert [e["name"] for e in result["rows"]] == [r.name for r in rows.ROWS]
    for spec, e, harness_row in zip(rows.ROWS, result["rows"], result["harness_rows"]):
        assert e["status"] == "ok", e
        config = harness_row["config"]
        assert config["sp"] == 1 and config["dtype"] == "bf16"
        assert {k: config[k] for k in spec.knob_dict()} == spec.knob_dict()  # the knobs the row ran with
        for key in ("alloc", "step"):
            assert e["predicted"][key] > 0 and e["measured"][key] > 0
        # allocated peak within a factor of 5 of the prediction: catches a unit or category slip
        assert 0.2 < e["ratio"]["alloc"] < 5, e
        assert e["measured"]["saved_activations"] > 0
        assert e["name"] in table and e["name"] in run.stdout
    # the two profiled rows carry their step's device time by kind (on a CPU: its operators), and a line each
    profiled = {e["name"]: e.get("kernels") for e in result["rows"] if e.get("kernels")}
    assert set(profiled) == {"base-8k", "chunks-64k"}
    for k in profiled.values():
        assert "error" not in k, k
        assert 0 < k["busy"] and k["seconds"]["matmul"] > 0 and k["seconds"]["attention"] > 0
    assert table.count("one profiled step:") == 2
    # checkpointing moves what is saved for backward the way its policies are ordered
    saved = {e["name"]: e["measured"]["saved_activations"] for e in result["rows"]}
    assert saved["full-32k"] < saved["offload-32k"]  # same length: 'full' keeps less than 'sequence'


def _hang(cfg):  # a ``prepare`` hook that never returns (unpickled by the spawned rank)
    time.sleep(3600)


@pytest.mark.slow
def test_deadline_stops_a_running_row_and_skips_the_rest():
    from studies.gpu_check.check import CheckOptions, _configs
    from studies.measure import measure_many

    configs = _configs(CheckOptions(out=ROOT / "unused", dry_run=True, steps=1), rows.ROWS[:2], rows.DRY_RUN_MODEL,
                       "aot_eager")
    seen = []
    t0 = time.time()
    out = measure_many(configs, device="cpu", deadline=t0 + 30, on_row=lambda i, r: seen.append(i), prepare=_hang)
    assert time.time() - t0 < 150  # it returned: the hanging rank was stopped at the deadline
    assert seen == []
    assert [r["status"] for r in out] == ["not_run", "not_run"]
    assert out[0]["error"] == "stopped at the deadline while it ran"
    assert out[1]["error"].startswith("not started")


def test_the_cost_model_prices_the_h200_checks_allocated_peaks_within_ten_percent():
    """The committed GPU check of one H200 (studies/results/gpu_check_h200.json), priced again by today's cost model:
    every measured row's allocated peak within 10 %. Pricing the untiled loss op by op (14 B per logit where Inductor
    holds 6) put seven of its nine rows at 1.3-2.3x."""
    from studies.gpu_check.reprice import reprice_lines, reprice_rows

    path = str(ROOT / "studies" / "results" / "gpu_check_h200.json")
    _, _, priced = reprice_rows(path)
    assert len(priced) == 9
    assert all(0.9 <= r["alloc_now"] <= 1.1 for r in priced), [(r["label"], round(r["alloc_now"], 3)) for r in priced]
    assert max(r["alloc_then"] for r in priced) > 2.0  # the check ran under the old price
    assert "param-offload-8k" in "\n".join(reprice_lines(path))


def test_the_cost_model_prices_the_h200_checks_offloaded_optimizer_steps_with_the_measured_host():
    """The second H200 check (studies/results/gpu_check_h200_session2.json), priced with the profile autosp-calibrate
    measured on that VM (calibrated-h200.json: its host triad 101 GB/s): the two optimizer-offload rows' step times
    within the band of the rows without offload (0.8-1.1 of measured). Priced with a DGX's host DRAM and Adam's bytes
    alone they were at 0.38-0.40; with the measured triad but Adam's bytes alone, at 0.62-0.68 (the clip scale, the
    weight cast and the gradients' fp32 and accumulation copies were missing: cost_models/optimizer_offload.py)."""
    from studies.gpu_check.reprice import reprice_rows

    results = ROOT / "studies" / "results"
    _, _, priced = reprice_rows(str(results / "gpu_check_h200_session2.json"), str(results / "calibrated-h200.json"))
    offload = {r["label"]: r["step_now"] for r in priced if r["label"] in ("optim-offload-8k", "param-offload-8k")}
    assert set(offload) == {"optim-offload-8k", "param-offload-8k"}
    assert all(0.8 <= v <= 1.1 for v in offload.values()), offload
    assert all(0.9 <= r["alloc_now"] <= 1.1 for r in priced)  # the tiled rows too, measured after their fix


def test_the_kernel_breakdown_sums_device_time_by_kind_and_counts_overlaps_once():
    from studies.measure.kernels import kind_of, summarize

    assert kind_of("sm90_xmma_gemm_bf16bf16_bf16f32") == "matmul"
    assert kind_of("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention"
    assert kind_of("Memcpy HtoD (Pinned -> Device)") == "copy"
    assert kind_of("ncclDevKernel_AllGather_RING_LL") == "collective"
    assert kind_of("triton_per_fused_add_mul_rsqrt_0") == "other"
    ns = 1_000_000_000
    events = [("gemm_a", 0, ns // 2), ("flash_fwd", ns // 4, ns // 2), ("Memcpy DtoH", 2 * ns, ns // 10)]
    out = summarize(events, wall_seconds=3.0)
    assert out["seconds"]["matmul"] == 0.5 and out["seconds"]["attention"] == 0.5 and out["seconds"]["copy"] == 0.1
    assert out["busy"] == pytest.approx(0.85) and out["idle"] == pytest.approx(2.15)  # [0, 0.75] and [2, 2.1]
    assert out["top"][0]["seconds"] == 0.5 and out["events"]["matmul"] == 1

