"""autosp-plan check / select: the CI commands (docs/ci.md), exit codes and JSON, on real plans."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autosp.cli import plan_main
from autosp.contract.plan import load_plan

REQ = ["--model", "llama-3.2-1b", "--ctx", "32k", "--hw", "h100x8"]
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """A plan and its DeepSpeed config, as a repository would commit them (and a shared plan cache)."""
    d = tmp_path_factory.mktemp("ci")
    cache = str(d / "cache.sqlite")
    assert plan_main([*REQ, "--cache", cache, "--plan-out", str(d / "plan.json"), "--ds-config", str(d / "ds.json"),
                      "--json"]) == 0
    return d, cache


def check(capsys, *args):
    capsys.readouterr()
    code = plan_main(["check", *args, "--json"])
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def _edit(src: Path, dst: Path, fn) -> str:
    data = json.loads(src.read_text())
    fn(data)
    dst.write_text(json.dumps(data))
    return str(dst)


def test_fresh_plan_and_its_deepspeed_config_pass(committed, capsys):
    d, cache = committed
    for name, kind in (("plan.json", "plan"), ("ds.json", "deepspeed-config")):
        code, r, err = check(capsys, str(d / name), "--cache", cache)
        assert code == 0 and r["status"] == "pass" and r["exit_code"] == 0 and r["kind"] == kind, r
        assert r["now"]["fits"] and r["gap"] == pytest.approx(0.0, abs=1e-9) and r["reasons"] == []
        assert r["best"]["search"]["cache"] == "hit"  # CI re-checks cost no search with a shared cache
        assert err == ""


def test_a_plan_priced_for_another_compile_backend_is_checked_as_it_was_made(tmp_path, capsys):
    """--compile-backend eager (an untiled loss priced op by op) travels in the plan and the DeepSpeed config, so
    a check re-prices it the same way and its re-plan command asks for it again."""
    req = ["--model", "llama-3.2-1b", "--ctx", "32k", "--hw", "h200", "--no-cache", "--compile-backend", "eager"]
    assert plan_main([*req, "--plan-out", str(tmp_path / "p.json"), "--ds-config", str(tmp_path / "ds.json"),
                      "--json"]) == 0
    assert load_plan(str(tmp_path / "p.json")).workload.compile_backend == "eager"
    for name in ("p.json", "ds.json"):
        code, r, _ = check(capsys, str(tmp_path / name), "--no-cache")
        assert code == 0 and r["status"] == "pass" and r["changes"] == [], r
    code, r, _ = check(capsys, str(tmp_path / "ds.json"), "--no-cache", "--tolerance", "0%", "--hw", "h100")
    assert "--compile-backend eager" in json.dumps(r)


def test_infeasible_when_the_knobs_are_invalid_or_do_not_fit(committed, capsys):
    d, cache = committed
    code, r, _ = check(capsys, str(d / "plan.json"), "--hw", "h100x4", "--cache", cache)
    assert code == 3 and r["status"] == "infeasible" and not r["now"]["valid"]
    assert any("hardware: h100x8 -> h100x4" in c for c in r["changes"])
    code, r, _ = check(capsys, str(d / "ds.json"), "--ctx", "4M", "--cache", cache)
    assert code == 3 and r["now"]["valid"] and not r["now"]["fits"]
    assert "does not fit" in r["reasons"][0] and "--ctx 4000000" in r["replan"]


def _variant(src: Path, dst: Path, **knobs) -> tuple[str, object]:
    """The committed plan with other knobs, priced by the cost model (as if planned that way)."""
    from dataclasses import replace

    from autosp.cost_models import estimate
    from autosp.contract.plan import save_plan

    plan = load_plan(src)
    cand = replace(plan.candidate, **knobs)
    est = estimate(plan.model, plan.hardware, plan.workload, cand)
    save_plan(replace(plan, candidate=cand, estimate=est), dst)
    return str(dst), est


def test_stale_beyond_tolerance_then_within_a_wider_one(committed, capsys, tmp_path):
    d, cache = committed
    best = load_plan(d / "plan.json").estimate.tokens_per_second
    path, est = _variant(d / "plan.json", tmp_path / "slow.json", checkpointing="full")  # recompute: slower
    gap = 1 - est.tokens_per_second / best
    assert est.fits and gap > 0.05
    code, r, _ = check(capsys, path, "--cache", cache)
    assert code == 4 and r["status"] == "stale" and r["now"]["fits"]
    assert r["gap"] == pytest.approx(gap, rel=1e-9) and "beyond the 5.0% tolerance" in r["reasons"][0]
    code, r, _ = check(capsys, path, "--cache", cache, "--tolerance", f"{100 * gap + 1:.0f}%")
    assert code == 0 and r["status"] == "pass"
    best = tmp_path / "best.json"
    code, r, _ = check(capsys, path, "--cache", cache, "--best-out", str(best))
    assert code == 4 and load_plan(best).candidate.short() == r["best"]["short"]


def test_stale_when_made_by_another_cost_model_unless_ignored(committed, capsys, tmp_path):
    d, cache = committed

    def older(data):
        data["search"]["cost_model_version"] = "0123456789abcdef"
        data["estimate"]["time"]["step"] *= 1.1  # what the older cost model predicted

    path = _edit(d / "plan.json", tmp_path / "old.json", older)
    code, r, _ = check(capsys, path, "--cache", cache)
    assert code == 4 and any("cost model: 0123456789abcdef -> " in c for c in r["changes"])
    assert any(c.startswith("prediction: step time") for c in r["changes"])
    assert "produced by another version" in r["reasons"][0]
    code, r, _ = check(capsys, path, "--cache", cache, "--ignore-versions")
    assert code == 0 and any("ignored (--ignore-versions)" in n for n in r["notes"])
    # a DeepSpeed config from before the version stamps cannot vouch for its cost model
    ds = _edit(d / "ds.json", tmp_path / "old-ds.json", lambda c: c["autosp"].pop("cost_model_version"))
    code, r, _ = check(capsys, ds, "--cache", cache)
    assert code == 4 and any("predates version stamps" in c for c in r["changes"])


def test_stale_when_checked_against_other_hardware(committed, capsys):
    d, cache = committed
    code, r, _ = check(capsys, str(d / "plan.json"), "--hw", "h200x8", "--cache", cache)
    assert code == 4 and "made for another target: hardware: h100x8 -> h200x8" in " ".join(r["reasons"])
    assert "--hw h200x8" in r["replan"]


@pytest.mark.parametrize("args,needle", [
    (["/nonexistent/plan.json"], "cannot read"),
    (["PLAN", "--tolerance", "five"], "--tolerance"),
    (["NOTAPLAN"], "neither an autosp plan"),
])
def test_bad_input_is_exit_2(committed, tmp_path, args, needle):
    d, _ = committed
    junk = tmp_path / "junk.json"
    junk.write_text('{"hello": 1}')
    args = [str(d / "plan.json") if a == "PLAN" else str(junk) if a == "NOTAPLAN" else a for a in args]
    cmd = [str(Path(sys.executable).with_name("autosp-plan")), "check", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and needle in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_select_picks_the_fastest_that_still_fits(committed, capsys, tmp_path):
    d, cache = committed
    slower, _ = _variant(d / "plan.json", tmp_path / "a-slower.json", checkpointing="full")
    too_big, est = _variant(d / "plan.json", tmp_path / "c-too-big.json", sp=1, dp=8, micro_batch=8, overlap="none",
                            zero_stage=0)
    assert not est.fits
    files = [slower, str(d / "ds.json"), too_big]
    out_plan, out_ds = tmp_path / "selected.json", tmp_path / "selected-ds.json"
    capsys.readouterr()
    code = plan_main(["select", "--candidates", *files, "--plan-out", str(out_plan), "--ds-config", str(out_ds),
                      "--tolerance", "5%", "--cache", cache, "--json"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and r["status"] == "selected" and r["selected"]["file"] == str(d / "ds.json")
    assert [row["fits"] for row in r["candidates"]] == [True, True, False]
    chosen = load_plan(out_plan)
    assert chosen.candidate.short() == r["selected"]["short"] and chosen.search["strategy"] == "select"
    assert json.loads(out_ds.read_text())["autosp"]["sp"] == chosen.candidate.sp
    # nothing fits a context 100x longer: exit 3, nothing written
    capsys.readouterr()
    assert plan_main(["select", "--candidates", str(tmp_path), "--ctx", "3.2M", "--cache", cache, "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["selected"] is None


def test_example_workflow_runs_the_documented_commands():
    import yaml

    flow = yaml.safe_load((ROOT / "docs" / "ci" / "autosp-plan-check.yml").read_text())
    steps = [s.get("run", "") for job in flow["jobs"].values() for s in job["steps"]]
    text = "\n".join(steps)
    assert "autosp-plan check" in text and "--json" in text and "autosp-plan select" in text
    assert (ROOT / "docs" / "ci.md").read_text().count("autosp-plan check") >= 3


def test_check_and_select_are_python_functions(committed):
    """The logic behind autosp-plan check/select, called without argparse: the same verdicts as the CLI."""
    from autosp.errors import UsageError
    from autosp.planner import check as ci

    d, cache = committed
    plan = str(d / "plan.json")
    result = ci.check(plan, cache=cache)
    assert result["exit_code"] == 0 and result["status"] == "pass"
    moved = ci.check(plan, ctx="16k", cache=cache)  # a target override is a PlanRequest field
    assert moved["exit_code"] == 4 and any(c.startswith("workload:") for c in moved["changes"])
    assert ci.check(plan, hw="h100x16", cache=cache)["exit_code"] == 3  # its sp x dp no longer matches the GPUs
    with pytest.raises(UsageError, match="cannot override"):
        ci.check(plan, objective="max-ctx", cache=cache)
    picked = ci.select([plan, str(d / "ds.json")], cache=cache)
    assert picked["exit_code"] == 0 and picked["selected"]["file"] == plan
