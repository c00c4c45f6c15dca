"""The planner prices non-preset models with their graph-derived profile (issue 5, deliverable 1).

- ``--model config.json`` traces the model once (progress on stderr), plans with the graph profile (the
  plan's estimate is ``estimate(..., profile=load_or_build(config))`` for the chosen candidate) and caches
  the profile: a second plan in a fresh process reads it and never imports torch;
- ``--model package.module:function`` (an nn.Module factory) does the same;
- plan-cache keys include the profile fingerprint: the same ModelSpec with another profile is a miss;
- presets keep the analytic formulas (no ``model_profile`` in the plan; tests/planner/test_cli.py checks that
  planning a preset never imports torch).
"""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from autosp.cost_models import estimate
from autosp.profiling.graph import load_or_build
from autosp.cost_models.profile import Elems
from autosp.errors import UsageError
from autosp.planner.api import plan_for
from autosp.planner.request import PlanRequest
from autosp.cost_models.catalog.hardware import resolve_hardware

TESTS = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file()) / "tests"  # graph_profile_models.py
CONFIG = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 448, "num_attention_heads": 8,
          "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 3, "vocab_size": 700,
          "max_position_embeddings": 65536, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
          "hidden_act": "silu", "rope_theta": 250000.0}


@pytest.fixture
def cache_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOSP_CACHE_DIR", str(tmp_path / "profiles"))
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(CONFIG))
    return tmp_path, str(path)


def test_config_json_plans_with_its_graph_profile_and_the_cached_profile_needs_no_torch(cache_dirs, capfd):
    tmp_path, config = cache_dirs
    plan = plan_for(PlanRequest(model=config, ctx="16k", hw="h100x8", trials=12), cache=str(tmp_path / "plans.sqlite"))
    err = capfd.readouterr().err
    assert "tracing this config once: ~15 s" in err and "FakeTensorMode" in err  # progress while tracing
    profile = load_or_build(config)  # now a cache hit
    assert plan.search["model_profile"] == f"graph {profile.fingerprint}"
    spec = plan.model
    assert (spec.n_layers, spec.hidden, spec.n_heads, spec.n_kv_heads, spec.ffn_hidden, spec.vocab) == (3, 128, 8, 2,
                                                                                                         448, 700)
    assert spec.rope_theta == 250000.0 and spec.max_position == 65536  # from the config, not the trace
    # the plan's numbers are the graph profile's, not the formulas'
    again = estimate(spec, plan.hardware, plan.workload, plan.candidate, profile=profile)
    assert plan.estimate == again
    assert plan.estimate.memory != estimate(spec, plan.hardware, plan.workload, plan.candidate).memory
    assert capfd.readouterr().err == ""  # nothing traced the second time

    code = ("import sys; from autosp.cli import plan_main; "
            f"rc = plan_main(['--model', {config!r}, '--ctx', '16k', '--hw', 'h100x8', '--trials', '12', '--json', "
            "'--no-cache']); "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed', 'transformers')); "
            "print('HEAVY', heavy, file=sys.stderr); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, AUTOSP_CACHE_DIR=str(tmp_path / "profiles")))
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stderr and "tracing" not in out.stderr
    second = json.loads(out.stdout)
    assert second["search"]["model_profile"] == plan.search["model_profile"]
    assert second["candidate"] == json.loads(plan.to_json())["candidate"]


def test_plan_cache_key_includes_the_profile_fingerprint(cache_dirs):
    tmp_path, config = cache_dirs
    profile = load_or_build(config, quiet=True)
    hw = resolve_hardware("h100x8")

    def planned(model, ctx="16k"):
        return plan_for(PlanRequest(model=model, ctx=ctx, hw=hw, trials=8), cache=str(tmp_path / "plans.sqlite"))

    assert planned(profile).search["cache"] == "miss"
    assert planned(profile).search["cache"] == "hit"
    # same ModelSpec, different measured costs: a different answer, so a different key
    heavier = replace(profile, fingerprint="0" * 20,
                      kept_mlp=tuple(Elems(e.other * 2, e.kv, e.fixed) for e in profile.kept_mlp))
    assert heavier.model_spec() == profile.model_spec()
    other = planned(heavier)
    assert other.search["cache"] == "miss" and other.search["model_profile"] == "graph " + "0" * 20
    # a preset is priced by the formulas and says nothing about a profile
    preset = planned("llama-3.2-1b", "8k")
    assert "model_profile" not in preset.search


def test_entry_point_plans_with_its_graph_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOSP_CACHE_DIR", str(tmp_path / "profiles"))
    monkeypatch.syspath_prepend(str(TESTS))
    plan = plan_for(PlanRequest(model="graph_profile_models:tiny_lm", ctx="8k", hw="h100x8", trials=8), cache=None)
    profile = load_or_build("graph_profile_models:tiny_lm", quiet=True)
    assert plan.search["model_profile"] == f"graph {profile.fingerprint}"
    assert plan.model.n_heads == 3 and plan.model.tied_embeddings and not plan.model.gated_mlp
    assert plan.candidate.sp in (1,)  # 3 heads: no SP degree of 8 GPUs but 1 divides them
    assert plan.estimate == estimate(plan.model, plan.hardware, plan.workload, plan.candidate, profile=profile)
    with pytest.raises(UsageError, match="cannot find the module"):
        plan_for(PlanRequest(model="no_such_module_here:build", ctx="8k", hw="h100x8"), cache=None)
