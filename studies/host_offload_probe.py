"""Where an offloaded optimizer step's time goes on one host: CPU Adam against the host's triad, and the copies.

ZeRO-Offload runs the optimizer on the host with DeepSpeed's ``DeepSpeedCPUAdam`` over one flat fp32 partition
(master weights, gradients, two moments), and moves the gradients down and the updated weights up over the
host link. The cost model (``cost_models/optimizer_offload.py``) prices the step's host passes (Adam's
``OPTIMIZER_BYTES_PER_PARAM``, the clip scale, the weight cast) at the profile's ``host_memory_bandwidth`` (what
``autosp-calibrate`` measures as a STREAM triad), and its copies at ``host_bandwidth``. This probe measures each
piece on the machine it runs on, side by side in one process:

- the triad, with the same function and threads as ``autosp-calibrate``;
- one ``DeepSpeedCPUAdam.step`` over N parameters (default Llama-3.2-1B's 1.24e9, the GPU check's model) laid
  out as ZeRO-Offload lays them out (one flat fp32 tensor each), timed after a warm-up step, and the bandwidth
  it achieves at the cost model's bytes per parameter; the ratio of that to the triad is the figure to check
  (``--no-adam`` skips it and its JIT build);
- the host passes DeepSpeed makes around the step: the fp32 -> bf16 weight cast, the clip scale, a zeroing;
- on CUDA, the copies as DeepSpeed makes them: bf16 device <-> pinned host, the gradients cast to fp32 on the
  device and copied down, and torch's ``copy_`` across devices and dtypes (ZeRO-3's weights after the step).

    python -m studies.host_offload_probe --out out/host_probe      # CUDA or CPU; CPU Adam JIT-builds on first use
    python -m studies.host_offload_probe --params 2e8               # a smaller step (this CPU machine)

It writes host_offload_probe.json and prints a table. Runs from a bare checkout (:mod:`studies.bootstrap`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from studies.bootstrap import ensure_autosp

ensure_autosp()

import torch  # noqa: E402

from autosp.cost_models.flops import OPTIMIZER_BYTES_PER_PARAM  # noqa: E402
from autosp.cost_models.optimizer_offload import CLIP_SCALE_BYTES_PER_PARAM, WEIGHT_CAST_BYTES_PER_PARAM  # noqa: E402
from autosp.profiling.calibration.memory import host_stream_bandwidth, node_cpus  # noqa: E402
from autosp.profiling.calibration.settings import make_settings  # noqa: E402
from autosp.profiling.calibration.timing import measure  # noqa: E402

LLAMA_32_1B_PARAMS = 1.236e9
"""Llama-3.2-1B's parameter count with its tied head (``autosp-plan --model llama-3.2-1b`` prints 1.24B)."""


def cpu_adam_step(n: int, settings) -> dict:
    """One DeepSpeedCPUAdam step over one flat fp32 partition of ``n`` parameters (timed as :func:`_rate`), with the
    JIT build's seconds."""
    t0 = time.perf_counter()
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    param = torch.nn.Parameter(torch.full((n,), 0.01, dtype=torch.float32))
    param.grad = torch.full((n,), 1e-3, dtype=torch.float32)
    opt = DeepSpeedCPUAdam([param], lr=1e-4, weight_decay=0.01)
    opt.step()  # builds the op if needed, creates the moments
    setup = time.perf_counter() - t0
    seconds = measure(opt.step, lambda: None, settings)["seconds"]
    moved = OPTIMIZER_BYTES_PER_PARAM * n
    return {"params": n, "seconds": seconds, "setup_seconds": setup, "threads": torch.get_num_threads(),
            "bytes_per_param_priced": OPTIMIZER_BYTES_PER_PARAM, "bandwidth_at_priced_bytes": moved / seconds}


def _rate(fn, nbytes: float, settings, sync=lambda: None) -> float:
    """``nbytes`` over the seconds of one call of ``fn``, timed as autosp-calibrate times (warm-up, median)."""
    return nbytes / measure(fn, sync, settings)["seconds"]


