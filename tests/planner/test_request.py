"""One planning request type: PlanRequest is what autosp.plan, autosp-plan, check/select and the plan cache
key all use, validated once, with its cache key listing every field."""

from __future__ import annotations

import dataclasses
import json

import pytest

import autosp
from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.errors import UsageError
from autosp.planner.api import plan_for
from autosp.planner.cli.main import build_parser
from autosp.planner.cli.args import request_fields
from autosp.planner.request import PlanRequest, resolve
from autosp.planner.search.space import SPACE_VERSION


def test_what_a_user_types_is_parsed_once():
    r = PlanRequest(model="llama", hw="h100x8", ctx="200k", nodes="2", global_batch="64", trials="30",
                    time_budget="2m")
    assert (r.ctx, r.nodes, r.global_batch, r.trials, r.time_budget) == (200_000, 2, 64, 30, 120.0)
    assert r == PlanRequest(model="llama", hw="h100x8", ctx=200_000, nodes=2, global_batch=64, trials=30,
                            time_budget=120)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.ctx = 1


@pytest.mark.parametrize("fields,flag", [
    (dict(ctx="200q"), "--ctx"), (dict(ctx=None), "--ctx is required"), (dict(objective="fast"), "--objective"),
    (dict(search="grid"), "--search"), (dict(dtype="fp8"), "--dtype"), (dict(nodes=0), "--nodes"),
    (dict(global_batch="x"), "--global-batch"), (dict(trials=10**6), "--time-budget"), (dict(seed="1"), "--seed"),
    (dict(time_budget="soon"), "--time-budget"), (dict(time_budget=5, search="exhaustive"), "exhaustive"),
    (dict(model=""), "--model"), (dict(hw=3), "--hw"), (dict(top_k=-1), "top_k"),
])
def test_bad_fields_are_one_line_usage_errors(fields, flag):
    base = dict(model="llama", hw="h100x8", ctx="8k")
    with pytest.raises(UsageError, match=flag) as err:
        PlanRequest(**{**base, **fields})
    assert "\n" not in str(err.value)


def test_the_cache_key_lists_every_field_and_not_the_spelling():
    a = resolve(PlanRequest(model="llama-3.1-8b", hw="h100x8", ctx="128Ki"))
    b = resolve(PlanRequest(model=a.model, hw=resolve_hardware("h100x8"), ctx=131_072))
    assert a.key_material(60, SPACE_VERSION) == b.key_material(60, SPACE_VERSION)
    key = a.key_material(60, SPACE_VERSION)
    folded = {"model", "hw", "nodes", "ctx", "global_batch", "dtype", "compile_backend"}  # keyed in the workload
    assert {f.name for f in dataclasses.fields(PlanRequest)} - folded <= set(key)  # a new field is keyed by itself
    json.dumps(key)  # storable
    eager = resolve(dataclasses.replace(a.request, compile_backend="eager")).key_material(60, SPACE_VERSION)
    assert "compile_backend" not in key["workload"] and eager["workload"]["compile_backend"] == "eager"
    other = resolve(dataclasses.replace(a.request, seed=1)).key_material(60, SPACE_VERSION)
    assert other != key
    exhaustive = resolve(dataclasses.replace(a.request, search="exhaustive", seed=1)).key_material(60, SPACE_VERSION)
    assert exhaustive["seed"] is None and exhaustive["trials"] is None  # search settings only matter to Optuna


def test_every_entry_point_asks_the_same_request():
    request = PlanRequest(model="llama-3.2-1b", hw="h100x2", ctx="16k", search="exhaustive")
    by_request = plan_for(request)
    keyword = autosp.plan("llama-3.2-1b", "16k", "h100x2", search="exhaustive", cache=False)  # request and run fields
    facade = autosp.plan(request)
    assert by_request.candidate == keyword.candidate == facade.candidate
    assert keyword.search["cache"] == "off"
    args = build_parser().parse_args(["--model", "llama-3.2-1b", "--ctx", "16k", "--hw", "h100x2", "--search",
                                      "exhaustive"])
    assert PlanRequest(**request_fields(args)) == request
    assert autosp.PlanRequest is PlanRequest
    with pytest.raises(UsageError, match="not both"):
        autosp.plan(request, "16k")
    with pytest.raises(UsageError, match="not both"):
        autosp.plan(request, search="fast")
