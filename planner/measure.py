"""Measured trials (``autosp-plan --measure K``): run the cost model's best candidates for a few real steps
with ``autosp-train`` on this machine and let the measurement choose the plan.

1. **Top-k by prediction.** The ``K`` best fitting candidates of the space by the cost model: exact when
   the space is small (every candidate scored, up to :data:`EXHAUSTIVE_LIMIT`), else the best the search
   scored. (The compiler builds every knob of the search space; a candidate ``autosp-train`` refused would
   show as a failed run, never as the winner.)
2. **Measure.** Each candidate is written as a plan file and run by ``autosp-train --plan`` for
   ``warmup + steps`` optimizer steps, launched with ``torchrun --standalone --nproc-per-node {world}``
   (world = the plan's ``dp x sp``; one process per device, or per CPU process on a CPU machine;
   ``--measure-launcher`` for several nodes or a scheduler). The first ``warmup`` steps (compilation)
   are dropped; the step time is the median of the rest, peak memory the largest the run reports
   (device memory on GPUs, host RSS on CPU).
3. **Choose.** The plan is the candidate with the highest measured tokens/s; the plan JSON records
   predicted and measured figures for every measured candidate (``search.measured``), and each
   measurement is recorded in the Optuna study as a trial (``source: measured``, user attributes
   ``measured_step_time_s``, ``measured_tokens_per_second``, ``measured_peak_memory_bytes``,
   ``measure_status``) next to the prediction that ranked it.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

from autosp.cost_models.specs import Candidate
from autosp.errors import UsageError

DEFAULT_LAUNCHER = "{python} -m torch.distributed.run --standalone --nproc-per-node {world} -m autosp.compiler.train_cli"
BACKENDS = ("inductor", "aot_eager")
EXHAUSTIVE_LIMIT = 20_000
"""Spaces up to this size are scored whole for an exact top-k; larger ones give the best the search scored."""

@dataclass(frozen=True)
class MeasureOptions:
    k: int = 3
    steps: int = 3
    warmup: int = 1
    backend: str = "inductor"
    launcher: str | None = None
    timeout_s: float = 900.0
    keep_dir: str | None = None  # write plans and logs here (else a temporary directory, removed)

    def check(self, hardware) -> "MeasureOptions":
        for name, value, least in (("--measure", self.k, 1), ("--measure-steps", self.steps, 1),
                                   ("--measure-warmup", self.warmup, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise UsageError(f"{name} must be an integer >= {least}, got {value!r}")
        if self.backend not in BACKENDS:
            raise UsageError(f"--measure-backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if not isinstance(self.timeout_s, (int, float)) or not math.isfinite(self.timeout_s) or self.timeout_s <= 0:
            raise UsageError(f"--measure-timeout must be a positive number of seconds, got {self.timeout_s!r}")
        if self.keep_dir is not None and (os.path.lexists(self.keep_dir) and not os.path.isdir(self.keep_dir)):
            raise UsageError(f"--measure-dir {self.keep_dir}: exists and is not a directory")
        if self.launcher is None and hardware.nodes > 1:
            raise UsageError(f"--measure on {hardware.nodes} nodes needs --measure-launcher (the default launcher "
                             "starts processes on this machine only)")
        if self.launcher is not None:
            try:
                self.launcher.format(python="p", world=1, nodes=1, per_node=1)
            except (KeyError, IndexError, ValueError) as err:
                raise UsageError(f"--measure-launcher: unknown placeholder {err} (use {{python}}, {{world}}, "
                                 "{nodes}, {per_node})") from None
        return self


def _say(message: str) -> None:
    from autosp.messages import one_line  # a failed run's last line can be a launcher's whole report

    print(f"autosp-plan: {one_line(message)}", file=sys.stderr, flush=True)


# -- the candidates to measure ------------------------------------------------------------------

def top_k(space, evaluator, k: int) -> list:
    """The ``k`` best fitting (candidate, estimate) of ``space`` by the cost model, best first: exact for a
    space of at most EXHAUSTIVE_LIMIT candidates (all scored), else among those the search scored."""
    from autosp.planner.search.evaluator import ranked_at

    seq = space.workload.seq_len
    if space.size() <= EXHAUSTIVE_LIMIT:
        for cand in space.candidates():
            evaluator(cand, seq)
    return [(c, e) for c, e in ranked_at(evaluator, seq) if e.fits and not space.reason(c)][:k]


# -- running autosp-train -----------------------------------------------------------------------

def launch_command(options: MeasureOptions, hardware, world: int) -> list[str]:
    template = options.launcher or DEFAULT_LAUNCHER
    nodes = max(1, hardware.nodes)
    text = template.format(python=shlex.quote(sys.executable), world=world, nodes=nodes,
                           per_node=max(1, world // nodes))
    return shlex.split(text)


_TRAIN_ERROR = re.compile(r"^autosp-train(?: \[rank \d+\])?: (?:internal )?error")
_EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s*)?[\w.]*(?:Error|Exception)\b.*:")
_EXIT_CODE = re.compile(r"^exitcode\s*:\s*(-?\d+)")


def failure_reason(text: str) -> str:
    """The root cause of a failed autosp-train launch, from its combined output.

    torchrun ends every failure with its own ``ChildFailedError`` banner, so the last line that looks like an
    error is never the cause: prefer what autosp-train itself said (the first rank to speak), then the last
    exception that is not the launcher's, then the exit code the launcher's summary names (a negative one is
    the signal that killed the rank, e.g. -9 when the host ran out of memory)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if _TRAIN_ERROR.match(line):
            return line[:400]
    for line in reversed(lines):
        if _EXCEPTION.match(line) and "ChildFailedError" not in line and "torch.distributed.elastic" not in line:
            return line[:400]
    for line in lines:
        code = _EXIT_CODE.match(line)
        if code and int(code.group(1)) < 0:
            return f"a rank was killed by signal {-int(code.group(1))}"
        if code:
            return f"a rank exited with code {code.group(1)} without an error message"
    return lines[-1][:400] if lines else "no output"


