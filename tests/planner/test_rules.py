"""Issue 36: the couplings between plan knobs are one table (autosp/contract/rules.py), and every consumer agrees
with it: the canonical form and the validity rules of the space, the enumeration and its count, the bulk search's
numpy mask, the pins. Each check runs the table's rules over every combination of the knobs they read."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from autosp.contract import rules
from autosp.contract.knobs import BY_NAME, SEARCHED
from autosp.contract.specs import Candidate, Workload
from autosp.cost_models.catalog.hardware import resolve_hardware as get_hardware
from autosp.cost_models.catalog.models import resolve_model as get_model
from autosp.errors import UsageError
from autosp.planner.api import plan_for
from autosp.planner.pins import parse_pins
from autosp.planner.request import PlanRequest
from autosp.planner.search import bulk_search
from autosp.planner.search.space import build_space, canonical, invalid_reason, make_candidate

LLAMA = get_model("llama-3.1-8b")
H100X8 = get_hardware("h100x8")


def _every_combination(layouts=((8, 1), (8, 2), (8, 8), (1, 1)), chunks=(1, 4)):
    """Every combination of the knobs the rules read or constrain (counts at the values the rules tell apart), on
    a few layouts, as knob dicts."""
    names = [n for n in rules.NAMES if n not in ("sp", "ring")]
    domains = [chunks if n == "sequence_chunks" else rules.broad_domain(n) for n in names]
    for sp, ring in layouts:
        for values in itertools.product(*domains):
            yield dict(zip(names, values), sp=sp, ring=ring)


def test_one_pass_of_the_table_reaches_the_canonical_form():
    """The rows are ordered so that no fallback breaks a rule already applied: settle once, and nothing breaks and
    settling again changes nothing; a combination that breaks no rule is its own canonical form."""
    for knobs in _every_combination():
        settled = rules.settle(knobs)
        assert rules.broken(settled) is None, (knobs, settled)
        assert rules.settle(settled) == settled
        assert (settled == knobs) == (rules.broken(knobs) is None)


def test_canonical_make_and_invalid_reason_agree_with_the_table():
    """For every Candidate the rules' knobs can make (on pure Ulysses, Ulysses x ring and pure-ring layouts):
    canonical() and make_candidate() give the table's canonical form, which the space admits; invalid_reason
    refuses exactly the candidates breaking a rule the planner holds plans to. (canonical() used to keep
    head_pipeline beside sequence chunks, a candidate the space refuses.)"""
    wl, world = Workload(seq_len=1_048_576), H100X8.world_size
    seen = 0
    for knobs in _every_combination():
        try:
            cand = Candidate(**knobs, dp=world // knobs["sp"])
        except ValueError as err:  # a rule the Candidate itself holds (or none: then the test is wrong)
            rule = rules.broken(knobs, rules.rules_of(rules.CANDIDATE))
            assert str(err) == rule.why(knobs[rule.knob])
            continue
        seen += 1
        fixed = canonical(cand)
        assert fixed == Candidate(**rules.settle(knobs), dp=world // knobs["sp"])
        assert invalid_reason(LLAMA, H100X8, wl, fixed) is None, fixed
        assert canonical(fixed) == fixed
        assert make_candidate(world, None, **{k: getattr(cand, k) for k in SEARCHED}) == fixed
        planner_rule = rules.broken(knobs, rules.rules_of(rules.PLANNER))
        reason = invalid_reason(LLAMA, H100X8, wl, cand)
        assert reason == (planner_rule.why(knobs[planner_rule.knob]) if planner_rule else None), (knobs, reason)
    assert seen > 1000


def test_the_canonical_form_of_head_pipeline_beside_sequence_chunks_is_a_valid_candidate():
    """The rule the space's canonical() lacked: head_pipeline gives way to kv_async with sequence chunks."""
    cand = Candidate(sp=8, zero_stage=3, checkpointing="full", sequence_chunks=4, overlap="head_pipeline")
    fixed = canonical(cand)
    assert fixed.overlap == "kv_async"
    assert invalid_reason(LLAMA, H100X8, Workload(seq_len=1_048_576), fixed) is None


def test_the_compiler_refuses_what_the_table_says():
    bad = Candidate(sp=8, zero_stage=3, sequence_chunks=4, overlap="head_pipeline")
    assert rules.candidate_reason(bad) == next(r for r in rules.RULES if r.knob == "overlap"
                                               and "sequence_chunks" in r.reads).why("head_pipeline")
    assert rules.candidate_reason(Candidate(sp=8, ring=8, overlap="kv_async")).startswith("overlap=kv_async")
    # a search's own rule is no reason to refuse a hand-made plan: parameter offload without optimizer offload
    assert rules.candidate_reason(Candidate(sp=8, zero_stage=3, offload_param=True)) is None


SPACES = [  # (model, ctx, hw, pins): dense and ring layouts, a node's worth, one GPU, pins, packed lengths
    ("llama-3.1-8b", 131_072, "h100x8", ()),
    ("llama-3.1-8b", 1_048_576, "h100x8", ()),  # every sequence-chunk count
    ("llama-3.2-1b", 32_768, "h100x1", ()),
    ("qwen2.5-7b", 262_144, "h100x16", ()),  # 28 query heads: rings reach the degrees Ulysses cannot
    ("llama-3.1-8b", 1_048_576, "h100x8", ("offload_chunks=true",)),
    ("llama-3.1-8b", 1_048_576, "h100x8", ("checkpointing=selective", "overlap=head_pipeline")),
    ("llama-3.1-8b", 524_288, "h100x8", ("zero_stage=3", "offload_param=true")),
]


