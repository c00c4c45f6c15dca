"""Run the check: price the rows, skip what is predicted not to fit, measure the rest until the deadline.

Everything is measured by the project's harness (:mod:`studies.measure`): one spawned rank (nccl on the
GPU, gloo on the CPU dry run) runs the rows one after another, each compiled, warmed up, measured for
memory over one step and timed over a few; rows print as they finish and the files are rewritten after
each, so a run cut short still leaves every finished row behind.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from studies.gpu_check import report, rows as rows_mod

__all__ = ["CheckOptions", "run_check"]

GIB = 1024 ** 3
RESULTS = Path(__file__).resolve().parents[1] / "results"


@dataclass(frozen=True)
class CheckOptions:
    out: Path
    time_budget: float = 420.0
    dry_run: bool = False
    hw: str | None = None            # catalog name or calibrated hardware file; None: h200 (GPU) / this CPU's profile
    rows: tuple = ()                 # row names; empty: all, in ROWS order
    warmup: int = 1                  # steps before measuring (the first compiles)
    steps: int | None = None         # timed steps (the median is reported); None: 3 on the GPU, 1 dry run
    backend: str | None = None       # None: inductor on the GPU, aot_eager on the dry run
    min_row_seconds: float | None = None  # do not start a row with less left; None: 45 s GPU / 3 s dry run
    finish_seconds: float = 15.0     # kept back from the budget for stopping the ranks and writing the files
    kernel_breakdown: tuple = ()     # row names that profile one more step: device time by kernel kind


def _default_hw(dry_run: bool) -> str:
    cpu_profile = RESULTS / "calibrated-cpux1.json"
    return str(cpu_profile) if dry_run and cpu_profile.exists() else "h200"


def _model(dry_run: bool):
    if dry_run:
        return rows_mod.DRY_RUN_MODEL
    from autosp.cost_models.catalog.models import resolve_model

    return resolve_model(rows_mod.GPU_MODEL)


def _configs(opts: CheckOptions, selected, model, backend: str):
    from studies.measure import RunConfig

    out = []
    for r in selected:
        seq = max(32, r.seq_len // rows_mod.DRY_RUN_SEQ_DIVISOR) if opts.dry_run else r.seq_len
        out.append(RunConfig(model=model, seq_len=seq, sp=1, dtype="bf16", warmup=opts.warmup, steps=opts.steps or 3,
                             backend=backend, label=r.name, kernel_breakdown=r.name in opts.kernel_breakdown,
                             **r.knob_dict()))
    return out


def _fit_problem(cfg, hw, device_bytes: float | None) -> str | None:
    """Why the cost model says this row cannot run here, or None."""
    from autosp.cost_models import estimate

    try:
        est = estimate(cfg.model, hw, cfg.workload(), cfg.candidate())
    except ValueError as err:
        return f"the cost model rejects it: {err}"
    total = est.memory.total
    if not est.fits:
        return f"predicted {total / GIB:.1f} GiB > {hw.name}'s usable {est.capacity_bytes / GIB:.1f} GiB"
    if device_bytes is not None and total > device_bytes:
        return f"predicted {total / GIB:.1f} GiB > this GPU's {device_bytes / GIB:.1f} GiB"
    return None


def _cuda_device():
    """(name, total bytes) of GPU 0, or None without CUDA. Asked of nvidia-smi when it is there, so that this
    process holds no CUDA context on the GPU the rank measures (device memory in use is device-wide)."""
    import shutil
    import subprocess

    import torch

    if not torch.cuda.is_available():
        return None
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--id=0", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60)
        try:
            name, mib = out.stdout.strip().rsplit(",", 1)
            return name.strip(), float(mib) * 2**20
        except ValueError:
            pass
    props = torch.cuda.get_device_properties(0)
    return props.name, float(props.total_memory)


def _attention_kernels(timeout: float = 240.0) -> list[str]:
    """The lines of :mod:`studies.gpu_check.attention` (which attention kernel runs), from a child process: this
    process keeps no CUDA context."""
    import subprocess

    try:
        out = subprocess.run([sys.executable, "-m", "studies.gpu_check.attention"], capture_output=True, text=True,
                             timeout=timeout, cwd=Path(__file__).resolve().parents[2])
    except subprocess.TimeoutExpired:
        return [f"attention kernels: the probe did not finish in {timeout:.0f} s"]
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return [f"attention kernels: the probe failed (exit {out.returncode}): {last}"]
    return out.stdout.strip().splitlines()


def _split_by_fit(selected, configs, hw, gpu) -> tuple[list, list]:
    """The rows predicted to fit the device, with their configs, and the others, each with the reason."""
    runnable, skipped = [], []
    for r, cfg in zip(selected, configs):
        why = _fit_problem(cfg, hw, gpu[1] if gpu else None)
        if why is None:
            runnable.append((r, cfg))
        else:
            skipped.append({"name": r.name, "seq_len": cfg.seq_len, "knobs": r.knob_dict(), "reason": why})
    return runnable, skipped


def _title(model, hw, gpu, dry_run: bool, backend: str, time_budget: float) -> str:
    mode = "CPU dry run" if dry_run else f"GPU: {gpu[0]}"
    n = model.n_params()
    size = f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"
    return (f"autosp GPU check ({mode}); model {model.name} ({size} params), bf16, SP=1, "
            f"backend {backend}; predicted with {hw.name}; budget {time_budget:.0f} s")


def _attention_lines(dry_run: bool) -> list[str]:
    if dry_run:  # no CUDA here: nothing to select, and no CUDA context to keep out of this process
        from studies.gpu_check.attention import probe_lines

        return probe_lines()
    return _attention_kernels()


def _start_cpu_adam_build(opts: CheckOptions, runnable, dry_run: bool):
    """On a GPU with an offloaded-optimizer row: DeepSpeed's CPU Adam built in the background while the other
    rows run; returns (the rows' prepare hook, the build's process), or (None, None)."""
    if dry_run or not any(cfg.offload_optimizer for _, cfg in runnable):
        return None, None
    from studies.gpu_check import cpu_adam

    opts.out.mkdir(parents=True, exist_ok=True)
    status_path = str(opts.out / "cpu_adam_build.json")
    if os.path.exists(status_path):
        os.remove(status_path)
    builder = cpu_adam.start_build(status_path, str(opts.out / "cpu_adam_build.log"))
    return functools.partial(cpu_adam.require_cpu_adam, status_path), builder


def _finish_cpu_adam_build(builder, opts: CheckOptions, summary: dict, say) -> None:
    """Stops the background build if it still runs and records how it ended."""
    if builder.poll() is None:
        builder.kill()  # the build this check started, by its own handle
    builder.wait()
    from studies.gpu_check import cpu_adam

    built = summary["cpu_adam_build"] = cpu_adam.status(str(opts.out / "cpu_adam_build.json"))
    say("DeepSpeed CPU Adam build (background): " + ("unfinished, stopped" if built is None else
        f"{'ok' if built['ok'] else 'failed'} in {built['seconds']:.0f} s {built['error']}".rstrip()))


def run_check(opts: CheckOptions, stream=sys.stdout) -> int:
    """Run the check; returns the exit status (0: every row that ran is ok, 1: some row failed)."""
    from autosp.cost_models.catalog.hardware import resolve_hardware
    from studies.measure import measure_many

    t0 = time.time()
    deadline = t0 + opts.time_budget - opts.finish_seconds

    def say(text: str = "") -> None:
        print(text, file=stream, flush=True)

    hw = resolve_hardware(opts.hw) if opts.hw else None  # bad input fails here, before any output
    selected = rows_mod.select(list(opts.rows))
    gpu = None if opts.dry_run else _cuda_device()
    dry_run = opts.dry_run or gpu is None
    hw = hw or resolve_hardware(_default_hw(dry_run))
    if not opts.dry_run and gpu is None:
        say("no CUDA device: running the CPU dry run (the same rows at tiny sizes)")
    model = _model(dry_run)
    backend = opts.backend or ("aot_eager" if dry_run else "inductor")
    min_row = opts.min_row_seconds if opts.min_row_seconds is not None else (3.0 if dry_run else 45.0)
    opts = dataclasses.replace(opts, dry_run=dry_run, steps=opts.steps or (1 if dry_run else 3))
    runnable, skipped = _split_by_fit(selected, _configs(opts, selected, model, backend), hw, gpu)

    title = _title(model, hw, gpu, dry_run, backend, opts.time_budget)
    say(title)
    if dry_run:
        say("(dry run: tiny sizes test the code path end to end; its ratios say nothing about a GPU)")
    attention_lines = _attention_lines(dry_run)
    for line in attention_lines:
        say(line)
    for s in skipped:
        say(f"skip {s['name']} (S={s['seq_len']}): {s['reason']}")
    missing = rows_mod.missing_knobs([r for r, _ in runnable])
    if missing:
        say("knobs not exercised by the rows run: " + ", ".join(
            k if v == ("non-default",) else f"{k}={'/'.join(map(str, v))}" for k, v in missing.items()))
    unit = "MiB" if dry_run else "GiB"
    say(report.header(unit))
    say("-" * len(report.header(unit)))

    entries: list = []
    summary = {"check": "studies.gpu_check", "mode": "dry-run" if dry_run else "cuda",
               "device": gpu[0] if gpu else "cpu", "model": dataclasses.asdict(model), "hardware": hw.name,
               "backend": backend, "time_budget": opts.time_budget, "warmup": opts.warmup, "steps": opts.steps,
               "skipped": skipped, "knobs_not_exercised": missing,
               "knobs_exercised": {k: sorted(map(str, v)) for k, v in rows_mod.exercised(r for r, _ in runnable).items()},
               "not_at_sp1": rows_mod.NOT_AT_SP1, "attention_kernels": attention_lines, "rows": entries,
               "harness_rows": []}

    def write(final: bool = False) -> None:
        summary["elapsed_seconds"] = time.time() - t0
        summary["complete"] = final
        notes = [f"skipped {s['name']} (S={s['seq_len']}): {s['reason']}" for s in skipped]
        report.write_outputs(opts.out, summary, "\n".join([report.format_table(entries, title, unit)] + notes))

    def on_row(index: int, harness_row: dict) -> None:
        e = report.entry(runnable[index][0], harness_row)
        entries.append(e)
        summary["harness_rows"].append(harness_row)
        say(report.format_line(e, unit))
        write()

    prepare, builder = _start_cpu_adam_build(opts, runnable, dry_run)
    write()
    results = []
    try:
        results = measure_many([cfg for _, cfg in runnable], hw, device="cpu" if dry_run else "cuda",
                               on_row=on_row, deadline=deadline, min_row_seconds=min_row, prepare=prepare)
    except Exception as err:  # noqa: BLE001 - a rank died outside a row (NCCL, CUDA init): keep what finished
        lines = str(err).strip().splitlines()
        summary["failure"] = f"{type(err).__name__}: {lines[-1] if lines else ''}"
        say(f"the measuring rank failed: {summary['failure']}")
    finally:
        if builder is not None:
            _finish_cpu_adam_build(builder, opts, summary, say)
    for (r, _), harness_row in zip(runnable, results):
        if harness_row["status"] == "not_run":
            e = report.entry(r, harness_row)
            entries.append(e)
            say(report.format_line(e, unit))
    write(final=True)
    failed = [e for e in entries if e["status"] in ("error", "not_implemented")]
    done = sum(e["status"] == "ok" for e in entries)
    say(f"{done} of {len(selected)} rows measured in {time.time() - t0:.0f} s; "
        f"{len(failed)} failed, {len(skipped)} skipped as predicted not to fit, "
        f"{sum(e['status'] == 'not_run' for e in entries)} not run (time budget); "
        f"table: {opts.out / 'gpu_check.txt'}")
    return 1 if failed or "failure" in summary else 0
