"""The planner with 2-D sequence parallelism: U x R searched by default (SP groups spanning nodes included), the
longest context growing past the head count, the report and configs carrying the split, Optuna against the
exhaustive search on ring-heavy requests, and the cross-node flags."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from autosp.contract.specs import ModelSpec, Workload
from autosp.planner.api import plan_for
from autosp.planner.request import PlanRequest
from autosp.planner.ds_config import deepspeed_config
from autosp.planner.search.evaluator import CTX_GRANULE, Evaluator, rank_key
from autosp.planner.search.exhaustive import exhaustive_throughput, longest_context
from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.cost_models.catalog.models import resolve_model
from autosp.planner.cli.report import render
from autosp.planner.search.optuna_search import optuna_max_ctx, optuna_throughput
from autosp.planner.search.space import build_space

NARROW = ModelSpec("narrow", 16, 2048, 8, 2, 256, 8192, 32000)   # 8 query heads, 2 KV heads


@pytest.fixture(scope="module")
def llama_max_ctx():
    """Llama-3.1-8B's longest context on 4 and 8 nodes of H100s, no extra flags (as autosp-plan runs it)."""
    return {gpus: plan_for(PlanRequest(model="llama-3.1-8b", hw=f"h100x{gpus}", objective="max-ctx"))
            for gpus in (32, 64)}


def test_max_ctx_grows_with_gpus_past_the_head_count(llama_max_ctx):
    p32, p64 = llama_max_ctx[32], llama_max_ctx[64]
    # 32 GPUs: an SP group of 32 across 4 nodes (ALST trained 15.5M tokens there with Ulysses SP=32)
    assert p32.candidate.sp == 32 and p32.workload.seq_len >= 15_500_000
    # 64 GPUs: Ulysses alone stops at 32 heads; the ring takes sp to 64 and the context about doubles
    assert p64.candidate.sp == 64 > p64.model.n_heads and p64.candidate.ring >= 2
    assert p64.workload.seq_len > 1.9 * p32.workload.seq_len
    assert p64.estimate.fits and p64.search["allow_cross_node_sp"] is True


def test_report_shows_the_split_and_why(llama_max_ctx):
    plan = llama_max_ctx[64]
    c = plan.candidate
    text = render(plan)
    assert f"sp = 64 = Ulysses {c.ulysses} × ring {c.ring}" in text
    assert "why this split" in text and "head count (32 query heads < sp = 64)" in text
    assert "hidden under blockwise attention" in text and "ring P2P" in text
    ascii_text = render(plan, encoding="ascii")
    assert f"Ulysses {c.ulysses} x ring {c.ring}" in ascii_text
    # the alternatives that lost name the ring when it is what differs
    assert any("ring " in r.lost_because for r in plan.runner_ups)
    # the plan JSON and the DeepSpeed config carry the split
    data = json.loads(plan.to_json())
    assert data["candidate"]["ring"] == c.ring
    section = deepspeed_config(plan)["autosp"]
    assert (section["sp"], section["ulysses"], section["ring"]) == (64, c.ulysses, c.ring)


def test_forbidding_cross_node_sp_keeps_every_group_in_a_node(llama_max_ctx):
    inside = plan_for(PlanRequest(model="llama-3.1-8b", hw="h100x32", objective="max-ctx",
                                  allow_cross_node_sp=False))
    assert inside.candidate.sp <= 8 and inside.search["allow_cross_node_sp"] is False
    assert inside.workload.seq_len < 0.5 * llama_max_ctx[32].workload.seq_len


