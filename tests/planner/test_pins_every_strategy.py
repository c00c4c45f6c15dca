"""Issue 19, items 1-2: every search strategy keeps every pin, or says in one line why it cannot.

Each knob of the plan is pinned, alone, to each value the unpinned space offers (dp to each divisor of the GPUs,
grad_accum to each value a global batch of 8 allows) on long-context requests, and each strategy is run on the
pinned space: the default Optuna search (warm starts, enqueued trials, structure sweep, refinement, family
completion; few trials and a small family budget to stay fast), the fast search, the sweep (the fast search
through :func:`autosp.planner.sweep.plan_one`), the exhaustive search (on a one-GPU request, whose whole space it
scores for every knob in seconds) and the max-ctx searches on the cases the issue found. The answer is a plan that
keeps the pin, "no plan fits" (then the exhaustive search agrees), or a UsageError of one line.
"""

from __future__ import annotations

import functools

import pytest

from autosp.errors import InfeasibleError, UsageError
from autosp.planner.search import exhaustive
from autosp.planner.search import fast
from autosp.planner.search import optuna_search as search
from autosp.planner.api import plan_for
from autosp.planner.search.evaluator import Evaluator
from autosp.planner.pins import check_pins, knob_names, parse_pins
from autosp.planner.request import PlanRequest, resolve
from autosp.planner.search.space import build_space, divisors, pin_reason
from autosp.planner.sweep import plan_one

LONG = {"8b-1M": ("llama-3.1-8b", "1M", "h100x8", None), "1b-400k-gb8": ("llama-3.2-1b", "400k", "h100x8", 8),
        "1b-32k-1gpu": ("llama-3.2-1b", "32k", "h100x1", None)}


@functools.lru_cache(maxsize=None)
def _resolved(name):
    model, ctx, hw, gb = LONG[name]
    return resolve(PlanRequest(model=model, ctx=ctx, hw=hw, global_batch=gb))


def _pins(name):
    """(knob, value) for every knob and every value the unpinned space offers it."""
    r = _resolved(name)
    choices = build_space(r.model, r.hardware, r.workload).choices()
    world = r.hardware.world_size
    out = []
    for knob in knob_names():
        if knob == "dp":
            values = divisors(world)
        elif knob == "grad_accum":
            gb = r.workload.global_batch
            values = [g for g in range(1, (gb or 1) + 1) if (gb or 1) % g == 0]
        else:
            values = choices[knob]
        out += [(knob, v) for v in values]
    return out


def _run(name, pin, strategy):
    """The best candidate of ``strategy`` on the pinned space, None when nothing fits, or the UsageError."""
    r = _resolved(name)
    pins = parse_pins([pin])
    space = build_space(r.model, r.hardware, r.workload, profile=r.profile, fixed=pins)
    try:
        check_pins(space)
    except UsageError as err:
        return err
    ev = Evaluator(space)
    if strategy == "optuna":
        result = search.optuna_throughput(space, ev, trials=3)
    elif strategy == "fast":
        result = fast.fast_throughput(space, ev)
    else:
        result = exhaustive.exhaustive_throughput(space, ev)
    return None if result.best is None else result.best[0]


def _kept(answer, pin, exhaustive_answer=None):
    knob, value = pin
    if isinstance(answer, UsageError):
        assert "\n" not in str(answer) and knob in str(answer), answer
        return
    if answer is None:  # nothing fits: the exhaustive search must agree
        assert exhaustive_answer is None, f"{knob}={value}: nothing found, exhaustive found {exhaustive_answer}"
        return
    assert getattr(answer, knob) == value, f"{knob}={value} dropped: {answer.short()}"
    assert pin_reason(answer, ((knob, value),)) is None


@pytest.fixture
def light_family_sweep(monkeypatch):
    """The family completion with a small budget (its pin handling is what is tested, not its reach)."""
    monkeypatch.setattr(search, "family_sweep", functools.partial(search.family_sweep, budget=300))


