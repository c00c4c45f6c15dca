"""The couplings between plan knobs, each written once: :data:`RULES`.

A rule says: while ``knob`` takes one of its ``on`` values, ``test`` must hold on the knobs it ``reads``;
where it does not, the knob means nothing (or cannot run) and falls back to ``off``. Every consumer reads
this table instead of spelling a coupling out:

- the Candidate refuses a rule of scope :data:`CANDIDATE` (ValueError: no plan, pin or hand-made plan
  carries it); the compiler refuses a hand-made plan breaking one of scope :data:`COMPILER`
  (:func:`candidate_reason`); the planner's space refuses those and the :data:`PLANNER` ones
  (:func:`autosp.planner.search.space.invalid_reason`); the search's canonical form (:func:`settle`) applies
  every rule, :data:`SEARCH` ones included (what the planner never proposes but can price in a plan file);
- the enumeration and counting of a space (:func:`combinations`, :func:`count`), the bulk search's numpy mask
  (:func:`autosp.planner.search.bulk_search.rule_mask`), the pins (:func:`narrow`, :func:`solve`) and the
  local moves (through :meth:`SearchSpace.make`, which settles) all evaluate these rows, so the scalar and
  bulk searches cannot disagree (``tests/planner/test_rules.py``).

The rows are ordered so that a rule comes after every rule whose fallback changes a knob it reads (or gives
its own knob a value it constrains): one pass of :func:`settle` reaches the canonical form. The rules that
need the model or the cluster (heads, node sizes, tiles per rank) are the planner's alone
(:mod:`autosp.planner.search.space`); the Candidate's field checks are in :class:`autosp.contract.specs.Candidate`.
"""

from __future__ import annotations

import functools
import itertools
import operator
from dataclasses import dataclass, field
from typing import Callable

from autosp.contract.knobs import BY_NAME

CANDIDATE, COMPILER, PLANNER, SEARCH = "candidate", "compiler", "planner", "search"
"""Who refuses a knob value that breaks a rule: the Candidate itself; the compiler (and the planner); the
planner's space only (the compiler runs it as the off value's run); nobody (the search's canonical form only)."""

REFUSED_BY = {CANDIDATE: (CANDIDATE,), COMPILER: (CANDIDATE, COMPILER), PLANNER: (CANDIDATE, COMPILER, PLANNER),
              SEARCH: (CANDIDATE, COMPILER, PLANNER, SEARCH)}
"""The scopes each checker holds a candidate to (the planner's space: every scope but the search's)."""


@dataclass(frozen=True)
class Rule:
    """``knob`` at a value of ``on`` needs ``test(*values of reads)``; otherwise it falls back to ``off``."""

    knob: str
    on: frozenset
    reads: tuple[str, ...]
    test: Callable[..., bool]
    off: object
    scope: str
    reason: str
    """One line; ``{value}`` stands for the knob's value as a plan file writes it."""
    holds: Callable = field(init=False, repr=False, compare=False)
    """``holds(knobs)``: whether ``knobs`` (a mapping holding the rule's knob and what it reads) keep the rule.
    Built once per rule: every Candidate is checked with it (a closure per arity: half the time of a generic
    loop, python -m timeit)."""

    def __post_init__(self):
        object.__setattr__(self, "on", frozenset(self.on))
        knob, on, test = self.knob, self.on, self.test
        if len(self.reads) == 1:
            (read,) = self.reads
            holds = (lambda knobs: knobs[knob] not in on or test(knobs[read]))
        elif len(self.reads) == 2:
            first, second = self.reads
            holds = (lambda knobs: knobs[knob] not in on or test(knobs[first], knobs[second]))
        else:
            reads = self.reads
            holds = (lambda knobs: knobs[knob] not in on or test(*[knobs[name] for name in reads]))
        object.__setattr__(self, "holds", holds)

    def why(self, value) -> str:
        shown = ("true" if value else "false") if isinstance(value, bool) else value
        return self.reason.format(value=shown)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.knob, *self.reads)