@pytest.mark.slow  # exhaustive searches of ring-heavy spaces (20-35 s each on a busy 2-core machine)
@pytest.mark.parametrize("model,hw,ctx,seed", [
    (NARROW, "h100x32", 4 << 20, 0),                         # 8 heads: sp past 8 only through the ring
    ("llama-3.2-1b", "h100x64", 16 << 20, 2),                # 32 heads on 64 GPUs
])
def test_optuna_reaches_the_exhaustive_optimum_on_ring_heavy_requests(model, hw, ctx, seed):
    spec = model if isinstance(model, ModelSpec) else resolve_model(model)
    space = build_space(spec, resolve_hardware(hw), Workload(ctx))
    # fewer dial values than the real space, every SP layout (the exhaustive reference must stay quick)
    space = replace(space, zero_stage=(1, 3), checkpointing=("selective", "full"), mlp_chunks=(1, 8),
                    loss_chunks=(1, 16), micro_batch=(1, 2))
    assert len(set(space.layouts())) > len(space.sp)   # rings are part of the space
    full = exhaustive_throughput(space, Evaluator(space))
    best_cand, best = full.best
    assert all(rank_key(best_cand, best) <= rank_key(c, e) for c, e in full.ranked)
    assert any(c.ring > 1 for c, e in full.ranked[:20] if e.fits)
    found = optuna_throughput(space, Evaluator(space), seed=seed)
    assert found.best[1].tokens_per_second >= 0.99 * best.tokens_per_second, (found.best[0].short(), best_cand.short())


@pytest.mark.slow  # the exhaustive longest context of a ring space: minutes on 2 cores
def test_optuna_max_ctx_matches_the_exhaustive_longest_context_with_a_ring():
    space = build_space(NARROW, resolve_hardware("h100x16"), Workload(CTX_GRANULE))
    exact, records = longest_context(space, Evaluator(space))
    found = optuna_max_ctx(space, Evaluator(space), trials=60, seed=0)
    assert found.seq_len >= 0.99 * exact
    assert max(records, key=records.get).sp == 16 > NARROW.n_heads   # only a ring reaches sp = 16
    assert found.best[0].ring > 1


SCRIPT = Path(sys.executable).with_name("autosp-plan")


def _plan_cli(*args):
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "autosp.planner.cli.main"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # max-ctx searches on large clusters (~30 s on a busy 2-core machine)
def test_cross_node_flags():
    base = ("--model", "llama-3.2-1b", "--ctx", "64k", "--hw", "h100x16", "--no-cache", "--json", "--trials", "10")
    old = _plan_cli(*base, "--allow-cross-node-sp")   # old scripts keep working; the flag changes nothing
    assert old.returncode == 0, old.stderr
    assert json.loads(old.stdout)["search"]["allow_cross_node_sp"] is True
    inside = _plan_cli(*base, "--no-cross-node-sp")
    assert inside.returncode == 0, inside.stderr
    plan = json.loads(inside.stdout)
    assert plan["search"]["allow_cross_node_sp"] is False and plan["candidate"]["sp"] <= 8
    both = _plan_cli(*base, "--no-cross-node-sp", "--allow-cross-node-sp")
    assert both.returncode == 2 and both.stdout == "" and len(both.stderr.strip().splitlines()) == 1
    assert "not allowed with" in both.stderr


def test_planning_a_2d_plan_never_imports_torch():
    code = ("import sys; from autosp.cli import plan_main; "
            "rc = plan_main(['--model', 'llama-3.1-8b', '--objective', 'max-ctx', '--hw', 'h100x64', '--json', "
            "'--no-cache']); "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed', 'transformers')); "
            "print('HEAVY', heavy, file=sys.stderr); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stderr and '"ring": ' in out.stdout


def test_a_2d_plan_and_its_deepspeed_config_pass_the_ci_check(tmp_path, capsys):
    """`autosp-plan check` re-prices the committed 2-D plan and its DeepSpeed config (which carries the ring)."""
    from autosp.cli import plan_main

    cache, plan, ds = str(tmp_path / "cache.sqlite"), tmp_path / "plan.json", tmp_path / "ds.json"
    assert plan_main(["--model", "llama-3.1-8b", "--objective", "max-ctx", "--hw", "h100x64", "--cache", cache,
                      "--plan-out", str(plan), "--ds-config", str(ds), "--json"]) == 0
    assert json.loads(ds.read_text())["autosp"]["ring"] > 1
    for path in (plan, ds):
        capsys.readouterr()
        code = plan_main(["check", str(path), "--cache", cache, "--json"])
        report = json.loads(capsys.readouterr().out)
        assert code == 0 and report["status"] == "pass" and report["now"]["fits"], report