def run_one(plan, options: MeasureOptions, workdir: str, index: int) -> dict:
    """Run ``plan`` with autosp-train; {'status', and measured figures when status is 'ok'}."""
    from autosp.planner.plan import save_plan

    c = plan.candidate
    world = c.sp * c.dp
    plan_path = os.path.join(workdir, f"candidate{index}.json")
    log_path = os.path.join(workdir, f"candidate{index}.steps.jsonl")
    out_path = os.path.join(workdir, f"candidate{index}.out")
    save_plan(plan, plan_path)
    cmd = launch_command(options, plan.hardware, world) + [
        "--plan", plan_path, "--steps", str(options.warmup + options.steps), "--backend", options.backend,
        "--log-json", log_path]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    started = time.perf_counter()
    with open(out_path, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=options.timeout_s)
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=10)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
            return {"status": f"timeout after {options.timeout_s:.0f} s", "command": shlex.join(cmd)}
    wall = time.perf_counter() - started
    with open(out_path, encoding="utf-8", errors="replace") as f:
        output = f.read()
    rows = []
    if os.path.exists(log_path):
        with open(log_path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    measured = rows[options.warmup:]
    if code != 0 or not measured:
        why = failure_reason(output) if code != 0 else "no step was logged after the warm-up"
        return {"status": f"failed (exit {code}): {why}", "command": shlex.join(cmd), "wall_s": round(wall, 2)}
    step = statistics.median(r["step_time_s"] for r in measured)
    tokens_per_step = measured[0]["tokens_per_s"] * measured[0]["step_time_s"]
    peak_gib = max(r["peak_memory_gib"] for r in measured)
    return {"status": "ok", "step_time_s": step, "tokens_per_second": tokens_per_step / step,
            "peak_memory_bytes": peak_gib * 2**30, "memory_kind": measured[0].get("memory", "GiB"),
            "steps_measured": len(measured), "step_times_s": [round(r["step_time_s"], 4) for r in measured],
            "wall_s": round(wall, 2), "command": shlex.join(cmd)}


# -- the whole measured search ------------------------------------------------------------------

@dataclass
class Outcome:
    chosen: tuple  # (Candidate, Estimate)
    table: dict    # search.measured
    others: list   # [(Candidate, Estimate, lost_because)]


def measure(space, evaluator, result, options: MeasureOptions, make_plan_for, worker: str = "local") -> Outcome:
    """Steps 1-3 of the module doc. ``make_plan_for(cand, est)`` builds the Plan file a run trains."""
    chosen = top_k(space, evaluator, options.k)
    if not chosen:
        raise UsageError("--measure: no candidate fits the hardware")
    workdir_ctx = tempfile.TemporaryDirectory(prefix="autosp-measure-") if options.keep_dir is None else None
    workdir = options.keep_dir or workdir_ctx.name
    os.makedirs(workdir, exist_ok=True)
    rows = []
    try:
        for i, (cand, est) in enumerate(chosen):
            _say(f"--measure {i + 1}/{len(chosen)}: {cand.short()} on {cand.sp * cand.dp} processes, "
                 f"{options.warmup}+{options.steps} steps ...")
            run = run_one(make_plan_for(cand, est), options, workdir, i)
            shown = (f"{run['tokens_per_second']:,.0f} tokens/s measured, {est.tokens_per_second:,.0f} predicted"
                     if run["status"] == "ok" else run["status"])
            _say(f"--measure {i + 1}/{len(chosen)}: {shown}")
            rows.append({"rank_predicted": i + 1, "candidate": asdict(cand), "short": cand.short(),
                         "predicted": {"step_time_s": est.time.step, "tokens_per_second": est.tokens_per_second,
                                       "peak_memory_bytes": est.memory.total},
                         "measured": {k: v for k, v in run.items() if k not in ("status", "command")}
                         if run["status"] == "ok" else None,
                         "status": run["status"], "command": run["command"]})
            _record(result.study, space, cand, est, run, worker)
    finally:
        if workdir_ctx is not None:
            workdir_ctx.cleanup()
    best, chosen_by, others = choose(rows, chosen)
    if chosen_by != "measurement":
        _say("warning: --measure: every measured run failed; the plan is the best measurable prediction")
    spread = spread_note(rows, best[0])
    if spread:
        _say(f"note: --measure: {spread}")
    table = {"k": options.k, "warmup_steps": options.warmup, "steps": options.steps, "backend": options.backend,
             "launcher": options.launcher or DEFAULT_LAUNCHER, "chosen_by": chosen_by,
             "cost_model_best": _model_best(result.best), "results": rows}
    if spread:
        table["note"] = spread
    return Outcome(chosen=best, table=table, others=others)


def spread_note(rows: list[dict], winner: Candidate) -> str | None:
    """A warning when the winner's margin is within the step-to-step spread of the measurements (then
    another run may well pick another candidate), else None."""
    ok = [r for r in rows if r["status"] == "ok" and len(r["measured"].get("step_times_s", [])) > 1]

    def span(r):
        m = r["measured"]
        tokens = m["tokens_per_second"] * m["step_time_s"]
        return tokens / max(m["step_times_s"]), tokens / min(m["step_times_s"])

    win = next((r for r in ok if Candidate(**r["candidate"]) == winner), None)
    if win is None:
        return None
    low = span(win)[0]
    close = [r["short"] for r in ok if r is not win and span(r)[1] >= low]
    if not close:
        return None
    return (f"the winner's margin over {', '.join(close)} is within the step-to-step spread of the measurements; "
            "more --measure-steps (on a quieter machine) would make the choice firmer")


def choose(rows: list[dict], pairs: list) -> tuple:
    """(the (candidate, estimate) with the most measured tokens/s, how it was chosen, the others with why
    they lost). ``rows[i]`` is the measurement of ``pairs[i]`` (predicted order); a failed run never
    wins; ties go to the better prediction; if every run failed, the best prediction stands."""
    from autosp.planner.explain import differences

    ok = [(row, pair) for row, pair in zip(rows, pairs) if row["status"] == "ok"]
    if ok:
        best_row, best = max(ok, key=lambda item: (item[0]["measured"]["tokens_per_second"],
                                                   -item[0]["rank_predicted"]))
        chosen_by = "measurement"
    else:
        best_row, best = rows[0], pairs[0]
        chosen_by = "prediction (every measured run failed)"
    others = []
    for row, (cand, est) in zip(rows, pairs):
        if cand == best[0]:
            continue
        diff = differences(cand, best[0])
        if row["status"] != "ok" or best_row["status"] != "ok":
            others.append((cand, est, f"measured run {row['status']} [{diff}]"))
            continue
        m, mb = row["measured"]["tokens_per_second"], best_row["measured"]["tokens_per_second"]
        p, pb = est.tokens_per_second, best[1].tokens_per_second
        others.append((cand, est, f"measured {100 * (1 - m / mb):.1f}% slower ({m:,.0f} vs {mb:,.0f} tokens/s); "
                                  f"predicted {100 * (p / pb - 1):+.1f}% [{diff}]"))
    return best, chosen_by, others


def _model_best(model_best) -> dict | None:
    """The cost model's choice over the whole space (what the measurement is compared with)."""
    if model_best is None:
        return None
    cand, est = model_best
    return {"short": cand.short(), "tokens_per_second": est.tokens_per_second}


def _record(study, space, cand, est, run: dict, worker: str) -> None:
    """The measurement as a trial of the search's study (value: the prediction that ranked it)."""
    if study is None:
        return
    from autosp.planner.search.optuna_search import _import_optuna
    from autosp.planner.search.optuna_study import add_trial

    extra = {"measure_status": run["status"], "predicted_step_time_s": est.time.step,
             "predicted_tokens_per_second": est.tokens_per_second, "predicted_peak_memory_bytes": est.memory.total}
    if run["status"] == "ok":
        extra.update({"measured_step_time_s": run["step_time_s"],
                      "measured_tokens_per_second": run["tokens_per_second"],
                      "measured_peak_memory_bytes": run["peak_memory_bytes"],
                      "measured_memory_kind": run["memory_kind"]})
    add_trial(_import_optuna(), study, space, cand, est, "measured", worker, extra)


__all__ = ["BACKENDS", "DEFAULT_LAUNCHER", "EXHAUSTIVE_LIMIT", "MeasureOptions", "Outcome", "choose",
           "launch_command", "measure", "run_one", "spread_note", "top_k"]
