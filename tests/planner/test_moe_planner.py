"""Planning mixture-of-experts, Gemma and tied-embedding models (issue 22): ep is searched for MoE models only,
plans pick ep > 1 where it pays, tied models tile their loss at ZeRO-3, unsupported architectures are refused in
one line with exit 2 before anything is built."""

import json
import subprocess
import sys

import pytest

from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.cost_models.catalog.models import resolve_model
from autosp.contract.specs import Workload
from autosp.planner.api import plan_for
from autosp.planner.request import PlanRequest
from autosp.planner.ds_config import deepspeed_config
from autosp.planner.search.space import build_space, ep_choices


def test_ep_is_searched_for_moe_models_only():
    hw = resolve_hardware("h100x8")
    assert ep_choices(resolve_model("llama"), hw) == (1,)
    assert ep_choices(resolve_model("qwen3-30b-a3b"), hw) == (1, 2, 4, 8)
    assert ep_choices(resolve_model("mixtral-8x7b"), resolve_hardware("h100x8", nodes=4)) == (1, 2, 4, 8)
    dense = build_space(resolve_model("llama"), hw, Workload(131072))
    moe = build_space(resolve_model("qwen3-30b-a3b"), hw, Workload(131072))
    assert dense.ep == (1,) and moe.ep == (1, 2, 4, 8)
    assert moe.size() == 4 * build_space(resolve_model("qwen3-4b"), hw, Workload(131072)).size()
    cands = list(build_space(resolve_model("mixtral-8x7b"), hw, Workload(8192)).candidates())
    assert {c.ep for c in cands} == {1, 2, 4, 8}


@pytest.mark.parametrize("model, pins", [("mixtral-8x7b", ()), ("qwen3-30b-a3b", (("offload_optimizer", False),))])
def test_moe_plans_use_expert_parallelism_below_zero3(model, pins):
    # below ZeRO-3 the experts' states are replicated unless ep shards them: 46.7B / 30.5B do not fit otherwise
    # (30.5B does with ZeRO-Offload at ep 1, the exhaustive search's optimum there: so its optimizer stays here)
    plan = plan_for(PlanRequest(model=model, ctx="128k", hw="h100x8", search="fast", fix=(("zero_stage", 2), *pins)))
    assert plan.candidate.ep > 1 and plan.estimate.fits
    assert plan.estimate.memory.expert_states > 0 and plan.estimate.time.expert_comm > 0
    ds = deepspeed_config(plan)
    assert ds["autosp"]["ep"] == plan.candidate.ep
    assert f"ep{plan.candidate.ep}" in plan.candidate.short()


def test_pinned_ep_prices_each_degree():
    plans = {ep: plan_for(PlanRequest(model="qwen3-30b-a3b", ctx="128k", hw="h100x8", search="fast",
                                      fix=(("ep", ep),))) for ep in (1, 8)}
    assert plans[1].candidate.ep == 1 and plans[8].candidate.ep == 8
    assert plans[1].estimate.time.expert_comm == 0 < plans[8].estimate.time.expert_comm
    from autosp.errors import UsageError

    with pytest.raises(UsageError, match="needs a mixture-of-experts model"):
        plan_for(PlanRequest(model="llama", ctx="32k", hw="h100x8", search="fast", fix=(("ep", 2),)))
    with pytest.raises(UsageError, match="does not divide the 8 experts"):
        plan_for(PlanRequest(model="mixtral-8x7b", ctx="32k", hw="h100x8", nodes=2, search="fast", fix=(("ep", 16),)))


def test_tied_model_tiles_its_loss_at_zero3_at_1m():
    # issue 22: "autosp-plan --model <qwen3-0.6b> --ctx 1M --hw h100x8 --fix zero_stage=3" said no plan fits
    plan = plan_for(PlanRequest(model="qwen3-0.6b", ctx="1M", hw="h100x8", search="fast", fix=(("zero_stage", 3),)))
    assert plan.model.tied_embeddings and plan.candidate.zero_stage == 3 and plan.estimate.fits
    assert plan.candidate.loss_chunks > 1


def test_refusals_are_one_line_exit_2_before_anything_is_built(tmp_path):
    cases = {"jamba.json": ({"model_type": "jamba", "architectures": ["JambaForCausalLM"],
                             "layer_types": ["mamba", "mamba", "mamba", "full_attention"]},
                            "hybrid model with linear-attention or state-space layers"),
             "t5.json": ({"model_type": "t5", "is_encoder_decoder": True}, "encoder-decoder"),
             "vl.json": ({"model_type": "qwen2_5_vl", "vision_config": {"depth": 32}}, "vision-language")}
    code = ["import sys, json", "from autosp.cli import plan_main", "rcs = []"]
    for name, (config, _) in cases.items():
        (tmp_path / name).write_text(json.dumps({**config, "hidden_size": 64, "num_hidden_layers": 4,
                                                 "num_attention_heads": 4, "intermediate_size": 128,
                                                 "vocab_size": 97}))
        code.append(f"rcs.append(plan_main(['--model', {str(tmp_path / name)!r}, '--ctx', '8k', '--hw', 'h100x8']))")
    code.append("print('RC', rcs, 'torch' in sys.modules, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True, timeout=300)
    errors = [ln for ln in out.stderr.splitlines() if "error:" in ln]
    assert out.stderr.strip().splitlines()[-1] == "RC [2, 2, 2] False", out.stderr  # nothing traced or built
    assert "Traceback" not in out.stderr and len(errors) == 3
    for line, (name, (_, named)) in zip(errors, cases.items()):
        assert named in line and name in line


def test_the_default_search_keeps_a_pinned_ep():
    plan = plan_for(PlanRequest(model="mixtral-8x7b", ctx="32k", hw="h100x8", trials=10, fix=(("ep", 2),)))
    assert plan.candidate.ep == 2 and plan.estimate.fits
