"""The knob table (autosp/contract/knobs.py) is the one place the plan knobs are listed.

1. Its rows are exactly Candidate's fields, with Candidate's defaults, types and allowed values.
2. No module outside it spells out a hand list of knob names: a list / tuple / set literal or dict keys holding
   three or more knob names, a function with three or more knob-named parameters, or a class declaring three or
   more knob-named fields. The exceptions are listed in ALLOWED, each with why.
3. The couplings between knobs are written once, in the rule table (autosp/contract/rules.py): no module outside
   it tests a rule's knob together with a knob the rule reads in one condition (an ``if`` or ``while`` test, a
   conditional expression, a comprehension's filter, an ``and`` / ``or``, a numpy mask's ``&`` / ``|``):
   ``if cand.offload_param and cand.zero_stage != 3`` or ``keep &= ~(opt & (zero == 0))`` over
   ``rows["offload_optimizer"]`` spells a rule again, and the copies drift (the space's canonical form once lacked
   one). The readers ask the table instead (``rules.broken`` / ``settle`` / ``narrow``,
   ``bulk_search.rule_mask``).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from autosp.contract.knobs import BY_NAME, KNOBS, LEAN_FIRST, REPORT_ROWS, SEARCHED, SIMPLICITY
from autosp.contract.rules import RULES
from autosp.contract.specs import Candidate

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("autosp", "planner", "compiler", "cost_models", "studies")
KNOB_NAMES = {knob.name for knob in KNOBS}

ALLOWED = {
    # (path, the enclosing function or class, or "<module>"): why it may name knobs by hand
    ("autosp/contract/knobs.py", "<module>"): "the table itself",
    ("autosp/contract/specs.py", "Candidate"): "the Candidate the table describes (tied to it by this test)",
    ("planner/search/space.py", "SearchSpace"): "the space's choices per searched knob: one typed field each (the test "
                                         "below checks they are exactly the table's searched knobs)",
    ("cost_models/bulk.py", "<module>"): "ROW_KNOBS: the axes the bulk cost model vectorises; a new knob needs "
                                         "vector cost terms there or a space bulk_search.supported() refuses",
    ("autosp/contract/specs.py", "short"): "Candidate.short(): the compact one-line form, a tag per knob in the "
                                           "order the reports and logs print it",
    **{("planner/search/fast_bulk.py", scope): "a cell of the bulk quick search: one shape group of the bulk cost "
                                               "model (its knobs that are not ROW_KNOBS) at one overlap schedule"
       for scope in ("get", "cap", "bounds", "_bound")},
    ("planner/diagnose.py", "_lean_corner"): "the diagnosis's variations (checkpointing, the offloads that share host "
                                         "memory, ZeRO stage with loss tiling, ep) around the table's lean values",
    ("compiler/inputs.py", "shard_batch"): "a pure data function taking the layout as numbers (tested without a "
                                           "Candidate)",
    ("compiler/runtime.py", "shard"): "hands the candidate's layout numbers to shard_batch",
    ("studies/published_gpu.py", "pinned_space"): "a published recipe's fixed knobs, transcribed from its source",
    ("planner/cli/price.py", "configuration"): "the pins that change the batch split (sp, dp, micro-batch): a "
                                               "rule of grad_accum",
    ("studies/measure/__main__.py", "main"): "the measuring CLI's flags, one per knob it can set",
    ("studies/published_gpu.py", "PublishedRun"): "a published run's recipe, transcribed from its source",
}


ENUMERATION = 8
"""A dict or call naming this many knobs (half of them) enumerates the knobs rather than setting a few."""


def _knob_strings(node) -> set[str]:
    return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)} & KNOB_NAMES


def _read_knobs(node) -> set[str]:
    """The knobs a tuple / list reads one element each (``(c.offload_param, -c.sp, ...)``): a hand-made key."""
    out = set()
    for element in node.elts:
        read = {n.attr for n in ast.walk(element) if isinstance(n, ast.Attribute) and n.attr in KNOB_NAMES}
        if len(read) == 1:
            out |= read
    return out


def _copied(pairs) -> set[str]:
    """The knobs of (name, value) pairs whose value reads the same-named attribute of something: a field-by-field
    copy of a candidate (``"sp": c.sp``, ``sp=c.sp``)."""
    return {name for name, value in pairs if name in KNOB_NAMES and isinstance(value, ast.Attribute)
            and value.attr == name}


def hand_lists(tree: ast.Module):
    """(line, enclosing scope, names) of every hand list of knob names in ``tree``: a list / tuple / set literal of
    three or more knob names (or of three or more elements each reading one knob: a hand-made sort key), a dict or
    call copying three or more knobs field by field or naming ENUMERATION knobs, a function with four or more
    knob-named parameters, a class declaring three or more knob-named fields."""
    found = []

    def visit(node, scope):
        names = set()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs} & KNOB_NAMES
            names = params if len(params) >= 4 else set()
            scope = node.name
        elif isinstance(node, ast.ClassDef):
            names = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                     and isinstance(s.target, ast.Name)} & KNOB_NAMES
            scope = node.name
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple) \
                and isinstance(node.value, ast.Tuple):  # unpacking a few knobs into locals is no list
            for child in node.value.elts:
                visit(child, scope)
            return
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            names = max(_knob_strings(node), _read_knobs(node), key=len)
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)} & KNOB_NAMES
            names = keys if len(keys) >= ENUMERATION else \
                _copied((k.value, v) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant))
        elif isinstance(node, ast.Call):
            keys = {k.arg for k in node.keywords} & KNOB_NAMES
            names = keys if len(keys) >= ENUMERATION else _copied((k.arg, k.value) for k in node.keywords)
        if len(names) >= 3:
            found.append((node.lineno, scope, sorted(names)))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(tree, "<module>")
    return found


def test_table_rows_are_candidate_fields():
    fields = dataclasses.fields(Candidate)
    assert [k.name for k in KNOBS if k.name not in {f.name for f in fields}] == [], "a row without a field"
    missing = [f.name for f in fields if f.name not in BY_NAME]
    assert not missing, f"Candidate fields missing from the knob table: {missing}"
    assert len(KNOBS) == len(fields) == len(BY_NAME)
    for f in fields:
        knob = BY_NAME[f.name]
        if f.default is not dataclasses.MISSING:
            assert knob.default == f.default and type(f.default) is knob.kind, f.name
        for value in knob.values:  # every allowed value is accepted by Candidate (with the others made to allow it)
            Candidate(**{"sp": 1, "zero_stage": 3, f.name: value})


def test_orders_are_complete_and_distinct():
    for order, column in ((SIMPLICITY, "simplicity"), (LEAN_FIRST, "lean_rank"), (REPORT_ROWS, "report_row")):
        places = [getattr(k, column) for k in order]
        assert places == list(range(len(places))), (column, places)
    assert all(k.label and k.describe for k in REPORT_ROWS if k.name not in ("sp", "micro_batch"))


def test_search_space_fields_are_the_searched_knobs():
    from autosp.planner.search.space import SearchSpace

    declared = {f.name for f in dataclasses.fields(SearchSpace)} & KNOB_NAMES
    assert declared == set(SEARCHED) and SearchSpace.KNOBS == SEARCHED


def scan(find, sources=SOURCES, allowed=ALLOWED, skip=()) -> tuple[list[str], set]:
    """(offenders as ``path:line (scope): names``, the ``allowed`` keys used) of ``find(tree)`` -- (line, scope,
    names) rows -- over every module of ``sources`` but those of ``skip``."""
    offenders, used = [], set()
    for top in sources:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in skip:
                continue
            for line, scope, names in find(ast.parse(path.read_text(), filename=rel)):
                if (rel, scope) in allowed:
                    used.add((rel, scope))
                else:
                    offenders.append(f"{rel}:{line} ({scope}): {', '.join(map(str, names))}")
    return offenders, used


def test_no_hand_lists_of_knob_names():
    offenders, used = scan(hand_lists)
    assert not offenders, ("hand lists of knob names; loop over autosp.contract.knobs.KNOBS instead (or add an "
                           "ALLOWED entry saying why):\n" + "\n".join(offenders))
    stale = [key for key in ALLOWED if key not in used and key[0] != "autosp/contract/knobs.py"]
    assert not stale, f"ALLOWED entries that no longer match anything: {stale}"


@pytest.mark.parametrize("source, count", [
    ("x = ('sp', 'ring', 'ep')", 1),
    ("d = {'mlp_chunks': c.mlp_chunks, 'loss_chunks': c.loss_chunks, 'overlap': c.overlap}", 1),
    ("Candidate(sp=a.sp, dp=a.dp, ring=a.ring)", 1),
    ("def f(sp, ring, zero_stage, ep): pass", 1),
    ("class C:\n    sp: int\n    dp: int\n    ep: int", 1),
    ("x = ('sp', 'ring', 'other')", 0),
    ("f(sp=1, ring=2, ep=1)", 0),  # a point of the space, not a list of knobs
    ("d = {'sp': 1, 'zero_stage': 3, 'checkpointing': 'full'}", 0),
    ("key = (c.offload_param, -c.sp, ORDER.index(c.checkpointing))", 1),
    ("names = {'sp': 'sp', 'ring': 'ring', 'zero_stage': 'ZeRO', 'micro_batch': 'mb', 'grad_accum': 'ga', "
     "'checkpointing': 'ckpt', 'mlp_chunks': 'mlp', 'loss_chunks': 'loss'}", 1),
    ("def rule(sequence_chunks, checkpointing, overlap): pass", 0),  # one rule's inputs
])
def test_the_check_finds_hand_lists(source, count):
    assert len(hand_lists(ast.parse(source))) == count


# --- 3. the rule table ---------------------------------------------------------------------------------------

RULE_SOURCES = ("autosp", "planner", "compiler", "studies")
"""The rule table's readers. Not cost_models: it prices the Candidate the table admitted, and its terms read knobs
together for what they cost (activation offload under full recompute), which this check cannot tell from a rule."""

ALIASES = {"ulysses": ("sp", "ring")}
"""Properties that stand for knobs a rule reads (Candidate.ulysses is sp / ring)."""

PAIRS = {(rule.knob, read) for rule in RULES for read in rule.reads}
PAIRS |= {(knob, alias) for knob, read in PAIRS for alias, stands_for in ALIASES.items() if read in stands_for}
RULE_NAMES = {name for pair in PAIRS for name in pair}


def _named(node) -> set[str]:
    """The knobs of the rule table ``node`` reads: attributes (``cand.zero_stage``) and string subscripts
    (``rows["zero_stage"]``)."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in RULE_NAMES:
            out.add(n.attr)
        elif isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and n.slice.value in RULE_NAMES:
            out.add(n.slice.value)
    return out