@pytest.mark.slow  # ~100 searches: about 30 s on an idle machine
def test_optuna_and_fast_keep_every_pin(light_family_sweep):
    name = "8b-1M"
    for pin in _pins(name):
        fast_answer = _run(name, pin, "fast")
        optuna_answer = _run(name, pin, "optuna")  # seeded: one run serves both checks below
        _kept(fast_answer, pin, exhaustive_answer=optuna_answer if fast_answer is None else None)
        _kept(optuna_answer, pin, exhaustive_answer=fast_answer)


def test_fast_keeps_every_pin_and_optuna_every_grad_accum(light_family_sweep):
    name = "1b-400k-gb8"
    for pin in _pins(name):
        answer = _run(name, pin, "fast")
        _kept(answer, pin, exhaustive_answer=_run(name, pin, "optuna") if answer is None else None)
        if pin[0] == "grad_accum":
            _kept(_run(name, pin, "optuna"), pin, exhaustive_answer=answer)


def test_exhaustive_keeps_every_pin_on_a_whole_space():
    name = "1b-32k-1gpu"
    for pin in _pins(name):
        answer = _run(name, pin, "exhaustive")
        _kept(answer, pin, exhaustive_answer=answer)


@pytest.mark.parametrize("fix, objective, strategy", [
    ("overlap=kv_async", "throughput", "optuna"), ("offload_activations=true", "throughput", "optuna"),
    ("loss_chunks=4", "throughput", "optuna"), ("offload_chunks=true", "throughput", "fast"),
    ("overlap=kv_async", "max-ctx", "optuna"), ("offload_activations=true", "max-ctx", "fast"),
])
def test_the_issue_cases_through_plan_for(fix, objective, strategy, light_family_sweep):
    """The requests of the issue through the planner's entry point (warm starts of the max-ctx search too)."""
    model, ctx = ("llama-3.1-8b", "1M") if fix.startswith("overlap") else ("llama-3.2-1b", "400k")
    plan = plan_for(PlanRequest(model=model, ctx=ctx if objective == "throughput" else None, hw="h100x8",
                                objective=objective, search=strategy, trials=4, fix=[fix]))
    knob, value = parse_pins([fix])[0]
    assert getattr(plan.candidate, knob) == value and plan.search["fixed"] == {knob: value}


def test_sweep_keeps_a_pin_and_agrees_with_the_single_plan():
    request = PlanRequest(model="llama-3.2-1b", ctx="400k", hw="h100x8", global_batch=8, search="fast",
                          fix=("grad_accum=4",))
    row = plan_one(request, None)
    single = plan_for(PlanRequest(model="llama-3.2-1b", ctx="400k", hw="h100x8", global_batch=8, search="fast",
                                  fix=["grad_accum=4"]))
    assert row["status"] == "ok" and single.candidate.grad_accum == 4
    assert row["plan"] == single.candidate.short()
    bad = plan_one(PlanRequest(model="llama-3.1-8b", ctx="1M", hw="h100x8", search="fast",
                               fix=("overlap=kv_async", "sp=1")), None)
    assert bad["status"] == "invalid" and "all-to-all" in bad["message"]


@pytest.mark.parametrize("fix, needle", [
    (["grad_accum=3"], "cannot hold with --global-batch 8"),
    (["offload_param=true", "offload_optimizer=false"], "offload_param=true needs"),
    (["checkpointing=selective", "sequence_chunks=4"], "checkpointing=selective cannot go with"),
    (["checkpointing=none", "offload_activations=true"], "needs a checkpointing policy"),
])
def test_pins_that_exclude_each_other_are_one_line(fix, needle):
    with pytest.raises(UsageError, match=needle) as err:
        plan_for(PlanRequest(model="llama-3.2-1b", ctx="400k", hw="h100x8", global_batch=8, fix=fix))
    assert "\n" not in str(err.value)


def test_a_space_pinned_keeps_the_pin_in_every_candidate_and_its_size():
    r = _resolved("1b-32k-1gpu")
    for pin in _pins("1b-32k-1gpu"):
        space = build_space(r.model, r.hardware, r.workload, fixed=parse_pins([pin]))
        cands = list(space.candidates())
        assert len(cands) == space.size(), pin
        assert all(pin_reason(c, space.fixed) is None for c in cands), pin