def host_passes(n: int, settings) -> dict:
    """The host-side passes over the fp32 partition that ZeRO-Offload makes around CPU Adam (DeepSpeed 0.19.8,
    ``runtime/zero/stage_1_and_2.py`` ``step``, ``stage3.py``): the fp32 -> bf16 cast of the updated weights
    into the bit16 buffer, gradient clipping's in-place scale, and zeroing the gradient partition; in bytes of
    DRAM traffic per second, at the bytes the cost model prices (the zeroing: 4 bytes per parameter)."""
    fp32 = torch.full((n,), 0.01, dtype=torch.float32)
    bf16 = torch.empty(n, dtype=torch.bfloat16)
    return {"fp32_to_bf16_cast": _rate(lambda: bf16.copy_(fp32), WEIGHT_CAST_BYTES_PER_PARAM * n, settings),
            "fp32_scale_in_place": _rate(lambda: fp32.mul_(0.999), CLIP_SCALE_BYTES_PER_PARAM * n, settings),
            "fp32_zero": _rate(fp32.zero_, 4.0 * n, settings)}


def copies(n: int, settings) -> dict:
    """The host link's copies as ZeRO-Offload makes them, in bytes moved over the link per second: bf16 both ways
    (pinned), the gradients cast to fp32 on the device and copied down (stage 1-2's fp32 partition), and two
    cross-dtype ``copy_`` calls across devices (torch casts on the host side through a pageable buffer)."""
    dev = torch.ones(n, dtype=torch.bfloat16, device="cuda")
    host16 = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    host32 = torch.empty(n, dtype=torch.float32, pin_memory=True)
    sync = torch.cuda.synchronize
    return {"d2h_bf16_pinned": _rate(lambda: host16.copy_(dev), 2.0 * n, settings, sync),
            "h2d_bf16_pinned": _rate(lambda: dev.copy_(host16), 2.0 * n, settings, sync),
            "d2h_float_on_device_then_fp32_pinned": _rate(lambda: host32.copy_(dev.float()), 4.0 * n, settings, sync),
            "d2h_bf16_into_fp32_host_copy": _rate(lambda: host32.copy_(dev), 2.0 * n, settings, sync),
            "h2d_fp32_host_into_bf16_copy": _rate(lambda: dev.copy_(host32), 2.0 * n, settings, sync)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=float, default=LLAMA_32_1B_PARAMS, help="parameters in the CPU Adam step")
    ap.add_argument("--repeats", type=int, default=3, help="timed samples of each measurement (the median is kept)")
    ap.add_argument("--no-adam", action="store_true", help="skip the CPU Adam step (and its JIT build)")
    ap.add_argument("--out", default="out/host_probe", help="folder for host_offload_probe.json")
    args = ap.parse_args(argv)
    if args.params < 1 or args.repeats < 1:
        ap.error("--params and --repeats must be at least 1")
    result = {"cpus": node_cpus(), "torch_threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()}
    settings = dataclasses.replace(make_settings("cpu", quick=False), reps=args.repeats)
    result["triad"] = host_stream_bandwidth(settings.host_stream_bytes, node_cpus(), settings)
    n = int(args.params)
    if not args.no_adam:
        result["cpu_adam"] = cpu_adam_step(n, settings)
        result["adam_over_triad"] = result["cpu_adam"]["bandwidth_at_priced_bytes"] / result["triad"]["bandwidth"]
    result["host_passes"] = host_passes(n, settings)
    if result["cuda"]:
        result["copies"] = copies(n, settings)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "host_offload_probe.json").write_text(json.dumps(result, indent=1) + "\n")
    triad = result["triad"]["bandwidth"]
    print(f"host: {result['cpus']} CPUs, torch threads {result['torch_threads']}; {n / 1e9:.3f}B parameters")
    print(f"{'triad':38s} {triad / 1e9:7.1f} GB/s  ({result['triad']['threads']} threads)")
    if "cpu_adam" in result:
        adam = result["cpu_adam"]
        print(f"{'CPU Adam step':38s} {adam['bandwidth_at_priced_bytes'] / 1e9:7.1f} GB/s  = "
              f"{result['adam_over_triad']:.2f} x triad at {adam['bytes_per_param_priced']:.0f} B/param "
              f"({adam['seconds']:.3f} s; setup {adam['setup_seconds']:.0f} s)")
    for name, bw in result["host_passes"].items():
        print(f"{name:38s} {bw / 1e9:7.1f} GB/s  = {bw / triad:.2f} x triad")
    for name, bw in result.get("copies", {}).items():
        print(f"{name:38s} {bw / 1e9:7.1f} GB/s over the link")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