def _conditions(node):
    if isinstance(node, (ast.If, ast.While, ast.IfExp)):
        yield node.test
    elif isinstance(node, ast.comprehension):
        yield from node.ifs
    elif isinstance(node, ast.BoolOp):
        yield node
    elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
        yield node


def couplings(tree: ast.Module):
    """(line, enclosing scope, pairs) of every condition in ``tree`` testing a rule's knob beside a knob it reads."""
    found, lines = [], set()

    def visit(node, scope, bound):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope, bound = node.name, {}
        for condition in _conditions(node):
            named = _named(condition) | {bound[n.id] for n in ast.walk(condition)
                                         if isinstance(n, ast.Name) and n.id in bound}
            pairs = sorted(p for p in PAIRS if set(p) <= named)
            if pairs and condition.lineno not in lines:  # once per line (an if's test and the `and` in it)
                lines.add(condition.lineno)
                found.append((condition.lineno, scope, pairs))
        for child in ast.iter_child_nodes(node):
            visit(child, scope, bound)
            if isinstance(child, ast.Assign):  # the statements after it see the locals it binds to knobs
                for target, value in zip(getattr(child.targets[0], "elts", child.targets),  # zero, opt = rows[...], ...
                                         getattr(child.value, "elts", [child.value])):
                    named = _named(value)
                    if isinstance(target, ast.Name) and len(named) == 1:
                        bound = dict(bound, **{target.id: next(iter(named))})

    visit(tree, "<module>", {})
    return found


def test_no_module_outside_the_rule_table_spells_a_coupling():
    offenders, _ = scan(couplings, RULE_SOURCES, allowed={}, skip=("autosp/contract/rules.py",))
    assert not offenders, ("conditions that spell a rule of autosp/contract/rules.py again; read the table instead "
                           "(rules.broken / settle / narrow, bulk_search.rule_mask):\n" + "\n".join(offenders))


@pytest.mark.parametrize("source, count", [
    ("if c.offload_activations and c.checkpointing == 'none': pass", 1),
    ("x = k['offload_chunks'] and k['sequence_chunks'] > 1", 1),
    ("def f(rows):\n    zero, opt = rows['zero_stage'], rows['offload_optimizer']\n    keep = ~(opt & (zero == 0))", 1),
    ("y = 'none' if c.ulysses == 1 and c.overlap != 'none' else c.overlap", 1),
    ("if c.offload_activations and c.offload_chunks: pass", 0),  # two knobs no rule couples
    ("Candidate(sp=8, zero_stage=3, offload_param=True)", 0),  # a point of the space, not a condition
])
def test_the_check_finds_spelled_couplings(source, count):
    assert len(couplings(ast.parse(source))) == count
