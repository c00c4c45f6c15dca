"""Distributed search: planner workers sharing one Optuna study (SQLite file and a real PostgreSQL),
and measured trials run with autosp-train on CPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("autosp-plan")
REQUEST = ["--model", "llama-3.2-1b", "--ctx", "16k", "--hw", "h100x4", "--json"]


def _cmd(*args):
    return ([str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "autosp.planner.cli.main"]) + list(args)


def _run(*args, timeout=300):
    return subprocess.run(_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def _study(storage, name):
    import optuna

    return optuna.load_study(study_name=name, storage=storage)


def _best_feasible(study):
    import optuna

    done = [t for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)) if t.user_attrs.get("fits")]
    top = max(t.value for t in done)
    return top, [t.user_attrs["candidate"] for t in done if t.value == top]


def _two_workers_then_collect(storage):
    name = "shared-test"
    workers = [subprocess.Popen(_cmd(*REQUEST, "--storage", storage, "--study-name", name, "--trials", "4",
                                     "--worker-id", f"w{i}"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (1, 2)]
    outs = [w.communicate(timeout=300) for w in workers]
    for w, (out, err) in zip(workers, outs):
        assert w.returncode == 0, err
    from autosp.planner.api import plan_for
    from autosp.planner.request import PlanRequest

    # the plan of the whole study, no new sampler trials
    plan = json.loads(plan_for(PlanRequest(model="llama-3.2-1b", ctx="16k", hw="h100x4", trials=0), storage=storage,
                               study_name=name).to_json())
    study = _study(storage, name)
    trials = study.get_trials()
    sampled = {t.user_attrs.get("worker") for t in trials if t.user_attrs.get("source") in ("sampler", "enqueued")}
    assert sampled == {"w1", "w2"}  # both workers ran trials in the one study
    per_worker = {w: sum(1 for t in trials if t.user_attrs.get("worker") == w
                         and t.user_attrs.get("source") in ("sampler", "enqueued")) for w in ("w1", "w2")}
    assert per_worker == {"w1": 4, "w2": 4}
    top, best = _best_feasible(study)
    assert plan["candidate"] in best and plan["estimate"]["tokens_per_second"] == pytest.approx(top, rel=1e-12)
    info = plan["search"]["study"]
    assert info["study_name"] == name and info["workers"] == ["w1", "w2"] and plan["search"]["trials"] == 0
    assert info["trials_in_study"] == len([t for t in trials if t.state.name == "COMPLETE"])
    # each worker answered from the study as it stood when it finished: never better than the final answer
    for out, _ in outs:
        assert json.loads(out)["estimate"]["tokens_per_second"] <= top * (1 + 1e-12)
    return plan


@pytest.mark.slow
def test_two_workers_share_a_study_in_sqlite(tmp_path):
    from autosp.errors import UsageError
    from autosp.planner.api import plan_for
    from autosp.planner.request import PlanRequest

    storage = f"sqlite:///{tmp_path}/study.db"
    _two_workers_then_collect(storage)
    # a worker with another request (here: another context) may not join this study
    with pytest.raises(UsageError, match="belongs to another request"):
        plan_for(PlanRequest(model="llama-3.2-1b", ctx="8k", hw="h100x4", trials=2), storage=storage,
                 study_name="shared-test")


@pytest.mark.slow
def test_two_workers_share_a_study_in_postgresql(pg_url):
    _two_workers_then_collect(pg_url)


def test_storage_usage_errors(tmp_path):
    for args, needle in ((("--storage", "nosuchdialect://x"), "--storage"),
                         (("--storage", f"sqlite:///{tmp_path}/s.db", "--objective", "max-ctx"), "throughput"),
                         (("--study-name", "x"), "--storage"),
                         (("--trials", "0"), "--trials"),
                         # collecting from a study no worker has run yet (fresh storage, mistyped name)
                         (("--storage", f"sqlite:///{tmp_path}/empty.db", "--trials", "0"), "no finished trials")):
        out = _run(*REQUEST, *args)
        assert out.returncode == 2 and needle in out.stderr and out.stderr.count("\n") == 1, out.stderr


# -- measured trials ----------------------------------------------------------------------------

EXAMPLES = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file()) / "docs" / "examples"


def _tiny():
    from autosp.contract.specs import ModelSpec

    return ModelSpec(name="tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_hidden=128,
                     vocab=128)


@pytest.mark.slow
def test_measure_runs_a_ring_plan_end_to_end(tmp_path, monkeypatch):
    """--measure on a 2-D space: a one-head model on the 2-process CPU cluster with one sequence per step can only
    use both processes as a ring of 2 (Ulysses needs a head per rank), so every candidate the measurement runs is
    a ring plan; autosp-train trains it (torchrun, gloo) and the measurement chooses it."""
    from autosp.contract.specs import ModelSpec
    from autosp.planner.api import plan_for
    from autosp.planner.request import PlanRequest
    from autosp.planner.measure import MeasureOptions

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    one_head = ModelSpec(name="tiny-1head", n_layers=2, hidden=32, n_heads=1, n_kv_heads=1, head_dim=32,
                         ffn_hidden=64, vocab=128)
    # cpu2 with a slow host link, so that no candidate offloads the optimizer (its first use builds DeepSpeed's CPU
    # Adam, minutes on a small machine, which has nothing to do with the ring)
    hw = tmp_path / "cpu2-slow-host.toml"
    hw.write_text((EXAMPLES / "cpu2.toml").read_text().replace("host_bandwidth = 5.0e9", "host_bandwidth = 1.0e7"))
    options = MeasureOptions(k=1, steps=1, warmup=1, backend="aot_eager", timeout_s=300,
                             keep_dir=str(tmp_path / "runs"))
    # 502 tokens: padded to a multiple of lcm(sp, 2 x ring) = 4 (504) for the zigzag chunks
    plan = plan_for(PlanRequest(model=one_head, ctx="502", hw=str(hw), dtype="fp32", global_batch=1, trials=8),
                    measure=options)
    table = plan.search["measured"]
    assert table["chosen_by"] == "measurement", table
    assert table["results"] and all(r["status"] == "ok" for r in table["results"]), table["results"]
    assert all(r["candidate"]["sp"] == 2 and r["candidate"]["ring"] == 2 for r in table["results"])
    assert (plan.candidate.sp, plan.candidate.ring) == (2, 2)
    out = (tmp_path / "runs" / "candidate0.out").read_text()
    assert "sp2(u1xr2)" in out, out  # autosp-train ran the ring
    steps = [json.loads(line) for line in (tmp_path / "runs" / "candidate0.steps.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and abs(steps[0]["loss"] - math.log(128)) < 0.2  # a fresh model's loss, ~ln(vocab)


@pytest.mark.slow
def test_measured_trial_on_cpu_is_recorded_in_the_study_and_the_plan(tmp_path, monkeypatch):
    """--measure 1 on the 2-process CPU cluster: the cost model's best candidate is trained for
    real (torchrun, gloo, world = dp x sp), its measured step time and peak memory land in the plan and
    in the shared study next to the prediction."""
    import optuna

    from autosp.compiler.api import resolve_candidate
    from autosp.contract.specs import Candidate
    from autosp.planner.api import plan_for
    from autosp.planner.request import PlanRequest
    from autosp.planner.measure import MeasureOptions

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    storage = f"sqlite:///{tmp_path}/study.db"
    options = MeasureOptions(k=1, steps=1, warmup=1, backend="aot_eager", timeout_s=300,
                             keep_dir=str(tmp_path / "runs"))
    plan = plan_for(PlanRequest(model=_tiny(), ctx="512", hw=str(EXAMPLES / "cpu2.toml"), dtype="fp32",
                                global_batch=2, trials=8),
                    storage=storage, study_name="measured", worker="m", measure=options)
    table = plan.search["measured"]
    out = tmp_path / "runs" / "candidate0.out"  # what autosp-train printed: shown when the run failed
    assert table["chosen_by"] == "measurement" and len(table["results"]) == 1, (
        table["results"], out.read_text()[-4000:] if out.exists() else "no output file")
    row = table["results"][0]
    assert row["status"] == "ok", row
    assert Candidate(**row["candidate"]) == plan.candidate
    measured, predicted = row["measured"], row["predicted"]
    assert measured["step_time_s"] > 0 and measured["tokens_per_second"] > 0 and measured["peak_memory_bytes"] > 0
    assert measured["tokens_per_second"] == pytest.approx(2 * 512 / measured["step_time_s"], rel=1e-6)
    assert predicted["tokens_per_second"] == pytest.approx(plan.estimate.tokens_per_second)
    assert "--nproc-per-node 2" in row["command"] and (tmp_path / "runs" / "candidate0.steps.jsonl").exists()
    resolve_candidate(plan.candidate)  # what was measured is a plan the compiler builds
    # the measurement is a trial of the study, next to its prediction
    study = optuna.load_study(study_name="measured", storage=storage)
    trials = [t for t in study.get_trials() if t.user_attrs.get("source") == "measured"]
    assert len(trials) == 1
    attrs = trials[0].user_attrs
    assert attrs["measure_status"] == "ok" and attrs["candidate"] == row["candidate"]
    assert attrs["measured_step_time_s"] == pytest.approx(measured["step_time_s"])
    assert attrs["measured_peak_memory_bytes"] == pytest.approx(measured["peak_memory_bytes"])
    assert trials[0].value == pytest.approx(predicted["tokens_per_second"])


def test_the_measurement_decides_and_a_failed_run_never_wins():
    from dataclasses import replace

    from autosp.contract.specs import Candidate
    from autosp.planner.measure import choose

    a = Candidate(sp=1, dp=2, zero_stage=0)
    b = replace(a, zero_stage=1)
    c = replace(a, zero_stage=2)

    class Est:  # the two fields choose() reads of an Estimate
        def __init__(self, tps):
            self.tokens_per_second = tps

    pairs = [(a, Est(300.0)), (b, Est(290.0)), (c, Est(280.0))]  # predicted order

    def row(i, status, tps=None):
        return {"rank_predicted": i, "status": status,
                "measured": {"tokens_per_second": tps} if status == "ok" else None}

    best, how, others = choose([row(1, "ok", 100.0), row(2, "ok", 150.0), row(3, "failed (exit 1): OOM")], pairs)
    assert best[0] == b and how == "measurement"
    why = {cand: text for cand, _, text in others}
    assert why[a].startswith("measured 33.3% slower (100 vs 150 tokens/s); predicted +3.4%")
    assert why[c].startswith("measured run failed (exit 1): OOM")
    best, _, _ = choose([row(1, "ok", 150.0), row(2, "ok", 150.0), row(3, "ok", 10.0)], pairs)
    assert best[0] == a  # a tie goes to the better prediction
    best, how, _ = choose([row(1, "timeout after 9 s"), row(2, "failed (exit 1): x"), row(3, "failed (exit 1): y")],
                          pairs)
    assert best[0] == a and how.startswith("prediction")


TORCHRUN_TAIL = """\
E1203 07:01:02.123000 4242 torch/distributed/elastic/multiprocessing/api.py:900] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
autosp.compiler.train_cli FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  exitcode  : {code} (pid: 4243)
  error_file: <N/A>
