"""The search strategies' table, the run options and the typed search metadata of plan_for."""

import ast
from pathlib import Path

import pytest

from autosp.planner.api import RunOptions, plan_for
from autosp.planner.request import SEARCHES, PlanRequest, resolve
from autosp.planner.search import strategies
from autosp.planner.search.evaluator import Evaluator
from autosp.planner.search.space import build_space
from autosp.planner.search_info import OPTIONAL, SearchInfo

SEARCH_DIR = Path(strategies.__file__).resolve().parent


def _imports(path: Path) -> set:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_every_search_the_request_accepts_is_a_row_of_the_table():
    assert set(strategies.STRATEGIES) == set(SEARCHES)


def test_the_fast_search_and_the_local_moves_do_not_borrow_from_the_optuna_module():
    for name in ("fast.py", "moves.py"):
        assert not any("optuna" in module for module in _imports(SEARCH_DIR / name)), name


def _job(request: PlanRequest, **fields) -> strategies.SearchJob:
    resolved = resolve(request)
    space = build_space(resolved.model, resolved.hardware, resolved.workload)
    return strategies.SearchJob(space=space, evaluator=Evaluator(space), objective=request.objective,
                                trials=request.effective_trials(shared=False), trials_asked=request.trials, **fields)


def test_choose_scores_a_small_space_whole_and_leaves_other_strategies_alone():
    request = PlanRequest(model="llama-3.2-1b", ctx="32k", hw="h100x8")
    name, why = strategies.choose("optuna", _job(request))
    assert name == "exhaustive" and "cost less to score than the Optuna search" in why
    assert strategies.choose("fast", _job(request)) == ("fast", "")
    # an explicit trial count on a space too big for the scalar exhaustive search asks for the sampler
    big = PlanRequest(model="llama-3.1-8b", ctx="256k", hw="h100x16", trials=5)
    assert strategies.choose("optuna", _job(big))[0] == "optuna"


def test_run_options_as_a_dataclass_or_as_keywords_give_the_same_plan():
    request = PlanRequest(model="llama-3.2-1b", ctx="16k", hw="h100x8", search="fast")
    a = plan_for(request, RunOptions(cache=None)).to_dict()
    b = plan_for(request, cache=None).to_dict()
    for plan in (a, b):
        for key in ("wall_time_s", "search_wall_time_s"):
            plan["search"].pop(key)
        plan.pop("created_at")
    assert a == b
    with pytest.raises(TypeError):
        plan_for(request, no_such_option=1)
    with pytest.raises(Exception, match="--study-name and --worker-id need --storage"):
        plan_for(request, RunOptions(study_name="x"))


def test_the_search_metadata_keeps_the_plan_keys_and_leaves_out_what_is_unset():
    request = PlanRequest(model="llama-3.2-1b", ctx="16k", hw="h100x8", search="fast", fix=("zero_stage=3",))
    search = plan_for(request, cache=None).search
    always = [name for name in SearchInfo.__dataclass_fields__ if name not in OPTIONAL and name != "details"]
    assert list(search)[:len(always)] == always
    assert search["fixed"] == {"zero_stage": 3}
    assert "measured" not in search and "max_ctx_tokens" not in search and "excluded_sp" not in search
    assert search["families"] >= 1  # the strategy's own details follow, flat