RULES: tuple[Rule, ...] = (
    Rule("checkpointing", on={"selective", "sequence"}, reads=("sequence_chunks",), test=lambda chunks: chunks == 1,
         off="none", scope=PLANNER,
         reason="checkpointing={value} cannot go with sequence_chunks > 1: a sequence-chunked layer is kept whole "
                "(its input, K/V and attention output) by every policy but full; use checkpointing 'none' or 'full'"),
    Rule("offload_activations", on={True}, reads=("checkpointing",), test=lambda policy: policy != "none",
         off=False, scope=CANDIDATE,
         reason="offload_activations moves checkpointed layer inputs; it needs a checkpointing policy"),
    Rule("offload_optimizer", on={True}, reads=("zero_stage",), test=lambda zero: zero >= 1,
         off=False, scope=CANDIDATE,
         reason="offload_optimizer (ZeRO-Offload) needs zero_stage >= 1"),
    Rule("offload_param", on={True}, reads=("zero_stage",), test=lambda zero: zero == 3,
         off=False, scope=CANDIDATE,
         reason="offload_param (ZeRO-3 parameter offload) needs zero_stage 3"),
    Rule("offload_param", on={True}, reads=("offload_optimizer",), test=lambda optimizer: optimizer,
         off=False, scope=SEARCH,
         reason="offload_param=true needs offload_optimizer=true in a search (the pairing ALST's recipe uses: the "
                "weights are 2 bytes a parameter against the optimizer's 12, so offloading them alone is never the "
                "leaner move)"),
    Rule("offload_chunks", on={True}, reads=("sequence_chunks",), test=lambda chunks: chunks > 1,
         off=False, scope=CANDIDATE,
         reason="offload_chunks moves the chunks of sequence-chunked layers; it needs sequence_chunks > 1"),
    Rule("overlap", on={"head_pipeline"}, reads=("sequence_chunks",), test=lambda chunks: chunks == 1,
         off="kv_async", scope=COMPILER,
         reason="overlap=head_pipeline splits each layer's attention into head groups, and sequence_chunks needs one "
                "attention per layer; use overlap=none or kv_async with sequence_chunks > 1"),
    Rule("overlap", on={"kv_async", "head_pipeline"}, reads=("sp", "ring"), test=lambda sp, ring: sp > ring,
         off="none", scope=COMPILER,
         reason="overlap={value} overlaps the Ulysses all-to-alls and needs an all-to-all (a Ulysses degree sp / ring "
                "> 1; ring attention overlaps its own transfers); use overlap=none"),
)
"""The couplings between plan knobs (module docstring), in the order one pass of :func:`settle` needs."""

NAMES = tuple(dict.fromkeys(name for rule in RULES for name in rule.names))
"""Every knob a rule constrains or reads, in table order."""


def rules_of(scope: str) -> tuple[Rule, ...]:
    """The rules a checker of ``scope`` holds a candidate to (:data:`REFUSED_BY`)."""
    return _RULES_OF[scope]


_RULES_OF = {scope: tuple(r for r in RULES if r.scope in scopes) for scope, scopes in REFUSED_BY.items()}


def broken(knobs, rules: tuple[Rule, ...] = RULES) -> Rule | None:
    """The first of ``rules`` that ``knobs`` (a mapping holding every knob they read: a Candidate's ``vars``)
    break, or None."""
    for rule in rules:
        if not rule.holds(knobs):
            return rule
    return None


def allows(knobs: dict) -> bool:
    """Whether ``knobs`` (some knobs' values) break no rule whose knob and reads they all hold: what one layout
    (sp, ring) allows of a knob, or a checkpointing policy beside sequence chunks."""
    return all(rule.holds(knobs) for rule in _rules_within(frozenset(knobs)))


@functools.lru_cache(maxsize=256)
def _rules_within(names: frozenset) -> tuple[Rule, ...]:
    """The rules whose knob and reads are all in ``names``."""
    return tuple(rule for rule in RULES if names.issuperset(rule.names))


def candidate_reason(cand) -> str | None:
    """Why the compiler refuses ``cand`` (a rule of scope CANDIDATE or COMPILER it breaks), as one line, or None."""
    return reason(cand, COMPILER)


def reason(cand, scope: str) -> str | None:
    """The first rule of ``scope`` (:func:`rules_of`) that ``cand`` breaks, as one line, or None."""
    knobs = _knobs(cand)
    rule = broken(knobs, rules_of(scope))
    return rule.why(knobs[rule.knob]) if rule else None


def _knobs(cand) -> dict:
    return cand if isinstance(cand, dict) else vars(cand)