"""


def test_a_failed_launch_is_explained_by_its_root_cause_not_by_torchrun_banner():
    """torchrun's ChildFailedError banner comes last in every failed launch; the reason a measured run failed
    must be what the rank said (or the signal that killed it), never that banner."""
    from autosp.planner.measure import failure_reason

    said = ("autosp-train [rank 1]: internal error: RuntimeError: pinned memory is not available (at x.py:3; "
            "input: --plan p.json). This is a bug in autosp\n")
    assert failure_reason(said + TORCHRUN_TAIL.format(code=1)).startswith("autosp-train [rank 1]: internal error")
    raw = "[rank0]: Traceback (most recent call last):\n[rank0]: ValueError: bad shard\n"
    assert failure_reason(raw + TORCHRUN_TAIL.format(code=1)) == "[rank0]: ValueError: bad shard"
    assert failure_reason(TORCHRUN_TAIL.format(code=-9)) == "a rank was killed by signal 9"
    assert "ChildFailedError" not in failure_reason(TORCHRUN_TAIL.format(code=1))
    assert failure_reason("") == "no output"


def test_a_sqlite_study_transaction_takes_the_write_lock_at_begin(tmp_path):
    """Optuna claims an enqueued warm start by reading WAITING and writing RUNNING in one transaction, under a
    FOR UPDATE that SQLite ignores: only a transaction that holds the file's write lock from its BEGIN keeps two
    workers from claiming (and running) the same trial. While one study connection's transaction is open, no
    other writer gets in."""
    import sqlite3

    import optuna

    from autosp.planner.search.optuna_study import open_storage

    storage = open_storage(optuna, f"sqlite:///{tmp_path}/study.db")
    with storage.engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")  # a read-only statement: the transaction it began still locks
        other = sqlite3.connect(tmp_path / "study.db", timeout=0.2, isolation_level=None)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
        other.close()
