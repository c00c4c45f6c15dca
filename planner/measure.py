"""Measured trials (``autosp-plan --measure K``): run the cost model's best candidates for a few real steps
with ``autosp-train`` on this machine and let the measurement choose the plan.

1. **What autosp-train accepts.** Plan knobs still being implemented in the compiler are rejected by
   ``autosp-train``. The planner does not hard-code which: it asks the compiler's own validation
   (:func:`autosp.compiler.api.resolve_candidate`, the check ``autosp.compile`` and ``autosp-train``
   run before anything else) in a subprocess, so the planner process never imports the compiler, torch
   or DeepSpeed. It probes each knob value of the search space (from the simplest candidate, alone and
   paired with each value of another knob), keeps the values the compiler accepts, and says which it
   excluded and why.
2. **Top-k by prediction.** The accepted sub-space is searched with the same cost model (exhaustively
   when small — every candidate probed, so rules that tie two knobs are exact —, else with the same
   Optuna search and its best few probed); its ``K`` best fitting accepted candidates are measured.
3. **Measure.** Each candidate is written as a plan file and run by ``autosp-train --plan`` for
   ``warmup + steps`` optimizer steps, launched with ``torchrun --standalone --nproc-per-node {world}``
   (world = the plan's ``dp x sp``; one process per device, or per CPU process on a CPU machine;
   ``--measure-launcher`` for several nodes or a scheduler). The first ``warmup`` steps (compilation)
   are dropped; the step time is the median of the rest, peak memory the largest the run reports
   (device memory on GPUs, host RSS on CPU).
4. **Choose.** The plan is the candidate with the highest measured tokens/s; the plan JSON records
   predicted and measured figures for every measured candidate (``search.measured``), and each
   measurement is recorded in the Optuna study as a trial (``source: measured``, user attributes
   ``measured_step_time_s``, ``measured_tokens_per_second``, ``measured_peak_memory_bytes``,
   ``measure_status``) next to the prediction that ranked it.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace

from autosp.cost_models.specs import Candidate
from autosp.errors import UsageError

DEFAULT_LAUNCHER = "{python} -m torch.distributed.run --standalone --nproc-per-node {world} -m autosp.compiler.train_cli"
BACKENDS = ("inductor", "aot_eager")
EXHAUSTIVE_LIMIT = 20_000
"""Accepted sub-spaces up to this size are searched exhaustively (exact top-k), larger ones with Optuna."""

PROBE = r"""
import json, sys
from autosp.cost_models.specs import Candidate
from autosp.errors import AutospError
from autosp.compiler.api import resolve_candidate
out = []
for data in json.load(sys.stdin):
    try:
        resolve_candidate(Candidate(**data))
        out.append(None)
    except AutospError as err:
        out.append(str(err))
    except Exception as err:
        out.append(f"{type(err).__name__}: {err}")
