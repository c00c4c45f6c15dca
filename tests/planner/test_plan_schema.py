"""The plan schema's candidate fields: validation of the 2-D SP, chunking and offload knobs, and old plans."""

import json

import pytest

from autosp.contract.specs import Candidate
from autosp.errors import UsageError
from autosp.contract.plan import SCHEMA_VERSION, plan_from_dict


def test_ring_divides_sp_and_names_both_dimensions():
    cand = Candidate(sp=8, ring=4)
    assert cand.ulysses == 2 and cand.short().startswith("sp8(u2xr4) ")
    assert Candidate(sp=8).ulysses == 8 and Candidate(sp=8).short().startswith("sp8 ")
    with pytest.raises(ValueError, match="ring"):
        Candidate(sp=6, ring=4)


@pytest.mark.parametrize("fields, needle", [
    ({"sequence_chunks": 0}, "sequence_chunks"),
    ({"ring": 0}, "ring"),
    ({"offload_chunks": True}, "sequence_chunks > 1"),
    ({"offload_chunks": 1, "sequence_chunks": 2}, "true or false"),
    ({"offload_param": True, "zero_stage": 2}, "zero_stage 3"),
])
def test_invalid_new_knobs_are_refused(fields, needle):
    with pytest.raises(ValueError, match=needle):
        Candidate(sp=2, **fields)


def test_a_version_1_plan_reads_with_the_new_knobs_off(tmp_path):
    from autosp.planner.api import plan_for
    from autosp.planner.request import PlanRequest

    plan = plan_for(PlanRequest(model="llama-3.2-1b", ctx="32k", hw="h100x8"), cache=None)
    data = json.loads(plan.to_json())
    assert data["schema_version"] == SCHEMA_VERSION == 2
    data["schema_version"] = 1
    for name in ("ring", "sequence_chunks", "offload_chunks", "offload_param"):
        del data["candidate"][name]
    old = plan_from_dict(data)
    assert (old.candidate.ring, old.candidate.sequence_chunks) == (1, 1)
    assert not old.candidate.offload_chunks and not old.candidate.offload_param
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(UsageError, match="newer"):
        plan_from_dict(data)


@pytest.mark.parametrize("model, total, active, header", [
    # public counts: Llama-3.1-8B model card 8.03B; Mixtral 46.7B total / 12.9B per token (mistral.ai);
    # Qwen3-30B-A3B model card 30.5B total / 3.3B activated (ours counts 3.35B: within 2%)
    ("llama-3.1-8b", 8.03e9, 8.03e9, "llama-3.1-8b (8.03B parameters) at 32k tokens"),
    ("mixtral-8x7b", 46.7e9, 12.9e9, "mixtral-8x7b (46.7B parameters, 12.9B active per token) at 32k tokens"),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, "qwen3-30b-a3b (30.5B parameters, 3.35B active per token) at 32k tokens"),
])
def test_the_plan_and_its_report_show_the_parameter_count(model, total, active, header):
    """The plan JSON's ``parameters`` and the report's header carry the model's own count
    (ModelSpec.n_params; cost_models.moe.active_params for a mixture of experts); a plan written before the
    section reads as before and gains it when written again."""
    import autosp
    from autosp.cost_models import moe
    from autosp.planner.cli.report import render

    plan = autosp.plan(autosp.PlanRequest(model=model, ctx="32k", hw="h100x8"), cache=False)
    data = json.loads(plan.to_json())
    assert data["parameters"] == {"total": plan.model.n_params(), "active_per_token": moe.active_params(plan.model)}
    assert abs(data["parameters"]["total"] / total - 1) < 0.005
    assert abs(data["parameters"]["active_per_token"] / active - 1) < 0.02
    assert header in render(plan).splitlines()[0]

    del data["parameters"]  # a plan file written before the section
    old = plan_from_dict(data)
    assert old == plan_from_dict(json.loads(plan.to_json())) == plan
    assert json.loads(old.to_json())["parameters"] == json.loads(plan.to_json())["parameters"]
