"""Scoring a whole space (or a whole family of it) with the bulk cost model (:mod:`autosp.cost_models.bulk`).

:func:`space_groups` enumerates exactly the candidates of :meth:`SearchSpace.candidates` -- same validity rules,
same canonical forms -- but as numpy arrays, one group per shape (layout, micro-batch, sequence chunks), without
building a Candidate per point. :func:`bulk_throughput` prices every group in bulk and hands only the candidates
the plan can show (the best of every (sp, ring, ZeRO, checkpointing) family, the fastest that does not fit, the
overall leaders, with their exact ties) to the scalar cost model through the evaluator, so the plan, its
runner-ups and its notes come from the reference model; the answer is the exhaustive search's.

Where the space is small enough (:data:`BULK_EXHAUSTIVE_CANDIDATES`), the default search scores it whole this
way: exact, and cheaper than sampler trials (planner/api.py).
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from autosp.contract import rules
from autosp.cost_models import bulk
from autosp.contract.knobs import BY_NAME, FAMILY, SIMPLICITY, knobs_of
from autosp.contract.specs import CHECKPOINTING_POLICIES
from autosp.planner.search.evaluator import Evaluator, SearchResult, ranked_at

BULK_EXHAUSTIVE_CANDIDATES = 1_500_000
"""The largest space the default search scores whole in bulk (about 0.6 us of CPU per candidate on the 2 cores
of the development machine, studies/planner_speed.py: 1.5M candidates cost about what the Optuna search costs)."""

TIE = 1e-9
"""Relative margin within which two bulk scores count as a tie: every tied candidate is re-scored by the scalar
model, whose ranking (:func:`~autosp.planner.search.evaluator.rank_key`) then decides (bulk and scalar agree to 1e-12)."""

ZERO_STAGES = len(BY_NAME["zero_stage"].values)
"""Width of the ZeRO axis in a family id ((layout x ZeRO stage) x checkpointing policy), shared with the bulk quick
search (fast_bulk.py)."""

MAX_RESCORED = 4_000
"""At most this many candidates of a space go back to the scalar model (ties of a family beyond it are left out)."""



def supported(space) -> bool:
    """Whether the bulk model prices this space: every model (mixture-of-experts ones with their ``ep`` axis, one
    shape group per ep) on hardware that is not degenerate; the other spaces take the scalar search."""
    return bulk.supported(space.hardware) is None


_KINDS = {name: bool if BY_NAME[name].kind is bool else np.int64 for name in bulk.ROW_KNOBS}


def layout_rows(per: dict) -> dict | None:
    """The row arrays of one layout's choices ``per`` (:meth:`SearchSpace.per_layout_choices`, or a narrower
    copy): the grid of :data:`~autosp.cost_models.bulk.ROW_KNOBS`, every combination (:func:`rule_mask` keeps
    the canonical ones); None when a row knob has no choice."""
    axes = [np.asarray([BY_NAME[name].order_key(v) for v in per[name]], dtype=_KINDS[name]) for name in bulk.ROW_KNOBS]
    if any(len(a) == 0 for a in axes):
        return None
    grid = np.meshgrid(*axes, indexing="ij")
    return {k: g.ravel() for k, g in zip(bulk.ROW_KNOBS, grid)}


def shape_key(shape: dict) -> tuple:
    """What the rules of the knob table read of a shape group's ``shape`` (the knobs that are not rows: sp, ring,
    sequence chunks, ...): per rule, its test's verdict where it reads the shape alone, else the shape's values it
    reads. Groups with the same key and row choices have the same :func:`rule_mask`."""
    return _shape_key(tuple(shape.items()))


@functools.lru_cache(maxsize=4096)
def _shape_key(items: tuple) -> tuple:
    shape, rows = dict(items), set(bulk.ROW_KNOBS)
    return tuple(rule.holds(shape) if rule.knob not in rows
                 else rule.test(*(shape[n] for n in rule.reads)) if not rows & set(rule.reads)
                 else tuple((n, shape[n]) for n in rule.reads if n not in rows)
                 for rule in rules.RULES)


def rule_mask(per: dict, key: tuple) -> np.ndarray:
    """The rows of :func:`layout_rows` of ``per`` that break no rule of the knob table
    (:data:`autosp.contract.rules.RULES`) in a shape group of :func:`shape_key` ``key``: the numpy form of
    :func:`autosp.contract.rules.combinations`. Each rule is evaluated on the few values of the row knobs it names
    and broadcast over the grid; kept per (row choices, key), read-only."""
    return _rule_mask(tuple(tuple(per[name]) for name in bulk.ROW_KNOBS), key)


@functools.lru_cache(maxsize=1024)
def _rule_mask(choices: tuple, read: tuple) -> np.ndarray:
    position = {name: i for i, name in enumerate(bulk.ROW_KNOBS)}
    keep = np.ones([len(c) for c in choices], dtype=bool)
    for rule, shape in zip(rules.RULES, read):
        if rule.knob not in position:  # a rule of the shape alone: all rows or none
            keep &= shape
            continue
        on = np.asarray([v in rule.on for v in choices[position[rule.knob]]])
        axes = [n for n in rule.reads if n in position]
        if not axes:
            passes = np.asarray(shape)
        else:  # the rule's test over the values of the row knobs it reads, the shape's fixed
            passes = np.empty([len(choices[position[n]]) for n in axes], dtype=bool)
            for index in np.ndindex(*passes.shape):
                values = dict(shape, **{n: choices[position[n]][i] for n, i in zip(axes, index)})
                passes[index] = rule.test(*(values[n] for n in rule.reads))
        keep &= ~(_along(on, [rule.knob], position) & ~_along(passes, axes, position))
    mask = keep.ravel()
    mask.setflags(write=False)
    return mask


def _along(values: np.ndarray, axes: list, position: dict) -> np.ndarray:
    """``values`` (one axis per name of ``axes``, in their order; a scalar for none) shaped to broadcast over the
    grid of :data:`~autosp.cost_models.bulk.ROW_KNOBS` (``position``: each row knob's axis)."""
    if not axes:
        return values
    order = sorted(range(len(axes)), key=lambda i: position[axes[i]])
    values = np.transpose(values, order)
    shape = [1] * len(position)
    for k, i in enumerate(order):
        shape[position[axes[i]]] = values.shape[k]
    return values.reshape(shape)


def space_groups(space):
    """(base candidate, row arrays) per shape group of ``space``: the candidates of :meth:`SearchSpace.candidates`,
    with checkpointing and overlap as indices into CHECKPOINTING_POLICIES and OVERLAP_SCHEDULES."""
    for sp, ring in space.layouts():
        per = space.per_layout_choices(sp, ring)
        rows = None if per is None else layout_rows(per)
        if rows is None:
            continue
        for micro, seq, ep in itertools.product(per["micro_batch"], per["sequence_chunks"], per["ep"]):
            mask = rule_mask(per, shape_key(dict(sp=sp, ring=ring, micro_batch=micro, sequence_chunks=seq, ep=ep)))
            if not mask.any():
                continue
            base = space.make(sp=sp, ring=ring, micro_batch=micro, sequence_chunks=seq, ep=ep)  # row knobs at their defaults
            yield base, {k: v[mask] for k, v in rows.items()}


def row_candidate(space, base, rows: dict, i: int):
    """The Candidate of row ``i`` of a shape group (``base``: the group's shape knobs, ``rows``: its row arrays)."""
    knobs = {}
    for name in bulk.ROW_KNOBS:  # decode the row's arrays: enumerated knobs are indices into the table's values
        knob, value = BY_NAME[name], rows[name][i]
        knobs[name] = knob.values[int(value)] if knob.kind is str else knob.kind(value)
    return space.make(**dict(knobs_of(base), **knobs))  # the group's shape knobs from its base


def score_space(space):
    """Every candidate of ``space`` priced in bulk: (groups, per-row arrays). ``groups`` is [(base, rows)];
    the arrays (concatenated over the groups) are ``group``, ``row``, ``family`` (an id per (sp, ring, ep, ZeRO,
    checkpointing)), ``tps``, ``memory``, ``fits`` and ``simplicity`` (the fields of
    :func:`~autosp.planner.search.evaluator.simplicity`, one array each)."""
    groups, parts = [], []
    layouts = {}
    for base, rows in space_groups(space):
        out = bulk.estimate_group(space.model, space.hardware, space.workload, base, rows, space.profile)
        g = len(groups)
        groups.append((base, rows))
        # the family's shape: the table's family knobs that are not row arrays, and the expert placement
        # (a shape-group axis: an ep of its own gives the plan's report a best candidate per ep)
        shape = (*(getattr(base, name) for name in FAMILY if name not in rows), base.ep)
        layout = layouts.setdefault(shape, len(layouts))
        family = (layout * ZERO_STAGES + rows["zero_stage"]) * len(CHECKPOINTING_POLICIES) + rows["checkpointing"]
        k = len(family)
        # the knob table's simplicity order: row knobs from their arrays, the group's shape knobs repeated
        simple = [(rows[knob.name] if knob.name in rows else np.full(k, knob.order_key(getattr(base, knob.name))))
                  * (-1 if knob.high_is_simpler else 1) for knob in SIMPLICITY]
        parts.append((np.full(k, g), np.arange(k), family, out.tokens_per_second, out.memory, out.fits,
                      np.stack([np.asarray(a, dtype=np.int64) for a in simple])))
    names = ("group", "row", "family", "tps", "memory", "fits")
    if not parts:
        arrays = {name: np.empty(0) for name in names}
        arrays["simplicity"] = np.empty((len(SIMPLICITY), 0), dtype=np.int64)
        return groups, arrays
    arrays = {name: np.concatenate([p[i] for p in parts]) for i, name in enumerate(names)}
    arrays["simplicity"] = np.concatenate([p[6] for p in parts], axis=1)
    return groups, arrays


PER_FAMILY = 2
"""Candidates of each leading family re-scored by the scalar model: its best and its next tie, if any (bulk and
scalar scores agree to 1e-12; where they tie within :data:`TIE`, the scalar model's ranking decides among these)."""

FAMILIES = 12
"""Families whose best candidates are re-scored, best first: a plan shows its winner and the best candidates of
the next few families (planner/explain.py: top_k of them, 3 by default; ``--measure`` runs the top k)."""


def _chosen_rows(arrays: dict, top_k: int = 3) -> np.ndarray:
    """Indices of the rows worth re-scoring: per family its best (fitting: most tokens/s; none fitting: least
    memory), ties broken by simplicity as :func:`~autosp.planner.search.evaluator.rank_key` breaks them, and the
    fastest rows that do not fit."""
    fits, tps, mem, family = arrays["fits"], arrays["tps"], arrays["memory"], arrays["family"]
    score = np.where(fits, tps, -mem)  # fitting rows (tokens/s >= 0) above every row that does not fit (< 0)
    best = np.full(int(family.max()) + 1, -np.inf)
    np.maximum.at(best, family, score)
    family_best = best[family]
    tied = np.flatnonzero(score >= family_best - TIE * np.abs(family_best))
    # within each family's ties: simplest first (rank_key's order), PER_FAMILY of them
    keys = arrays["simplicity"][:, tied]
    order = np.lexsort(tuple(keys[::-1]) + (family[tied],))
    ranked = tied[order]
    fam = family[ranked]
    position = np.arange(len(ranked)) - np.searchsorted(fam, fam)  # rank inside its family
    leaders = ranked[position < PER_FAMILY]
    # the FAMILIES (at least top_k + 1) best families, by their best score
    family_order = np.argsort(-best, kind="stable")
    wanted = family_order[:max(FAMILIES, top_k + 2)]
    chosen = [leaders[np.isin(family[leaders], wanted)]]
    if (~fits).any():
        fastest = tps[~fits].max()
        slow = np.flatnonzero(~fits & (tps >= fastest * (1 - TIE)))
        # rank_key's order among rows that do not fit: least memory, then simplest
        chosen.append(slow[np.lexsort(tuple(arrays["simplicity"][:, slow][::-1]) + (mem[slow],))][:PER_FAMILY])
    return np.unique(np.concatenate(chosen))[:MAX_RESCORED]


def bulk_throughput(space, evaluator: Evaluator, seq_len: int | None = None, top_k: int = 3) -> SearchResult:
    """The exhaustive search's answer at ``seq_len`` (default: the space's), every candidate priced in bulk; the
    candidates a plan shows are then priced by the scalar model through ``evaluator`` (module docstring)."""
    seq = space.workload.seq_len if seq_len is None else seq_len
    target = space if seq == space.workload.seq_len else space.with_workload(evaluator.workload(seq))
    groups, arrays = score_space(target)
    n = len(arrays["tps"])
    if n:
        for i in _chosen_rows(arrays, top_k):
            base, rows = groups[int(arrays["group"][i])]
            evaluator(row_candidate(target, base, rows, int(arrays["row"][i])), seq)
    ranked = ranked_at(evaluator, seq)
    # nothing fits: the least-memory rows are among those re-priced (_chosen_rows), the leanest ranked first
    leanest = ranked[0][0] if n and ranked and not arrays["fits"].any() else None
    return SearchResult(strategy="exhaustive", seq_len=seq, ranked=ranked, evaluations=n, leanest=leanest,
                        details={"space_size": n, "bulk_evaluations": n, "scalar_evaluations": evaluator.calls})


def best_of(space, evaluator: Evaluator, seq_len: int | None = None):
    """The best fitting candidate of ``space`` (all of it priced in bulk; the winner and its ties re-scored by the
    scalar model through ``evaluator``), or None. For :func:`autosp.planner.search.optuna_search.family_sweep`."""
    seq = space.workload.seq_len if seq_len is None else seq_len
    groups, arrays = score_space(space)
    fits = arrays["fits"]
    if not fits.any():
        return None
    tps = np.where(fits, arrays["tps"], -np.inf)
    top = tps.max()
    best = None
    for i in np.flatnonzero(tps >= top * (1 - TIE))[:MAX_RESCORED]:
        base, rows = groups[int(arrays["group"][i])]
        cand = row_candidate(space, base, rows, int(arrays["row"][i]))
        est = evaluator(cand, seq)
        if est.fits and (best is None or est.tokens_per_second > best[1].tokens_per_second):
            best = (cand, est)
    return best[0] if best else None


__all__ = ["BULK_EXHAUSTIVE_CANDIDATES", "MAX_RESCORED", "TIE", "best_of", "bulk_throughput", "layout_rows",
           "row_candidate", "rule_mask", "score_space", "shape_key", "space_groups", "supported"]