json.dump(out, sys.stdout)
"""


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


# -- what autosp-train accepts ------------------------------------------------------------------

def probe(candidates: list[Candidate]) -> list[str | None]:
    """For each candidate, None if the compiler accepts it, else its one-line reason (subprocess)."""
    if not candidates:
        return []
    payload = json.dumps([asdict(c) for c in candidates])
    try:
        out = subprocess.run([sys.executable, "-c", PROBE], input=payload, capture_output=True, text=True,
                             timeout=300)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise UsageError(f"--measure: cannot ask the compiler which knobs it accepts ({err})") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        raise UsageError(f"--measure: cannot ask the compiler which knobs it accepts ({last})")
    return json.loads(out.stdout)


def simplest(space, cand: Candidate) -> Candidate:
    """``cand`` with every knob that trades speed for memory off (the compiler's baseline)."""
    return space.make(**dict({k: getattr(cand, k) for k in space.KNOBS}, checkpointing="none", mlp_chunks=1,
                             loss_chunks=1, offload_activations=False, overlap="none", offload_optimizer=False))


def accepted_space(space, base: Candidate):
    """(the space restricted to the knob values autosp-train accepts, {knob: {value: reason}} rejected).

    A value is accepted when the compiler accepts ``base`` (simplest) with that knob changed, alone or
    together with any one value of another knob (so a rule that ties two knobs, such as "loss tiling
    not with ZeRO-3", excludes only the pair, not the value); each probe carries the companion a value
    needs to mean anything (overlap needs sp > 1, optimizer offload ZeRO >= 1, activation offload a
    checkpointing policy). The exact accepted set is then the job of :func:`top_k`."""
    choices = space.choices()
    knobs0 = {k: getattr(base, k) for k in space.KNOBS}

    def variant(changes: dict) -> Candidate:
        knobs = dict(knobs0, **changes)
        if knobs["overlap"] != "none" and knobs["sp"] == 1:
            knobs["sp"] = max(choices["sp"])
        if knobs["offload_optimizer"] and knobs["zero_stage"] == 0:
            knobs["zero_stage"] = max(1, max(choices["zero_stage"]))
        if knobs["offload_activations"] and knobs["checkpointing"] == "none":
            knobs["checkpointing"] = next((c for c in choices["checkpointing"] if c != "none"), "none")
        return space.make(**knobs)

    variants, where = [], []
    for name in space.KNOBS:
        for value in choices[name]:
            variants.append(variant({name: value}))
            where.append((name, value, True))
            for other in space.KNOBS:
                if other == name:
                    continue
                for second in choices[other]:
                    variants.append(variant({name: value, other: second}))
                    where.append((name, value, False))
    reasons = probe(variants)
    accepted = {name: [] for name in space.KNOBS}
    alone: dict[tuple, str] = {}
    first: dict[tuple, str] = {}
    for (name, value, single), why in zip(where, reasons):
        if why is None:
            if value not in accepted[name]:
                accepted[name].append(value)
        else:
            first.setdefault((name, value), why)
            if single:
                alone[(name, value)] = why
    rejected: dict[str, dict] = {}
    for name in space.KNOBS:
        accepted[name] = [v for v in choices[name] if v in accepted[name]]
        for value in choices[name]:
            if value not in accepted[name]:
                rejected.setdefault(name, {})[str(value)] = alone.get((name, value)) or first[(name, value)]
    missing = [name for name, values in accepted.items() if not values]
    if missing:
        detail = "; ".join(next(iter(rejected.get(n, {"?": "?"}).values())) for n in missing)
        raise UsageError(f"--measure: autosp-train accepts no value of {', '.join(missing)} ({detail})")
    return replace(space, **{name: tuple(values) for name, values in accepted.items()}), rejected


def top_k(space, evaluator, k: int, trials: int, seed: int) -> list:
    """The ``k`` best fitting (candidate, estimate) of ``space`` that the compiler accepts, best first
    (a small space: every candidate probed and scored, exact; a large one: Optuna, then its best few
    probed)."""
    from autosp.planner.evaluator import ranked_at

    seq = space.workload.seq_len
    if space.size() <= EXHAUSTIVE_LIMIT:
        candidates = list(space.candidates())
        accepted = [c for c, why in zip(candidates, probe(candidates)) if why is None]
        for cand in accepted:
            evaluator(cand, seq)
        pool = set(accepted)
        return [(c, e) for c, e in ranked_at(evaluator, seq) if e.fits and c in pool][:k]
    from autosp.planner.search import optuna_throughput

    optuna_throughput(space, evaluator, trials=trials, seed=seed, label="optuna (measurable)")
    ranked = [(c, e) for c, e in ranked_at(evaluator, seq) if e.fits and not space.reason(c)][: k * 4]
    verdicts = probe([c for c, _ in ranked])
    return [pair for pair, why in zip(ranked, verdicts) if why is None][:k]


# -- running autosp-train -----------------------------------------------------------------------

def launch_command(options: MeasureOptions, hardware, world: int) -> list[str]:
    template = options.launcher or DEFAULT_LAUNCHER
    nodes = max(1, hardware.nodes)
    text = template.format(python=shlex.quote(sys.executable), world=world, nodes=nodes,
                           per_node=max(1, world // nodes))
    return shlex.split(text)


def _last_error(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "autosp-train: error:" in line or "Error" in line.split(":")[0]:
            return line[:300]
    return (lines[-1][:300] if lines else "no output")


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
        why = _last_error(output) if code != 0 else "no step was logged after the warm-up"
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


def measure(space, evaluator, result, options: MeasureOptions, trials: int, seed: int, make_plan_for,
            worker: str = "local") -> Outcome:
    """Steps 1-4 of the module doc. ``make_plan_for(cand, est)`` builds the Plan file a run trains."""
    from autosp.planner.evaluator import Evaluator

    model_best = result.best
    base = simplest(space, model_best[0] if model_best else next(iter(space.candidates())))
    restricted, rejected = accepted_space(space, base)
    sub_evaluator = Evaluator(restricted)
    sub_evaluator.memo.update(evaluator.memo)  # same model, hardware and profile: reuse the scores
    chosen = top_k(restricted, sub_evaluator, options.k, trials, seed)
    if not chosen:
        raise UsageError("--measure: no candidate that autosp-train accepts fits the hardware "
                         f"(rejected knob values: {json.dumps(rejected)})")
    if rejected:
        _say("--measure: autosp-train rejects " + "; ".join(
            f"{name}={'/'.join(values)}" for name, values in rejected.items())
             + " today; measuring the best candidates without them")
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
             "accepted_by": "autosp.compiler.api.resolve_candidate (asked in a subprocess)",
             "rejected_knob_values": rejected, "measurable_space_size": restricted.size(),
             "cost_model_best": _model_best(model_best),
             "results": rows}
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
    from autosp.planner.api import _differences

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
        diff = _differences(cand, best[0])
        if row["status"] != "ok" or best_row["status"] != "ok":
            others.append((cand, est, f"measured run {row['status']} [{diff}]"))
            continue
        m, mb = row["measured"]["tokens_per_second"], best_row["measured"]["tokens_per_second"]
        p, pb = est.tokens_per_second, best[1].tokens_per_second
        others.append((cand, est, f"measured {100 * (1 - m / mb):.1f}% slower ({m:,.0f} vs {mb:,.0f} tokens/s); "
                                  f"predicted {100 * (p / pb - 1):+.1f}% [{diff}]"))
    return best, chosen_by, others


def _model_best(model_best) -> dict | None:
    """The cost model's choice over the whole space, and whether autosp-train could run it."""
    if model_best is None:
        return None
    cand, est = model_best
    why = probe([cand])[0]
    return {"short": cand.short(), "tokens_per_second": est.tokens_per_second, "measurable": why is None,
            **({"rejected_because": why} if why else {})}


def _record(study, space, cand, est, run: dict, worker: str) -> None:
    """The measurement as a trial of the search's study (value: the prediction that ranked it)."""
    if study is None:
        return
    from autosp.planner.search import _import_optuna
    from autosp.planner.study import add_trial

    extra = {"measure_status": run["status"], "predicted_step_time_s": est.time.step,
             "predicted_tokens_per_second": est.tokens_per_second, "predicted_peak_memory_bytes": est.memory.total}
    if run["status"] == "ok":
        extra.update({"measured_step_time_s": run["step_time_s"],
                      "measured_tokens_per_second": run["tokens_per_second"],
                      "measured_peak_memory_bytes": run["peak_memory_bytes"],
                      "measured_memory_kind": run["memory_kind"]})
    add_trial(_import_optuna(), study, space, cand, est, "measured", worker, extra)