def _space(model, ctx, hw, pins):
    return build_space(get_model(model), get_hardware(hw), Workload(seq_len=ctx), fixed=parse_pins(list(pins)))


def _narrower(space):
    """Fewer tiling choices (the rules do not read them): the scalar enumeration stays quick."""
    return replace(space, mlp_chunks=space.mlp_chunks[:2], loss_chunks=space.loss_chunks[:2], micro_batch=(1, 2))


@pytest.mark.parametrize("spec", SPACES, ids=lambda s: f"{s[0]}-{s[1]}-{s[2]}-{'-'.join(s[3]) or 'free'}")
def test_the_bulk_rows_are_the_scalar_candidates(spec):
    """The bulk search's numpy mask keeps exactly the candidates of the scalar enumeration, which are as many as
    the space counts, each breaking no rule of the table and keeping every pin."""
    space = _narrower(_space(*spec))
    scalar = list(space.candidates())
    bulk = [bulk_search.row_candidate(space, base, rows, i)
            for base, rows in bulk_search.space_groups(space) for i in range(len(rows["zero_stage"]))]
    assert len(bulk) == len(set(bulk)) == len(scalar) == len(set(scalar)) == space.size() > 0
    assert set(bulk) == set(scalar)
    assert all(rules.broken(vars(c)) is None and space.reason(c) is None for c in scalar)


@pytest.mark.parametrize("spec", SPACES[:4], ids=lambda s: f"{s[0]}-{s[1]}-{s[2]}")
def test_the_mask_of_every_row_is_the_tables_verdict(spec):
    """Row by row over a layout's whole grid (the canonical rows and the others), at every shape: the numpy mask
    says keep exactly where the table's scalar check finds no broken rule."""
    space = _space(*spec)
    checked = 0
    for sp, ring, per in space.usable_layouts():
        grid = bulk_search.layout_rows(per)
        for seq in per["sequence_chunks"]:
            shape = dict(sp=sp, ring=ring, sequence_chunks=seq)
            mask = bulk_search.rule_mask(per, bulk_search.shape_key(shape))
            for i in range(len(mask)):
                knobs = dict(shape)
                for name, values in grid.items():
                    knob = BY_NAME[name]
                    knobs[name] = knob.values[int(values[i])] if knob.kind is str else knob.kind(values[i])
                assert bool(mask[i]) == (rules.broken(knobs) is None), knobs
                checked += 1
    assert checked > 10_000


def _pins_breaking(rule):
    """Pins that set ``rule``'s knob to a value it constrains and the knobs it reads to values failing its test."""
    on = next(v for v in rules.broad_domain(rule.knob) if v in rule.on)
    for values in itertools.product(*(rules.broad_domain(n) for n in rule.reads)):
        if not rule.test(*values):
            return {rule.knob: on, **dict(zip(rule.reads, values))}
    raise AssertionError(f"no value breaks {rule}")


@pytest.mark.parametrize("rule", [r for r in rules.RULES], ids=lambda r: f"{r.knob}-{'-'.join(r.reads)}")
def test_pins_that_break_a_rule_are_refused_with_its_reason(rule):
    pins = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in _pins_breaking(rule).items()]
    with pytest.raises(UsageError) as err:
        plan_for(PlanRequest(model="llama-3.1-8b", ctx="1M", hw="h100x8", search="fast", fix=pins), cache=False)
    message = str(err.value)
    assert "\n" not in message and rule.why(_pins_breaking(rule)[rule.knob]) in message, message


def test_pins_that_exclude_each_other_through_a_knob_left_free_are_refused():
    """offload_chunks needs sequence chunks, checkpointing=selective excludes them: no sequence_chunks goes with
    both, and the line says both rules."""
    with pytest.raises(UsageError, match="needs sequence_chunks > 1.*cannot go with sequence_chunks > 1|"
                                         "cannot go with sequence_chunks > 1.*needs sequence_chunks > 1"):
        plan_for(PlanRequest(model="llama-3.1-8b", ctx="1M", hw="h100x8", search="fast",
                             fix=["offload_chunks=true", "checkpointing=selective"]), cache=False)


def test_a_pinned_space_offers_only_values_the_pins_allow():
    """The rule table read backwards: pinning a knob narrows the others to what goes with it (the strategies start
    from each knob's first choice)."""
    space = _space("llama-3.1-8b", 1_048_576, "h100x8", ("offload_param=true",))
    assert space.zero_stage == (3,) and space.offload_optimizer == (True,)
    space = _space("llama-3.1-8b", 1_048_576, "h100x8", ("overlap=head_pipeline",))
    assert space.sequence_chunks == (1,) and space.offload_chunks == (False,)
    space = _space("llama-3.2-1b", 32_768, "h100x1", ())  # one GPU: no all-to-all to overlap
    assert space.overlap == ("none",)
    assert np.all([c.overlap == "none" for c in itertools.islice(space.candidates(), 50)])