def settle(knobs: dict, keep=()) -> dict:
    """``knobs`` in canonical form: each rule's knob at its ``off`` value where the rule does not hold (one pass
    in table order: the order makes it final). A new dict; the knobs named in ``keep`` are never changed (a
    pinned value then stays, broken: the caller refuses it)."""
    out = dict(knobs)
    for rule in RULES:
        if not rule.holds(out) and rule.knob not in keep:
            out[rule.knob] = rule.off
    return out


def settled_value(name: str, knobs: dict):
    """The value knob ``name`` settles to among ``knobs`` (which hold it and what its rules read)."""
    knobs = dict(knobs)
    for rule in RULES:
        if rule.knob == name and not rule.holds(knobs):
            knobs[name] = rule.off
    return knobs[name]


def components(names, rules: tuple[Rule, ...] = RULES) -> tuple[tuple[str, ...], ...]:
    """The knobs of ``names`` that ``rules`` couple (those of the rules whose knobs are all in ``names``), grouped
    into independent sets (no rule joins two sets), each in the order of ``names``."""
    names = tuple(names)
    group: dict[str, set] = {}
    for rule in rules:
        if any(n not in names for n in rule.names):
            continue  # a rule reading a knob the caller does not vary is not theirs to check here
        merged = set().union(*(group.get(n, {n}) for n in rule.names))
        for n in merged:
            group[n] = merged
    out, seen = [], set()
    for name in names:
        if name in group and name not in seen:
            members = tuple(n for n in names if n in group[name])
            seen.update(members)
            out.append(members)
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _valid(names: tuple[str, ...], choices: tuple[tuple, ...]) -> frozenset:
    """The value tuples of ``names`` (one coupled set, each knob with its ``choices``) that break no rule."""
    rules = tuple(r for r in RULES if all(n in names for n in r.names))
    ok = []
    for values in itertools.product(*choices):
        knobs = dict(zip(names, values))
        if all(rule.holds(knobs) for rule in rules):
            ok.append(values)
    return frozenset(ok)


def _coupled(choices: dict) -> list[tuple[tuple[int, ...], frozenset]]:
    """(positions in ``choices``' order, valid value tuples) of each coupled set of ``choices``' knobs."""
    position = {name: i for i, name in enumerate(choices)}
    return [(tuple(position[n] for n in members), valid)
            for members, valid in _coupled_sets(tuple((n, tuple(choices[n])) for n in choices if n in NAMES))]


@functools.lru_cache(maxsize=4096)
def _coupled_sets(choices: tuple) -> tuple[tuple[tuple[str, ...], frozenset], ...]:
    """(knobs, valid value tuples) of each coupled set of ``choices`` ((knob, its values) pairs of the knobs the
    rules name). A rule whose reads each have one choice is decided first (the knob loses its on values where it
    fails), so a layout's sp and ring join no set. Kept: a sweep's requests ask for the same few choices."""
    allowed = dict(choices)
    names = tuple(allowed)
    live = []
    for rule in _rules_within(frozenset(names)):
        if all(len(allowed[n]) == 1 for n in rule.reads):
            if not rule.test(*(allowed[n][0] for n in rule.reads)):
                allowed[rule.knob] = tuple(v for v in allowed[rule.knob] if v not in rule.on)
        else:
            live.append(rule)
    grouped = components(names, tuple(live))
    coupled = {n for members in grouped for n in members}
    grouped += tuple((name,) for name in names if name not in coupled)  # a knob alone: its allowed values
    return tuple((members, _valid(members, tuple(allowed[n] for n in members))) for members in grouped)


def combinations(choices: dict):
    """Every combination of ``choices`` (knob -> its values, in the order given) that breaks no rule, as a dict, in
    ``itertools.product`` order."""
    names = tuple(choices)
    coupled = [(positions, valid) for positions, valid in _coupled(choices)
               if len(valid) < _product([choices[names[i]] for i in positions])]  # sets every value of which is valid
    if not coupled:
        yield from (dict(zip(names, values)) for values in itertools.product(*(choices[n] for n in names)))
        return
    # one lookup per combination: the valid values of every constrained knob at once (a few thousand tuples)
    at = sorted(i for positions, _ in coupled for i in positions)
    kept = set()
    for parts in itertools.product(*(valid for _, valid in coupled)):
        value_at = {i: v for (positions, _), part in zip(coupled, parts) for i, v in zip(positions, part)}
        kept.add(tuple(value_at[i] for i in at))
    read = operator.itemgetter(*at) if len(at) > 1 else (lambda values: (values[at[0]],))
    for values in itertools.product(*(choices[n] for n in names)):
        if read(values) in kept:
            yield dict(zip(names, values))


