"""``--fix KNOB=VALUE``: pins parsed as in a plan file, kept by every search, refused in one line when they cannot
hold, and part of the plan cache key."""

import contextlib
import io
import json
from dataclasses import MISSING, fields, replace

import pytest

from autosp.cost_models.specs import Candidate
from autosp.errors import UsageError
from autosp.planner.api import plan_for
from autosp.planner.pins import parse_pins
from autosp.planner.request import PlanRequest, resolve
from autosp.planner.search.space import SPACE_VERSION


@pytest.mark.parametrize("text, expected", [
    ("sp=8", ("sp", 8)), ("zero_stage=3", ("zero_stage", 3)), ("micro_batch=16", ("micro_batch", 16)),
    ("offload_activations=true", ("offload_activations", True)), ("offload_optimizer=false", ("offload_optimizer", False)),
    ("offload_optimizer=False", ("offload_optimizer", False)), ("checkpointing=full", ("checkpointing", "full")),
    ('overlap="kv_async"', ("overlap", "kv_async")), ("loss-chunks=8", ("loss_chunks", 8)),
])
def test_each_kind_of_value_is_read_as_in_a_plan_file(text, expected):
    assert parse_pins([text]) == (expected,)


def test_pins_are_sorted_and_deduplicated_and_take_dicts_and_pairs():
    a = parse_pins(["zero_stage=3", "sp=4", "zero_stage=3"])
    assert a == (("sp", 4), ("zero_stage", 3))
    assert parse_pins({"zero_stage": 3, "sp": 4}) == a == parse_pins([("sp", 4), ("zero_stage", "3")])


def test_every_candidate_field_can_be_pinned_to_its_default():
    """Generic over the Candidate's fields: a knob added there is pinnable without changes to the planner."""
    for f in fields(Candidate):
        value = 1 if f.default is MISSING else f.default
        text = json.dumps(value) if not isinstance(value, str) else value
        assert parse_pins([f"{f.name}={text}"]) == ((f.name, value),)


@pytest.mark.parametrize("pins, needle", [
    (["zero_stage=three"], "zero_stage takes an integer"), (["micro_batch=true"], "micro_batch takes an integer"),
    (["offload_activations=1"], "true or false"), (["checkpointing=7"], "takes a str"),
    (["zero_stage=5"], "zero_stage must be 0, 1, 2 or 3"), (["checkpointing=most"], "checkpointing must be one of"),
    (["sp=0"], "sp must be a positive integer"), (["zero-stage"], "KNOB=VALUE"), (["sp="], "KNOB=VALUE"),
    (["zero_stag=3"], "did you mean zero_stage"), (["sp=2", "sp=4"], "pinned twice"),
])
def test_bad_pins_are_one_line(pins, needle):
    with pytest.raises(UsageError, match=needle):
        PlanRequest(model="llama-3.2-1b", ctx="8k", hw="h100x2", fix=pins)


@pytest.mark.parametrize("search", ["fast", "exhaustive", "optuna"])
def test_every_search_keeps_the_pins(search):
    pins = ["zero_stage=1", "checkpointing=selective", "micro_batch=2"]
    plan = plan_for(PlanRequest(model="llama-3.2-1b", ctx="32k", hw="h100x4", search=search, trials=8, fix=pins))
    c = plan.candidate
    assert (c.zero_stage, c.checkpointing, c.micro_batch) == (1, "selective", 2)
    assert plan.search["fixed"] == {"checkpointing": "selective", "micro_batch": 2, "zero_stage": 1}
    free = plan_for(PlanRequest(model="llama-3.2-1b", ctx="32k", hw="h100x4", search=search, trials=8))
    assert free.estimate.tokens_per_second >= plan.estimate.tokens_per_second


def test_max_ctx_keeps_the_pins():
    plan = plan_for(PlanRequest(model="llama-3.2-1b", hw="h100x2", objective="max-ctx", search="fast",
                                fix=["sp=1", "offload_optimizer=false"]))
    assert plan.candidate.sp == 1 and plan.candidate.dp == 2 and not plan.candidate.offload_optimizer


def test_dp_pins_the_sp_degree_and_a_value_outside_the_default_choices_is_searched():
    plan = plan_for(PlanRequest(model="llama-3.2-1b", ctx="32k", hw="h100x4", search="fast",
                                fix=["dp=2", "mlp_chunks=3"]))
    assert (plan.candidate.sp, plan.candidate.dp, plan.candidate.mlp_chunks) == (2, 2, 3)


@pytest.mark.parametrize("pins, needle", [
    (["sp=3"], "does not divide"),
    (["dp=3"], "dp must divide"),
    (["sp=1", "overlap=kv_async"], "needs an all-to-all"),
    (["checkpointing=none", "offload_activations=true"], "needs a checkpointing policy"),
    (["mlp_chunks=64"], "tiles smaller than"),
    (["sp=4", "ring=3"], r"ring \(3\) must divide sp \(4\)"),  # the contradiction named (issue 19)
    (["sequence_chunks=4"], "chunks smaller than 8192"),  # a searched knob since sequence chunking
    (["grad_accum=2"], "needs --global-batch"),
])
def test_pins_that_cannot_hold_are_refused_with_the_reason(pins, needle):
    with pytest.raises(UsageError, match=needle):
        plan_for(PlanRequest(model="llama-3.2-1b", ctx="8k", hw="h100x4", search="fast", fix=pins))


def test_pins_enter_the_cache_key():
    a = resolve(PlanRequest(model="llama-3.2-1b", ctx="8k", hw="h100x4"))
    b = resolve(replace(a.request, fix=parse_pins(["zero_stage=3"])))
    c = resolve(replace(a.request, fix=parse_pins(["zero_stage=2"])))
    keys = [r.key_material(60, SPACE_VERSION) for r in (a, b, c)]
    assert keys[0] != keys[1] != keys[2] != keys[0]
    assert b.key_material(60, SPACE_VERSION) == resolve(
        PlanRequest(model="llama-3.2-1b", ctx="8k", hw="h100x4", fix={"zero_stage": 3})).key_material(60, SPACE_VERSION)


def test_cached_plans_answer_only_the_same_pins(tmp_path):
    cache = str(tmp_path / "plans.sqlite")
    request = PlanRequest(model="llama-3.2-1b", ctx="16k", hw="h100x2", search="fast")
    free = plan_for(request, cache=cache)
    pinned = plan_for(replace(request, fix=parse_pins(["zero_stage=3"])), cache=cache)
    assert pinned.search["cache"] == "miss" and pinned.candidate.zero_stage == 3
    assert plan_for(replace(request, fix=parse_pins(["zero_stage=3"])), cache=cache).search["cache"] == "hit"
    assert free.search["cache"] == "miss"


def test_the_command_line_pins_and_reports_them():
    from autosp import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.plan_main(["--model", "llama-3.2-1b", "--ctx", "32k", "--hw", "h100x2", "--no-cache", "--search",
                            "fast", "--fix", "zero_stage=2", "--fix", "offload_activations=true"])
    assert rc == 0
    assert "Pinned   offload_activations=true zero_stage=2" in out.getvalue()
    assert "ZeRO stage                    2" in out.getvalue()


def test_check_holds_a_pinned_plan_to_the_same_pins(tmp_path):
    from autosp.planner.check import check

    plan = plan_for(PlanRequest(model="llama-3.2-1b", ctx="32k", hw="h100x4", search="fast",
                                fix=["zero_stage=0", "checkpointing=full"]))
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    result = check(str(path), cache=None)
    assert result["exit_code"] == 0, result
