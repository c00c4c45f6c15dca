"""``autosp-calibrate``: measure this machine and write a hardware file that ``autosp-plan --hw`` reads.

Torch is imported only after the arguments are checked (``--help`` and bad input are instant), and never
by ``import autosp.cost_models``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

from autosp.errors import AutospError, UsageError

DESCRIPTION = """\
Measure the machine this runs on and write a hardware file (a HardwareSpec JSON) for the planner:

  compute      achieved matmul FLOP/s at training-like shapes (bf16 on GPU, fp32 on CPU; the other dtype
               is measured too and recorded), linear forward+backward, causal SDPA attention
               forward+backward at a few sequence lengths, and device memory-copy bandwidth;
  collectives  all-to-all, all-reduce, all-gather and reduce-scatter over a sweep of message sizes for each
               group size (2, 4, ... up to --ranks), fitted as t = alpha + f(P) * bytes / beta;
  memory       usable memory per rank (GPU: an allocation probe; CPU: available RAM / ranks) and, on GPU,
               pinned host<->device copy bandwidth; and each node's host DRAM bandwidth (a multi-threaded
               triad: what CPU Adam streams through under optimizer offload).

All ranks measure at the same time, as training ranks share the machine; every figure is the slowest
rank's. The profile's peak_flops is the best matmul rate measured, and its efficiency factors are measured
rates / peak_flops (docs/calibration.md says exactly what each field means). Raw measurements per rank,
group size and message size go to a sidecar next to --out (hw.json -> hw.measurements.json).
"""

EPILOG = """\
examples:
  autosp-calibrate --quick --ranks 2 --out cpu2.json      # about 30 s on a 2-core CPU (gloo)
  autosp-plan --model llama --ctx 32k --hw cpu2.json      # plan with the measured hardware file
  autosp-calibrate --out h200x8.json --compare h100x8     # all local GPUs (nccl), vs a catalog entry
  torchrun --nproc-per-node 8 -m autosp.profiling.calibrate --out hw.json   # ranks from torchrun