def _product(choices) -> int:
    total = 1
    for values in choices:
        total *= len(values)
    return total


def count(choices: dict) -> int:
    """``len(list(combinations(choices)))``, from the coupled sets apart (without the product)."""
    names = tuple(choices)
    coupled = _coupled(choices)
    inside = {i for positions, _ in coupled for i in positions}
    return _product([valid for _, valid in coupled]) * _product([choices[n] for i, n in enumerate(names)
                                                                 if i not in inside])


def narrow(domains: dict, keep=()) -> tuple[dict, list[tuple[Rule, object]]]:
    """``domains`` (knob -> its possible values) narrowed to the values that can stand beside every knob with a
    single value, each rule read both ways (activation offload alone needs a checkpointing policy; checkpointing
    none alone leaves no activation offload), repeated until nothing changes. The knobs of ``keep`` (pins) are
    never narrowed. Returns (the narrowed domains, the conflicts: (rule, value of its knob) for every kept value a
    rule refuses and every knob a rule leaves without a value, each after the rules that narrowed what it reads)."""
    d = {name: tuple(values) for name, values in domains.items()}
    narrowed_by: dict[str, list] = {}  # knob -> the (rule, value) that narrowed it from the other side
    conflicts: list[tuple[Rule, object]] = []

    def conflict(rule, value):
        for cause in [c for n in rule.reads for c in narrowed_by.get(n, ())] + [(rule, value)]:
            if cause not in conflicts:
                conflicts.append(cause)

    changed = True
    while changed:
        changed = False
        for rule in RULES:
            if any(n not in d for n in rule.names):
                continue
            own = d[rule.knob]
            if all(len(d[n]) == 1 for n in rule.reads) and not rule.test(*(d[n][0] for n in rule.reads)):
                kept = tuple(v for v in own if v not in rule.on)  # forward: the knob loses its on values
                if kept != own:
                    if rule.knob in keep:
                        conflict(rule, own[0])
                    else:
                        d[rule.knob], changed = kept, True
                        if not kept:
                            conflict(rule, own[0])
            if len(own) == 1 and own[0] in rule.on:
                free = [n for n in rule.reads if len(d[n]) > 1]
                if len(free) == 1:  # backward: the one read knob with a choice keeps the values the test passes
                    name = free[0]
                    ok = tuple(v for v in d[name]
                               if rule.test(*(v if n == name else d[n][0] for n in rule.reads)))
                    if ok != d[name]:
                        d[name], changed = ok, True
                        narrowed_by.setdefault(name, []).append((rule, own[0]))
                        if not ok:
                            conflict(rule, own[0])
    return d, conflicts


def solve(domains: dict) -> dict | None:
    """A combination of ``domains``' coupled knobs (their values in order) that breaks no rule, the first in
    product order, or None when none does. Knobs no rule couples are left out."""
    found = {}
    names = tuple(domains)
    for positions, valid in _coupled(domains):
        if not valid:
            return None
        members = [names[i] for i in positions]
        first = min(valid, key=lambda values: tuple(domains[n].index(v) for n, v in zip(members, values)))
        found.update(zip(members, first))
    return found


def broad_domain(name: str) -> tuple:
    """Every value of knob ``name`` a rule tells apart: its enumerated values, false and true, or 1 and 2 for a
    count (the rules test counts against 1 and each other only)."""
    knob = BY_NAME[name]
    if knob.values:
        return tuple(knob.values)
    if knob.kind is bool:
        return (False, True)
    return (1, 2)


def witness(fixed: dict) -> dict:
    """Values of every knob the rules couple that keep every rule beside ``fixed`` (knob -> value, kept as
    given), e.g. ``{"offload_param": True}`` -> ZeRO-3 with optimizer offload; ``fixed``'s values where no
    combination does (a value a rule refuses whatever the others: the caller's own check says why)."""
    domains = {name: (fixed[name],) if name in fixed else broad_domain(name) for name in NAMES}
    return solve(domains) or dict(fixed)


__all__ = ["CANDIDATE", "COMPILER", "NAMES", "PLANNER", "REFUSED_BY", "RULES", "Rule", "SEARCH", "allows",
           "broad_domain", "broken", "candidate_reason", "combinations", "components", "count", "narrow", "reason",
           "rules_of", "settle", "settled_value", "solve", "witness"]
