"""autosp-calibrate: the alpha-beta fit, the profile rules, the fingerprint, the CLI, and a real 2-rank run."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from dataclasses import asdict, replace

import pytest

from autosp.cli import calibrate_main
from autosp.profiling.calibration.fit import bus_factor, fit_alpha_beta
from autosp.profiling.calibration.hardware_spec import (build_hardware_spec, non_finite_fields, format_summary,
                                                    measurements_path_for)
from autosp.profiling.calibration.settings import make_settings
from autosp.contract.specs import hardware_from_dict

SIZES = [1 << e for e in range(10, 25)]


# --------------------------------------------------------------------------------------- alpha-beta fit

def test_fit_recovers_exact_alpha_beta():
    alpha, beta = 37e-6, 3.5e9
    fit = fit_alpha_beta(SIZES, [alpha + x / beta for x in SIZES])
    assert fit.alpha == pytest.approx(alpha, rel=1e-9)
    assert fit.beta == pytest.approx(beta, rel=1e-9)
    assert fit.max_rel_error < 1e-9
    assert fit.points == len(SIZES)
    assert fit.predict(1 << 20) == pytest.approx(alpha + (1 << 20) / beta)


def test_fit_with_noise_stays_close():
    rng = random.Random(7)
    alpha, beta = 250e-6, 1.2e9
    times = [(alpha + x / beta) * (1 + rng.uniform(-0.05, 0.05)) for x in SIZES]
    fit = fit_alpha_beta(SIZES, times)
    assert fit.alpha == pytest.approx(alpha, rel=0.10)
    assert fit.beta == pytest.approx(beta, rel=0.10)
    assert fit.max_rel_error <= 0.11


def test_fit_weights_small_messages_as_much_as_large_ones():
    # A 2x error on the largest message must not drag alpha far: residuals are relative.
    alpha, beta = 20e-6, 10e9
    times = [alpha + x / beta for x in SIZES]
    times[-1] *= 2
    fit = fit_alpha_beta(SIZES, times)
    assert fit.alpha == pytest.approx(alpha, rel=0.25)


def test_fit_clamps_negative_latency_to_zero():
    sizes = [1 << e for e in range(17, 25)]
    fit = fit_alpha_beta(sizes, [-50e-6 + x / 1e9 for x in sizes])  # the unconstrained alpha is negative
    assert fit.alpha == 0.0
    assert fit.beta == pytest.approx(1e9, rel=0.3)


def test_fit_rejects_degenerate_input():
    with pytest.raises(ValueError, match="two distinct"):
        fit_alpha_beta([1024, 1024], [1e-3, 2e-3])
    with pytest.raises(ValueError, match="does not grow"):
        fit_alpha_beta([1024, 2048, 4096], [3e-3, 2e-3, 1e-3])
    with pytest.raises(ValueError, match="positive"):
        fit_alpha_beta([1024, 2048], [0.0, 1e-3])


def test_bus_factors():
    assert bus_factor("all_to_all", 4) == 0.75
    assert bus_factor("all_gather", 2) == 0.5
    assert bus_factor("reduce_scatter", 8) == 0.875
    assert bus_factor("all_reduce", 4) == 1.5
    assert bus_factor("all_reduce", 1) == 0.0
    with pytest.raises(ValueError):
        bus_factor("broadcast", 2)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("quick", [True, False])
@pytest.mark.parametrize("dtype", [None, "fp32", "bf16"])
def test_settings_cover_what_the_profile_needs(device, quick, dtype):
    s = make_settings(device, quick, dtype)
    assert s.profile_dtype == (dtype or ("bf16" if device == "cuda" else "fp32"))
    for d in s.dtypes():
        assert s.matmul_shapes[d] and s.attention_seq_lens[d] and d in s.linear_shape
    assert len(s.message_sizes) >= 4 and s.reps >= 3 and s.comm_reps >= 3


# ------------------------------------------------------------------------- profile rules (synthetic data)

def _rank(rank, matmul_rate, linear_rate, attention_rate, alpha, beta, copy_bw=10e9):
    def rec(kind, flop, rate, **extra):
        return {"kind": kind, "dtype": "fp32", **extra, "flop": flop, "seconds": flop / rate, "flops": rate,
                "samples": [flop / rate], "inner": 1}

    attention = rec("attention_fwd_bwd", 7 * 256 * 1024 ** 2, attention_rate, seq_len=1024, batch=1,
                    heads=4, head_dim=64)
    attention.update(flop_model=6 * 256 * 1024 ** 2, flop_full=12 * 256 * 1024 ** 2)
    small = rec("attention_fwd_bwd", 7 * 256 * 256 ** 2, attention_rate / 3, seq_len=256, batch=1, heads=4,
                head_dim=64)
    collectives = {}
    for name in ("all_to_all", "all_reduce", "all_gather", "reduce_scatter"):
        b = beta if name == "all_to_all" else 2 * beta
        points = [{"bytes": m, "link_bytes": bus_factor(name, 2) * m,
                   "seconds": alpha + bus_factor(name, 2) * m / b,
                   "min_seconds": alpha + bus_factor(name, 2) * m / b, "samples": [], "inner": 1}
                  for m in SIZES]
        collectives[name] = {"supported": True, "error": "", "points": points}
    return {"rank": rank, "local_rank": rank, "host": "node0", "device_name": "Test CPU", "threads": 1,
            "rss_at_start": 1e8, "host_memory": {"total_bytes": 16e9, "available_bytes": 12e9, "source": "test"},
            "compute": {"matmul": [rec("matmul", 2e9, matmul_rate, shape=[1000, 1000, 1000]),
                                   rec("matmul", 2.5e8, matmul_rate / 2, shape=[500, 500, 500])],
                        "linear": [rec("linear_fwd_bwd", 6e9, linear_rate, shape=[1000, 1000, 1000])],
                        "attention": [small, attention],
                        "copy": {"kind": "copy", "bytes": 1 << 25, "bytes_moved": 2 << 25,
                                 "seconds": (2 << 25) / copy_bw, "bandwidth": copy_bw, "samples": [], "inner": 1}},
            "host_bandwidth": None, "collectives": {"2": collectives}, "gpu_memory": None}


def _raw(slow_rank_factor=1.0, alpha=300e-6, beta=1e9):
    ranks = [_rank(0, 40e9, 30e9, 10e9, alpha, beta),
             _rank(1, 40e9 * slow_rank_factor, 30e9 * slow_rank_factor, 10e9, alpha, beta)]
    return {"ranks": ranks, "groups": [{"size": 2, "scope": "intra"}], "world_size": 2, "local_world_size": 2,
            "backend": "gloo", "device": "cpu", "torch_version": "test", "cuda_version": None,
            "settings": asdict(make_settings("cpu", True))}


def test_profile_rules_on_known_measurements():
    spec, sidecar = build_hardware_spec(_raw(slow_rank_factor=0.8), now="2026-01-01T00:00:00+00:00")
    acc = spec.accelerator
    assert acc.peak_flops == pytest.approx(32e9)  # best matmul of the slowest rank
    assert spec.matmul_efficiency == pytest.approx(24e9 / 32e9)
    assert spec.attention_efficiency == pytest.approx(10e9 / 32e9)  # longest sequence
    assert spec.intra_node_bandwidth == pytest.approx(1e9, rel=1e-9)  # the all-to-all's beta
    assert spec.intra_node_latency == pytest.approx(300e-6, rel=1e-9)
    assert spec.comm_efficiency == 1.0
    assert spec.inter_node_bandwidth == 0.0 and spec.nodes == 1 and spec.devices_per_node == 2
    assert acc.memory_bytes == pytest.approx(8e9)  # MemTotal / 2 ranks
    assert spec.usable_memory_fraction == pytest.approx((12e9 + 2e8) / 16e9)
    assert acc.memory_bandwidth == pytest.approx(10e9) and spec.host_bandwidth == pytest.approx(5e9)
    assert spec.host_memory_bytes == 16e9
    assert non_finite_fields(spec) == []
    fits = {e["collective"]: e["fit"] for e in sidecar["collectives"]}
    assert fits["all_reduce"]["beta"] == pytest.approx(2e9, rel=1e-9)
    assert sidecar["hardware_fingerprint"] == spec.fingerprint()
    assert set(sidecar["derivation"]) >= {"peak_flops", "matmul_efficiency", "attention_efficiency",
                                          "intra_node_bandwidth", "usable_memory_fraction"}


def test_fingerprint_is_stable_through_the_file_and_changes_with_figures(tmp_path):
    now = "2026-01-01T00:00:00+00:00"
    spec, _ = build_hardware_spec(_raw(), now=now)
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(asdict(spec), indent=2))
    loaded_once = hardware_from_dict(json.loads(path.read_text()))
    loaded_twice = hardware_from_dict(json.loads(path.read_text()))
    assert loaded_once == spec
    assert loaded_once.fingerprint() == loaded_twice.fingerprint() == spec.fingerprint()
    assert build_hardware_spec(_raw(), now=now)[0].fingerprint() == spec.fingerprint()  # same figures, same print
    assert build_hardware_spec(_raw(beta=2e9), now=now)[0].fingerprint() != spec.fingerprint()
    assert replace(spec, matmul_efficiency=0.5).fingerprint() != spec.fingerprint()
    faster = replace(spec, accelerator=replace(spec.accelerator, peak_flops=spec.accelerator.peak_flops * 1.01))
    assert faster.fingerprint() != spec.fingerprint()


def test_summary_table_compares_with_a_catalog_entry():
    from autosp.cost_models.catalog.hardware import resolve_hardware

    spec, sidecar = build_hardware_spec(_raw())
    table = format_summary(spec, sidecar, resolve_hardware("h100x8"), elapsed=1.0)
    assert "vs catalog h100x8" in table
    assert "1 GB/s" in table and "e+" not in table  # 0.99999e9 rounds to 1 GB/s
    for field in ("peak_flops", "matmul_efficiency", "attention_efficiency", "intra_node_bandwidth",
                  "usable_memory_fraction", "fingerprint"):
        assert field in table


def test_measurements_path():
    assert measurements_path_for("out/hw.json") == "out/hw.measurements.json"
    assert measurements_path_for("hw") == "hw.measurements.json"


# ------------------------------------------------------------------------------------------------- CLI

def _error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("autosp-calibrate: error: ")
    return err[0]


@pytest.mark.parametrize("argv, needle", [
    (["--ranks", "0"], "--ranks must be between 1 and 1024"),
    (["--ranks", "two"], "invalid int value"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--backend", "mpi"], "invalid choice"),
    (["--bogus"], "unrecognized arguments"),
    (["--out", "/proc/autosp-no-such-dir/hw.json"], "cannot write --out"),
    (["--compare", "no-such-accelerator"], "unknown hardware"),
])
def test_bad_input_is_one_usage_line(argv, needle, capsys):
    assert calibrate_main(argv) == 2
    assert needle in _error_line(capsys)


def test_out_that_is_a_directory_is_refused(tmp_path, capsys):
    assert calibrate_main(["--out", str(tmp_path)]) == 2
    assert "is a directory" in _error_line(capsys)


def test_nccl_without_cuda_is_a_usage_error(capsys):
    import torch

    if torch.cuda.is_available():  # on a GPU machine the same check guards a missing NCCL instead
        return
    assert calibrate_main(["--backend", "nccl", "--quick"]) == 2
    assert "needs CUDA" in _error_line(capsys)


def test_help_teaches(capsys):
    with pytest.raises(SystemExit) as stop:
        calibrate_main(["--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    for word in ("alpha", "--quick", "--ranks", "measurements.json", "torchrun", "autosp-plan", "--hw cpu2.json"):
        assert word in text


def test_calibration_modules_do_not_drag_torch_into_planning():
    code = ("import sys; import autosp.cost_models, autosp.profiling.calibrate, "
            "autosp.profiling.calibration.hardware_spec, autosp.profiling.calibration.fit, "
            "autosp.profiling.calibration.settings, autosp.profiling.calibration.contention; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# -------------------------------------------------------------------------------------- real measuring

def _assert_loadable_profile(path):
    from autosp.cost_models import estimate
    from autosp.contract.specs import Candidate, ModelSpec, Workload
    from autosp.cost_models.catalog.hardware import resolve_hardware

    data = json.loads(path.read_text())
    spec = hardware_from_dict(data)
    assert resolve_hardware(str(path)) == spec  # what `autosp-plan --hw PATH` loads
    assert non_finite_fields(spec) == []
    acc = spec.accelerator
    for value in (acc.peak_flops, acc.memory_bytes, acc.memory_bandwidth, spec.host_bandwidth,
                  spec.host_memory_bytes, spec.host_memory_bandwidth, spec.matmul_efficiency, spec.attention_efficiency,
                  spec.usable_memory_fraction, spec.comm_efficiency):
        assert math.isfinite(value) and value > 0
    assert 0 < spec.usable_memory_fraction <= 1
    tiny = ModelSpec(name="tiny", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn_hidden=688,
                     vocab=1000)
    est = estimate(tiny, spec, Workload(seq_len=2048, dtype="fp32"), Candidate(sp=spec.devices_per_node))
    assert 0 < est.time.step < math.inf and est.capacity_bytes > 0
    return spec


@pytest.mark.slow
def test_quick_two_ranks_end_to_end(tmp_path, capsys):
    out = tmp_path / "cpu2.json"
    assert calibrate_main(["--quick", "--ranks", "2", "--out", str(out), "--json", "--no-progress"]) == 0
    printed = json.loads(capsys.readouterr().out)
    spec = _assert_loadable_profile(out)
    assert spec.devices_per_node == 2 and spec.nodes == 1
    assert spec.intra_node_bandwidth > 0 and spec.intra_node_latency > 0
    assert printed["fingerprint"] == spec.fingerprint()
    assert hardware_from_dict(printed["hardware"]) == spec
    side = json.loads((tmp_path / "cpu2.measurements.json").read_text())
    assert side["schema"] == "autosp-calibration-measurements" and side["hardware_fingerprint"] == spec.fingerprint()
    assert side["environment"]["ranks"] == 2 and side["environment"]["backend"] == "gloo"
    by_name = {e["collective"]: e for e in side["collectives"] if e["group_size"] == 2}
    assert set(by_name) == {"all_to_all", "all_reduce", "all_gather", "reduce_scatter"}
    a2a = by_name["all_to_all"]
    assert len(a2a["points"]) == len(make_settings("cpu", True).message_sizes)
    for point in a2a["points"]:
        assert point["seconds"] > 0 and len(point["per_rank_seconds"]) == 2
    assert a2a["fit"]["beta"] == pytest.approx(spec.intra_node_bandwidth)
    assert len(side["raw_per_rank"]) == 2


@pytest.mark.slow
def test_quick_single_rank_in_process(tmp_path, capsys):
    out = tmp_path / "cpu1.json"
    assert calibrate_main(["--quick", "--ranks", "1", "--out", str(out), "--no-progress", "--name", "solo"]) == 0
    table = capsys.readouterr().out
    assert "peak_flops" in table and "fingerprint" in table and f"wrote {out}" in table
    spec = _assert_loadable_profile(out)
    assert spec.name == "solo" and spec.devices_per_node == 1
    assert spec.intra_node_bandwidth == 0.0  # nothing to measure with one rank
    assert "host triad" in table and "host_memory_bandwidth" in table
