"""``autosp-plan sweep``: lists in, one row per request, table / JSON / CSV out, the PNG written atomically, and the
quick search it uses checked against the exhaustive one."""

import contextlib
import csv
import io
import json
import sys

import pytest

from autosp import cli
from autosp.planner.api import plan_for
from autosp.planner.search.fast import undialed
from autosp.planner.request import PlanRequest, resolve
from autosp.planner.search.space import build_space
from autosp.planner.sweep import COLUMNS

SMALL = ["--model", "llama-3.2-1b,llama-3.1-8b", "--hw", "h100x1", "h100x2", "--ctx", "8k,64k", "--no-cache"]


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.plan_main(["sweep", *argv])
    return code, out.getvalue(), err.getvalue()


def test_the_table_has_one_row_per_request_in_order():
    code, out, err = _run(SMALL)
    assert code == 0, err
    rows = [ln for ln in out.splitlines() if ln.startswith("llama")]
    assert [ln.split()[:2] for ln in rows] == [[m, h] for m in ("llama-3.2-1b", "llama-3.1-8b")
                                              for h in ("h100x1", "h100x2") for _ in range(2)]
    assert "8 requests (8 planned" in out and "search: fast" in out


def test_json_and_csv_carry_the_same_rows_as_the_plans():
    code, out, _ = _run([*SMALL, "--json"])
    assert code == 0
    data = json.loads(out)
    assert data["settings"]["requests"] == 8 and len(data["rows"]) == 8
    assert all(set(r) == set(COLUMNS) for r in data["rows"])
    first = data["rows"][0]
    plan = plan_for(PlanRequest(model="llama-3.2-1b", hw="h100x1", ctx="8k", search="fast"))
    assert first["plan"] == plan.candidate.short()
    assert first["tokens_per_second"] == pytest.approx(plan.estimate.tokens_per_second, rel=1e-6)
    code, out, _ = _run([*SMALL, "--csv"])
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(rows) == 8 and list(rows[0]) == list(COLUMNS)
    assert [r["plan"] for r in rows] == [r["plan"] for r in data["rows"]]


def test_rows_without_a_plan_say_why_and_the_sweep_still_succeeds():
    code, out, _ = _run(["--model", "llama-3.1-70b", "--hw", "h100x1,h100x8", "--ctx", "8k", "--fix", "sp=8",
                         "--no-cache", "--json"])
    assert code == 0
    a, b = json.loads(out)["rows"]
    assert a["status"] == "invalid" and "sp=8" in a["message"]
    assert b["status"] == "ok" and b["plan"].startswith("sp8 ")
    code, out, _ = _run(["--model", "llama-3.1-405b", "--hw", "h100x1", "--ctx", "8k", "--no-cache", "--json"])
    (row,) = json.loads(out)["rows"]
    assert code == 0 and row["status"] == "no fit" and "no plan fits" in row["message"]


def test_max_ctx_sweep_and_its_png_written_through_autosp_files(tmp_path, monkeypatch):
    import autosp.files

    written = []
    real = autosp.files.write_bytes

    def spy(path, data, flag=""):
        written.append((str(path), flag))
        real(path, data, flag)

    monkeypatch.setattr(autosp.files, "write_bytes", spy)
    png = tmp_path / "sub" / "max_ctx.png"
    code, out, err = _run(["--model", "llama-3.2-1b", "--hw", "h100x1,h100x2", "--objective", "max-ctx",
                           "--no-cache", "--plot", str(png)])
    assert code == 0, err
    assert written == [(str(png), "--plot")]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in png.parent.iterdir()] == ["max_ctx.png"]  # no temporary file left
    assert "longest ctx" in out and f"Wrote {png}" in out