exit codes: 0 success, 1 internal error, 2 bad arguments or unwritable --out.
"""


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input as one UsageError line instead of usage text + exit."""

    def error(self, message):
        raise UsageError(f"{message} (see autosp-calibrate --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="autosp-calibrate", description=DESCRIPTION, epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, metavar="N",
                   help="rank processes to spawn on this machine: one per GPU (default: every visible GPU) "
                        "or per CPU share (default: 2, or 1 on a 1-core machine). Under torchrun the "
                        "launcher's ranks are used and --ranks must match or be omitted")
    p.add_argument("--backend", choices=("gloo", "nccl"),
                   help="collective backend; gloo measures the CPU as the device, nccl the GPUs "
                        "(default: nccl when CUDA is available, else gloo)")
    p.add_argument("--quick", action="store_true",
                   help="small shapes, short message sweep, few repeats (medians of 3-5): about 30 s on a "
                        "2-core CPU; the full run takes minutes and is steadier")
    p.add_argument("--out", metavar="PATH",
                   help="write the profile here (atomically) and the raw measurements to "
                        "PATH without .json + .measurements.json; without --out nothing is written")
    p.add_argument("--json", action="store_true",
                   help="print a JSON object (profile, fingerprint, files, fits) on stdout instead of the table")
    p.add_argument("--compare", metavar="HW",
                   help="show a catalog hardware entry (e.g. h100x8) next to the measured figures")
    p.add_argument("--dtype", choices=("bf16", "fp32"),
                   help="dtype whose figures go into the profile (default: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--threads", type=int, metavar="T",
                   help="CPU only: intra-op threads per rank (default: cores / ranks, at least 1). Calibrate "
                        "with the thread count your training ranks will use")
    p.add_argument("--name", help="profile name (default: calibrated-<device>x<ranks>, e.g. calibrated-cpux2)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _check_out(path: str) -> None:
    """Fail before measuring when --out (or its measurements sidecar) cannot be written: a directory, a
    device or pipe, or a place this process cannot create files in (autosp.files tries, as permission bits
    lie to root)."""
    from autosp.profiling.calibration.hardware_spec import measurements_path_for
    from autosp.files import check_output

    if os.path.isdir(path):
        raise UsageError(f"--out {path} is a directory; give a file path such as {os.path.join(path, 'hw.json')}")
    check_output(path, "--out")
    check_output(measurements_path_for(path), "--out (its measurements sidecar)")


def _resolve_compare(name: str):
    try:
        from autosp.cost_models.catalog.hardware import resolve_hardware
    except ImportError:
        raise UsageError("--compare needs the hardware catalog (autosp.cost_models.catalog.hardware), "
                         "which this installation lacks") from None
    return resolve_hardware(name)


def main(argv=None) -> int:
    started = time.perf_counter()
    args = build_parser().parse_args(argv)
    if args.ranks is not None and not 1 <= args.ranks <= 1024:
        raise UsageError(f"--ranks must be between 1 and 1024, got {args.ranks}")
    from autosp.profiling.calibration.limits import check_launch, check_thread_count

    check_thread_count(args.threads)
    if args.out:
        _check_out(args.out)
    compare = _resolve_compare(args.compare) if args.compare else None

    import torch  # noqa: PLC0415 - only now: --help and bad input stay fast

    from autosp.profiling.calibration import launch
    from autosp.profiling.calibration.hardware_spec import (build_hardware_spec, non_finite_fields, format_summary,
                                                        measurements_path_for)
    from autosp.profiling.calibration.settings import make_settings

    env = launch.torchrun_env()
    cuda = torch.cuda.is_available()
    backend = args.backend or ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        raise UsageError("--backend nccl needs CUDA GPUs and this machine has none; use --backend gloo")
    if backend == "nccl" and not torch.distributed.is_nccl_available():
        raise UsageError("--backend nccl: this torch build has no NCCL; use --backend gloo")
    device = "cuda" if backend == "nccl" else "cpu"
    if env is not None:
        if args.ranks is not None and args.ranks != env["world"]:
            raise UsageError(f"--ranks {args.ranks} disagrees with torchrun's WORLD_SIZE={env['world']}; "
                             "omit --ranks under torchrun")
        ranks, local_ranks = env["world"], env["local_world"]
    else:
        if args.ranks is not None:
            ranks = args.ranks
        else:
            ranks = torch.cuda.device_count() if device == "cuda" else min(2, _cores())
        local_ranks = ranks
    if device == "cuda" and local_ranks > torch.cuda.device_count():
        raise UsageError(f"{local_ranks} ranks per node need as many GPUs; this machine has "
                         f"{torch.cuda.device_count()}")
    if device == "cpu" and local_ranks > _cores():
        print(f"autosp-calibrate: warning: {local_ranks} ranks on {_cores()} cores: the ranks will share "
              "cores, and each rank's figures drop accordingly (as they would in training)", file=sys.stderr)
    threads = args.threads or max(1, _cores() // local_ranks)
    check_launch(device, local_ranks, threads, _cores(), args.quick)
    settings = make_settings(device, args.quick, args.dtype)
    cfg = launch.LaunchConfig(settings=settings, backend=backend, threads=threads,
                              progress=not args.no_progress)

    from autosp.profiling.calibration import contention

    before = contention.snapshot()
    try:
        if env is not None:
            raw = launch.run_torchrun(env, cfg)
            if raw is None:  # not rank 0: rank 0 reports and writes
                return 0
        elif ranks == 1:
            raw = launch.run_single(cfg)
        else:
            raw = launch.run_spawned(ranks, cfg)
    except launch.WorkerFailed as err:
        raise AutospError(f"a calibration rank failed: {err}") from None

    busy = contention.report(before, contention.snapshot(), _cores(), own_children_counted=env is None)
    measurements_path = measurements_path_for(args.out) if args.out else None
    spec, sidecar = build_hardware_spec(
        raw, name=args.name, measurements_file=os.path.basename(measurements_path) if measurements_path else "",
        command=["autosp-calibrate", *(sys.argv[1:] if argv is None else argv)], contention=busy)
    bad = non_finite_fields(spec)
    if bad:
        raise AutospError(f"calibration produced invalid figures ({', '.join(bad)}); not writing a profile")
    elapsed = time.perf_counter() - started
    sidecar["elapsed_seconds"] = elapsed
    if args.out:
        from autosp.files import write_text

        # Sidecar first: a profile on disk always has its measurements next to it.
        write_text(measurements_path, json.dumps(sidecar, indent=1) + "\n", "--out (its measurements sidecar)")
        write_text(args.out, json.dumps(asdict(spec), indent=2) + "\n", "--out")

    if args.json:
        fits = [{k: e.get(k) for k in ("group_size", "scope", "collective", "supported", "fit")}
                for e in sidecar["collectives"]]
        print(json.dumps({"hardware": asdict(spec), "fingerprint": spec.fingerprint(),
                          "hardware_file": args.out, "measurements_file": measurements_path,
                          "elapsed_seconds": round(elapsed, 2), "environment": sidecar["environment"],
                          "derivation": sidecar["derivation"],
                          "collectives": fits}, indent=2))
    else:
        print(format_summary(spec, sidecar, compare, elapsed))
        print()
        if args.out:
            print(f"wrote {args.out} (fingerprint {spec.fingerprint()}) and {measurements_path}")
            print(f"use it: autosp-plan --hw {args.out} ...")
        else:
            print("nothing written: pass --out PATH to save the profile")
    return 0


if __name__ == "__main__":  # torchrun -m autosp.profiling.calibrate ...
    from autosp.cli import calibrate_main

    sys.exit(calibrate_main())


__all__ = ["DESCRIPTION", "EPILOG", "build_parser", "main"]