def test_a_missing_matplotlib_is_one_line_before_any_search(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    png = tmp_path / "x.png"
    code, out, err = _run([*SMALL, "--plot", str(png)])
    assert code == 2 and out == "" and "pip install -e '.[plot]'" in err and not png.exists()


@pytest.mark.parametrize("argv, needle", [
    (["--model", "llama-3.2-1b", "--hw", "h100x1"], "needs --ctx"),
    (["--model", "llama-3.2-1b,,x", "--hw", "h100x1", "--ctx", "8k"], "empty item"),
    (["--model", "lama-3.2-1b", "--hw", "h100x1", "--ctx", "8k"], "did you mean"),
    (["--model", "llama-3.2-1b", "--hw", "h100x1", "--ctx", "8k,abc"], "--ctx"),
    (["--model", "llama-3.2-1b", "--hw", "h100x1", "--ctx", "8k", "--plot", "x.svg"], "ending in .png"),
    (["--model", "llama-3.2-1b", "--hw", "h100x1", "--ctx", "8k", "--jobs", "0"], "--jobs"),
    (["--model", "llama-3.2-1b", "--hw", "h100x1", "--ctx", "8k", "--fix", "zero=3"], "not a plan knob"),
])
def test_bad_input_is_one_line_exit_2(argv, needle):
    code, out, err = _run(argv)
    assert code == 2 and out == "" and needle in err and len(err.strip().splitlines()) == 1


def test_the_progress_bar_is_the_planners(monkeypatch):
    from autosp.planner import sweep
    from autosp.planner.search import evaluator

    seen = []

    class Bar:
        def update(self, n=1):
            seen.append(n)

        def close(self):
            seen.append("closed")

    monkeypatch.setattr(evaluator, "progress_bar", lambda total, desc: seen.append((total, desc)) or Bar())
    reqs = sweep.requests(PlanRequest(model="llama-3.2-1b", hw="h100x1", ctx="8k", search="fast"),
                          ["llama-3.2-1b"], ["h100x1"], ["8k", "16k"])
    sweep.run(reqs)
    assert seen == [(2, "sweep"), 1, 1, "closed"]


def test_parallel_jobs_give_the_same_rows():
    from autosp.planner import sweep

    reqs = sweep.requests(PlanRequest(model="llama-3.2-1b", hw="h100x1", ctx="8k", search="fast"),
                          ["llama-3.2-1b"], ["h100x1", "h100x2"], ["8k", "32k"])
    one, two = sweep.run(reqs, jobs=1), sweep.run(reqs, jobs=2)
    strip = [{k: v for k, v in r.items() if k != "wall_s"} for r in one]
    assert strip == [{k: v for k, v in r.items() if k != "wall_s"} for r in two]


@pytest.mark.slow  # three exhaustive searches, ~10 s of CPU
@pytest.mark.parametrize("model, hw, ctx", [("llama-3.2-1b", "h100x2", "32k"), ("llama-3.1-8b", "h100x2", "256k"),
                                            ("mistral-7b", "h100x2", "128k")])
def test_the_fast_search_finds_the_exhaustive_optimum_here(model, hw, ctx):
    fast = plan_for(PlanRequest(model=model, hw=hw, ctx=ctx, search="fast"))
    best = plan_for(PlanRequest(model=model, hw=hw, ctx=ctx, search="exhaustive"))
    assert fast.estimate.tokens_per_second >= 0.99 * best.estimate.tokens_per_second
    assert fast.search["evaluations"] < best.search["evaluations"] / 2  # it prices cells of the space in bulk


@pytest.mark.slow  # exhaustive max-ctx searches
def test_fast_max_ctx_matches_the_exhaustive_longest_context():
    for hw in ("h100x1", "h100x2"):
        fast = plan_for(PlanRequest(model="llama-3.2-1b", hw=hw, objective="max-ctx", search="fast"))
        best = plan_for(PlanRequest(model="llama-3.2-1b", hw=hw, objective="max-ctx", search="exhaustive"))
        assert fast.workload.seq_len == best.workload.seq_len


def test_the_undialed_point_bounds_its_family():
    """The property the branch and bound relies on: no dial setting is faster than the family's undialed point."""
    from autosp.planner.search.evaluator import Evaluator

    r = resolve(PlanRequest(model="llama-3.2-1b", hw="h100x2", ctx="64k"))
    space = build_space(r.model, r.hardware, r.workload)
    ev = Evaluator(space)
    checked = 0
    for cand in space.candidates():
        per = space.per_layout_choices(cand.sp, cand.ring)
        top = undialed(space, per, sp=cand.sp, ring=cand.ring, zero_stage=cand.zero_stage,
                       micro_batch=cand.micro_batch, checkpointing=cand.checkpointing, overlap=cand.overlap)
        assert ev(cand).tokens_per_second <= ev(top).tokens_per_second * (1 + 1e-9), cand.short()
        checked += 1
    assert checked > 1000
