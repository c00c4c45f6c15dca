"""The quick search (:mod:`autosp.planner.search.fast`) priced in bulk: the same branch and bound over the structure
families and the same light climb, each family completed exactly instead of by the greedy dial walk.

A *cell* is one shape group of the bulk cost model (:func:`autosp.cost_models.bulk.estimate_group`) at one overlap
schedule: a layout (sp, ring), an expert-parallel degree, a micro-batch, a sequence-chunk count and an overlap
schedule, with every ZeRO stage, checkpointing policy, tiling level and offload of that layout as its rows. One bulk
call prices a cell (one vectorised call, whatever its number of rows), so the search pays per cell, not per candidate:

- every layout's first cell (micro-batch and sequence chunks at their first choice, the last overlap schedule) is
  queued with its bound: its undialed points without checkpointing, one per ZeRO stage (scalar, tokens/s alone;
  :mod:`autosp.planner.search.fast`'s first property: the dials and a checkpointing policy only cost time). Cells
  are priced best bound first while a bound beats the best fitting point found; a priced cell gives every one of its
  (ZeRO, checkpointing) families' best fitting point exactly;
- a layout's sequence-chunked cells (head_pipeline gives way to kv_async there) are queued when a family of its first
  cell has a point faster than its best fitting one (checkpointing none or full: a chunked layer admits no other
  policy), bounded by that point; when such a cell reaches the head of the queue its own undialed points bound it
  (lazily: most are then dropped unpriced);
- a larger micro-batch only adds memory and at most scales tokens/s with it (:meth:`Cells.cap`): no point of a cell
  beats micro / m times the best fitting point of the same cell at a smaller micro-batch m, and none fits where
  nothing fits there (nor where nothing fits at another overlap schedule: the schedule changes no memory); nor
  does any beat the compute ceiling (bulk.Bulk.ceiling) of the points that fit there, at any overlap schedule: a
  larger micro-batch can at most hide the step's fixed costs, never shrink its compute per token;
- every layout's micro-batch then climbs one step at a time while that helps the layout, past MICRO_PATIENCE steps
  that do not (a layout that loses at the first micro-batch may win at a larger one), and the winner's micro-batch
  and overlap schedule move as in the scalar search's light climb (ZeRO stage, checkpointing and the dials are
  already exact within a cell).

Within the cells it prices, the search is exact: every family's best fitting point, where the scalar search's walk
(:func:`autosp.planner.search.moves.complete`) finds one greedily. The candidates a plan shows (the winner and its
ties, the best of the leading families, the fastest point that does not fit) are then priced by the scalar model
through the evaluator, as in :mod:`autosp.planner.search.bulk_search`, so the plan, its runner-ups and its notes come
from the reference model.
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass

import numpy as np

from autosp.contract import rules
from autosp.contract.specs import CHECKPOINTING_POLICIES, Candidate
from autosp.cost_models import bulk
from autosp.cost_models.estimate import tokens_per_second_over_zero_stages
from autosp.cost_models.shapes import Shapes
from autosp.planner.search.bulk_search import TIE, ZERO_STAGES, layout_rows, row_candidate, rule_mask, shape_key
from autosp.planner.search.evaluator import Evaluator, SearchResult, ranked_at
from autosp.planner.search.moves import undialed
from autosp.planner.search.space import pin_reason

POLICIES = len(CHECKPOINTING_POLICIES)
CHUNKED_POLICIES = tuple(i for i, p in enumerate(CHECKPOINTING_POLICIES)
                         if rules.allows({"checkpointing": p, "sequence_chunks": 2}))
"""The checkpointing policies a sequence-chunked layer admits (the rule table, at any count of chunks above
one), as indices."""


def cell_overlap(sp: int, ring: int, seq: int, overlap: str) -> str:
    """The overlap schedule of the cell of a structure with ``overlap`` at ``seq`` sequence chunks: as the rule table
    settles it (head_pipeline gives way to kv_async with chunks)."""
    return rules.settled_value("overlap", dict(overlap=overlap, sp=sp, ring=ring, sequence_chunks=seq))

CLIMB_STEPS = 8
"""Moves of the light climb (as the scalar search's)."""

MICRO_PATIENCE = 1
"""Micro-batch steps of a layout's climb that may fail to improve it before the climb stops: a step can lose
(more tiling to fit) where the next one wins (its larger batch pays the tiling back), e.g. Llama-3.1-8B at 19k tokens
on one H100 under Inductor's fused loss: micro-batch 2 loses to 1, 8 beats both by 7 %."""

RUNNER_UP_FAMILIES = 6
"""The best points of this many leading (sp, ring, ZeRO, checkpointing) families go to the scalar model besides the
winner: the plan's runner-ups are the best of other families (planner/explain.py)."""

MAX_TIES = 64
"""At most this many bulk ties of the winner go to the scalar model (whose ranking then decides among them)."""


@dataclass(frozen=True)
class Cell:
    """One priced shape group at one overlap schedule: its base candidate, row arrays and bulk results, and each
    row's family (ZeRO stage x policies + checkpointing index)."""

    key: tuple  # (sp, ring, ep, micro_batch, sequence_chunks, overlap)
    base: Candidate
    rows: dict
    tps: np.ndarray
    memory: np.ndarray
    fits: np.ndarray
    family: np.ndarray
    ceiling: np.ndarray
    """Per row, the tokens/s it cannot beat at any micro-batch from this one up (bulk.Bulk.ceiling)."""
    capacity: float
    index: np.ndarray | None = None
    """The rows of the cell's full row set priced here, where only those that can fit were (:meth:`Cells.get`);
    None: every row."""
    bound: float = np.inf
    """The bound the cell was priced under (tokens/s no point of it beats): what a partial cell's unpriced rows are
    bounded by."""

    @functools.cached_property
    def fit_tps(self) -> np.ndarray:
        """Tokens/s where the point fits, -inf elsewhere."""
        return np.where(self.fits, self.tps, -np.inf)

    @functools.cached_property
    def best_fitting(self) -> int | None:
        """The row of the fastest fitting point, or None."""
        return int(np.argmax(self.fit_tps)) if self.fits.any() else None

    @functools.cached_property
    def may_fit(self) -> np.ndarray:
        """The rows that fit here, widened by bulk.ROUNDING_SLACK: the only rows that can fit at a larger
        micro-batch (memory grows with it)."""
        return np.flatnonzero(self.memory <= self.capacity * (1 + bulk.ROUNDING_SLACK))

    @functools.cached_property
    def ceiling_of_fitting(self) -> float:
        """The tokens/s no row that can fit (:attr:`may_fit`) beats here or at any larger micro-batch, whatever the
        overlap schedule (bulk.Bulk.ceiling: the schedule changes neither the compute nor the memory); -inf when
        none can fit."""
        rows = self.may_fit
        return float(self.ceiling[rows].max()) if len(rows) else -np.inf

    @functools.cached_property
    def family_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """(fastest point, fastest fitting point) per family id, tokens/s (-inf where none)."""
        fastest = np.full(ZERO_STAGES * POLICIES, -np.inf)
        fitting = np.full(ZERO_STAGES * POLICIES, -np.inf)
        np.maximum.at(fastest, self.family, self.tps)
        np.maximum.at(fitting, self.family, self.fit_tps)
        return fastest, fitting


@functools.lru_cache(maxsize=512)
def _cell_rows(choices: tuple, key: tuple):
    """(row arrays, family ids, the rows' :class:`~autosp.cost_models.bulk.RowSet`) of a cell whose row knobs take
    ``choices`` ((name, values) pairs, the layout's choices at one overlap schedule) in a shape of
    :func:`~autosp.planner.search.bulk_search.shape_key` ``key``, or None when no row is canonical. A pure function
    of its arguments, kept across the requests of a process (a sweep's requests share most layouts' choices); the
    arrays are read-only."""
    per = dict(choices)
    grid = layout_rows(per)
    if grid is None:
        return None
    mask = rule_mask(per, key)
    if not mask.any():
        return None
    rows = {k: v[mask] for k, v in grid.items()}
    family = np.asarray(rows["zero_stage"], dtype=np.int64) * POLICIES + rows["checkpointing"]
    for array in (*rows.values(), family):
        array.setflags(write=False)
    return rows, family, bulk.row_set(rows)


class Cells:
    """The cells of one space, priced on first use and kept (the climb comes back to them)."""

    def __init__(self, space, partial: bool = False):
        """``partial``: price a cell whose same cell at a smaller micro-batch is priced on the rows that fit there
        only (memory grows with the micro-batch: no other row can fit), as the search does; the rest of the cell
        is then known by its bound alone."""
        self.space = space
        self.priced: dict[tuple, Cell | None] = {}
        self.rows = 0
        self.partial = partial

    def per(self, sp: int, ring: int) -> dict | None:
        return self.space.per_layout_choices(sp, ring)  # kept by the space

    def get(self, sp: int, ring: int, ep: int, micro: int, seq: int, overlap: str,
            bound: float = np.inf) -> Cell | None:
        """The priced cell, or None when it has no valid candidate. ``bound``: the tokens/s none of its points beats
        (the search's bound when it prices the cell)."""
        key = (sp, ring, ep, micro, seq, overlap)
        if key in self.priced:
            return self.priced[key]
        cell = None
        per = self.per(sp, ring)
        if per is not None and overlap in per["overlap"]:
            choices = tuple((name, (overlap,) if name == "overlap" else per[name]) for name in bulk.ROW_KNOBS)
            found = _cell_rows(choices, shape_key(dict(sp=sp, ring=ring, sequence_chunks=seq)))
            if found is not None:
                rows, family, row_set = found
                index = self._may_fit(key) if self.partial else None
                if index is not None:
                    rows = {name: values[index] for name, values in rows.items()}
                    family, row_set = family[index], row_set.subset(index)
                space = self.space
                base = space.make(sp=sp, ring=ring, micro_batch=micro, sequence_chunks=seq, ep=ep)
                out = bulk.estimate_group(space.model, space.hardware, space.workload, base, row_set, space.profile)
                cell = Cell(key, base, rows, out.tokens_per_second, out.memory, out.fits, family, out.ceiling,
                            out.capacity, index, bound)
                self.rows += len(family)
        self.priced[key] = cell
        return cell

    def _may_fit(self, key: tuple) -> np.ndarray | None:
        """The rows of cell ``key`` that can fit: those that fit in the same cell at the largest smaller
        micro-batch priced (the same row set: same layout, chunks and overlap schedule), widened by
        bulk.ROUNDING_SLACK; None where no such cell is priced or none of its rows fits."""
        sp, ring, ep, micro, seq, overlap = key
        for m in reversed(self.per(sp, ring)["micro_batch"]):
            smaller = self.priced.get((sp, ring, ep, m, seq, overlap)) if m < micro else None
            if smaller is None:
                continue
            may = smaller.may_fit
            if len(may) == 0:
                return None
            return may if smaller.index is None else smaller.index[may]
        return None

    def cap(self, sp: int, ring: int, ep: int, micro: int, seq: int, overlap: str) -> float:
        """:meth:`bounds`' bound on this cell."""
        return self.bounds(sp, ring, ep, micro, seq, overlap)[0]

    def bounds(self, sp: int, ring: int, ep: int, micro: int, seq: int, overlap: str) -> tuple[float, float]:
        """(A bound on this cell's fitting points from the same cell at a smaller micro-batch, where priced: a point
        that fits at ``micro`` fits at the smaller one m too (memory grows with the micro-batch) and trains at most
        micro / m times its tokens/s there (the step time does not shrink as the micro-batch grows), and no more
        than the compute ceiling of the points that fit there (:attr:`Cell.ceiling_of_fitting`; at another overlap
        schedule too, which changes neither compute nor memory, and at this micro-batch: it halves the cells the
        layouts' micro-batch climb prices, the 1,000-request sweep's plans unchanged); -inf when nothing fits
        there, so the cell is skipped even before any point fits (an infeasible request would otherwise price
        every micro-batch of every layout). Infinite when no such cell is priced. And its ceiling part, which holds
        at every larger micro-batch as well: the micro / m scaling bound grows with the micro-batch, so it prunes
        this micro-batch only.)"""
        cap = ceiling = np.inf
        per = self.per(sp, ring)
        for m in per["micro_batch"]:
            if m > micro:
                break
            for o in per["overlap"]:
                if (m, o) == (micro, overlap):
                    continue
                cell = self.priced.get((sp, ring, ep, m, seq, o))
                if cell is None:
                    continue
                if cell.best_fitting is None:
                    return -np.inf, -np.inf
                ceiling = min(ceiling, cell.ceiling_of_fitting)
                if o == overlap:
                    cap = min(cap, micro / m * float(cell.tps[cell.best_fitting]))
        return min(cap, ceiling), ceiling

    def cells(self) -> list[Cell]:
        return [c for c in self.priced.values() if c is not None]


class _Search:
    """The best-first branch and bound over cells (module docstring): ``best`` is (tokens/s, cell, row) of the
    fastest fitting point priced so far; ``queue`` holds the cells not priced yet, by their bound."""

    def __init__(self, cells: Cells):
        self.cells = cells
        self.best: tuple[float, Cell | None, int] = (-np.inf, None, -1)
        self.queue: list = []  # heap of (-bound, order, cell key, structure, first)
        self.offered: set = set()
        self.bound_evaluations = 0
        self.deferred: dict[tuple, list] = {}  # structure -> its first cells whose chunked cells wait
        self.first_structures: list = []  # (sp, ring, overlap) of every layout's first structure
        self.reached: dict[tuple, tuple] = {}  # cell key -> the (sp, ring, micro-batch, overlap) structure it was reached by
        self.order = 0

    def _push(self, bound: float, key: tuple, structure: tuple, first: bool, tight: bool = True) -> None:
        """Queue a cell with ``bound``; a bound that is not ``tight`` is replaced by the cell's own (:meth:`_bound`)
        when it reaches the head of the queue."""
        self.order += 1
        heapq.heappush(self.queue, (-bound, self.order, key, structure, first, tight))

    def _bound(self, sp: int, ring: int, ep: int, micro: int, seq: int, overlap: str) -> float:
        """The tokens/s no point of a cell can beat: its undialed points without checkpointing (or with the least
        a pin leaves), one per ZeRO stage (scalar estimates; the dials and a checkpointing policy only cost time)."""
        per = self.cells.per(sp, ring)
        policies = ("none",) if "none" in per["checkpointing"] else per["checkpointing"]
        space, top, shapes = self.cells.space, -np.inf, None
        for policy in policies:
            first = undialed(space, per, sp=sp, ring=ring, ep=ep, zero_stage=per["zero_stage"][0], micro_batch=micro,
                             checkpointing=policy, overlap=overlap, sequence_chunks=seq)
            # no offload: canonical at every stage (built from the fields: 6 us against dataclasses.replace's 13 us,
            # python -m timeit on a Candidate)
            stages = [first if zero == first.zero_stage else Candidate(**{**first.__dict__, "zero_stage": zero})
                      for zero in per["zero_stage"]]
            # the validity rules read no ZeRO stage (space.invalid_reason); only a pin tells the stages apart
            if space.reason(first) or (space.fixed and any(pin_reason(cand, space.fixed) for cand in stages)):
                return np.inf  # no undialed point to bound the cell by: price it
            if shapes is None:  # the cell's shape group: one Shapes for all its undialed points
                shapes = Shapes(space.model, space.workload, first, space.profile)
            top = max(top, *tokens_per_second_over_zero_stages(space.model, space.hardware, space.workload, stages,
                                                                space.profile, shapes))
            self.bound_evaluations += len(stages)
        return top

    def offer(self, sp: int, ring: int, micro: int, overlap: str) -> None:
        """Queue the first cells of a structure (one per expert-parallel degree), each with its bound."""
        structure = (sp, ring, micro, overlap)
        if structure in self.offered:
            return
        self.offered.add(structure)
        per = self.cells.per(sp, ring)
        seq = per["sequence_chunks"][0]
        for ep in per["ep"]:
            key = (sp, ring, ep, micro, seq, cell_overlap(sp, ring, seq, overlap))
            self._push(self._bound(*key), key, structure, True)

    def _take(self, cell: Cell, structure: tuple, first: bool) -> None:
        self.reached.setdefault(cell.key, structure)
        row = cell.best_fitting
        if row is not None and cell.tps[row] > self.best[0]:
            self.best = (float(cell.tps[row]), cell, row)
        if not first or len(self.cells.per(*structure[:2])["sequence_chunks"]) == 1:
            return
        if structure in self.deferred:  # a layout's micro-batch step: its chunked cells only if the step helps
            self.deferred[structure].append(cell)
            return
        self._chunked_of(cell, structure)

    def _chunked_of(self, cell: Cell, structure: tuple) -> None:
        # the chunked cells of the structure: a family whose fastest point fits is done; the others bound them by
        # that point (checkpointing none or full: a chunked layer admits no other policy). A partial cell's
        # unpriced rows are known only by its bound, which bounds every family's chunked points too.
        if cell.index is not None:
            self._queue_chunked(cell.key, structure, cell.bound)
            return
        fastest, fitting = cell.family_stats
        families = np.arange(len(fastest))
        open_ = (fastest > fitting) & np.isin(families % POLICIES, CHUNKED_POLICIES)
        if open_.any():
            self._queue_chunked(cell.key, structure, float(fastest[open_].max()))

    def _queue_chunked(self, key: tuple, structure: tuple, bound: float) -> None:
        """Queue the sequence-chunked cells of a first cell ``key`` with ``bound``."""
        sp, ring, ep, micro = key[:4]
        for seq in self.cells.per(sp, ring)["sequence_chunks"][1:]:
            self._push(bound, (sp, ring, ep, micro, seq, cell_overlap(sp, ring, seq, structure[3])), structure, False,
                       False)

    def drain(self) -> None:
        """Price the queued cells, best bound first, while a bound beats the best fitting point."""
        while self.queue:
            negative, _, key, structure, first, tight = heapq.heappop(self.queue)
            if -negative <= self.best[0]:
                self.queue.clear()  # every bound left is lower
                return
            if not tight:  # a chunked cell's family bound: its own undialed points may bound it lower
                self._push(min(-negative, self._bound(*key)), key, structure, first)
                continue
            if self.cells.cap(*key) <= self.best[0]:
                if first:  # its chunked cells may still win: bounded by the first cell's bound
                    self._queue_chunked(key, structure, -negative)
                continue
            cell = self.cells.get(*key, bound=-negative)
            if cell is not None:
                self._take(cell, structure, first)

    def layouts_climb(self) -> None:
        """Every layout's micro-batch at its first overlap schedule, one step up at a time while that improves the
        layout's best (or has failed to for at most MICRO_PATIENCE steps) and its first cell can still win
        (:meth:`Cells.bounds`): a layout that loses at the first micro-batch may win at a larger one (the light climb
        moves the winner's only). A step's sequence-chunked cells are priced only once its first cell has improved
        the layout (a larger micro-batch needs more memory: where the smaller one needed chunks to fit, the step
        rarely helps)."""
        for sp, ring, overlap in self.first_structures:
            per = self.cells.per(sp, ring)
            seq = per["sequence_chunks"][0]
            top, misses = self.layout_best(sp, ring), 0
            for micro in per["micro_batch"][1:]:
                caps, ceilings = zip(*(self.cells.bounds(sp, ring, ep, micro, seq, cell_overlap(sp, ring, seq, overlap))
                                       for ep in per["ep"]))
                if max(ceilings) <= self.best[0]:
                    break  # no larger micro-batch of this layout can win either
                if max(caps) <= self.best[0]:
                    continue  # this one cannot (micro / m times a smaller one's best); a larger one still may
                structure = (sp, ring, micro, overlap)
                self.deferred[structure] = []
                self.offer(*structure)
                self.drain()
                now = self.layout_best(sp, ring)
                if now <= top:
                    misses += 1
                    if misses > MICRO_PATIENCE:
                        break
                    continue
                top, misses = now, 0
                for cell in self.deferred.pop(structure):  # the step helps: its chunked cells may help more
                    self._chunked_of(cell, structure)
                self.drain()

    def layout_best(self, sp: int, ring: int) -> float:
        """The fastest fitting point of a layout priced so far, tokens/s (-inf where none)."""
        return max((float(c.tps[c.best_fitting]) for c in self.cells.cells()
                    if c.key[:2] == (sp, ring) and c.best_fitting is not None), default=-np.inf)

    def climb(self, steps: int = CLIMB_STEPS) -> None:
        """Best-improvement moves of the winner's micro-batch (to the next value either way) or overlap schedule
        (its layout stays). No overlap move goes to none where kv_async is a choice: it exposes all of its
        all-to-alls, kv_async all but what the Q projection hides, at the same memory."""
        for _ in range(steps):
            winner = self.best[1]
            if winner is None:
                return
            sp, ring, micro, overlap = self.reached[winner.key]
            per = self.cells.per(sp, ring)
            micros = per["micro_batch"]
            i = micros.index(micro)
            moves = [(m, overlap) for m in micros[max(0, i - 1):i + 2]]
            moves += [(micro, o) for o in per["overlap"] if not (o == "none" and "kv_async" in per["overlap"])]
            for m, o in moves:
                self.offer(sp, ring, m, o)
                for cell in self.deferred.pop((sp, ring, m, o), ()):  # a step of layouts_climb's, now in full
                    self._chunked_of(cell, (sp, ring, m, o))
            self.drain()
            if self.best[1] is winner:
                return


def _shown_rows(cells: list[Cell], best_tps: float) -> list[tuple[Cell, int]]:
    """The points the scalar model re-prices (module docstring): the winner's bulk ties, the best fitting point of
    each of the leading families, and the fastest point that does not fit where it beats the winner (or, when
    nothing fits, the fastest and the leanest points)."""
    ties, heads = [], {}
    fastest_unfit = leanest = None
    for cell in cells:
        if np.isfinite(best_tps) and cell.best_fitting is not None:
            ties += [(-float(cell.tps[i]), cell.key, int(i), cell)
                     for i in np.flatnonzero(cell.fit_tps >= best_tps * (1 - TIE))]
            fitting = cell.family_stats[1]
            for f in np.flatnonzero(np.isfinite(fitting)):
                family = (cell.key[:2], int(f))  # (sp, ring), ZeRO stage x policies + checkpointing
                if family not in heads or fitting[f] > heads[family][0]:
                    heads[family] = (float(fitting[f]), cell, int(f))
        if not cell.fits.all():
            i = int(np.argmax(np.where(cell.fits, -np.inf, cell.tps)))
            if fastest_unfit is None or cell.tps[i] > fastest_unfit[0]:
                fastest_unfit = (float(cell.tps[i]), cell, i)
        i = int(np.argmin(cell.memory))
        if leanest is None or cell.memory[i] < leanest[0]:
            leanest = (float(cell.memory[i]), cell, i)
    ties.sort(key=lambda t: t[:3])
    shown = [(cell, i) for _, _, i, cell in ties[:MAX_TIES]]
    for _, cell, f in sorted(heads.values(), key=lambda t: -t[0])[:RUNNER_UP_FAMILIES]:
        shown.append((cell, int(np.argmax(np.where(cell.family == f, cell.fit_tps, -np.inf)))))
    if fastest_unfit is not None and fastest_unfit[0] > best_tps:
        shown.append(fastest_unfit[1:])
    if not np.isfinite(best_tps) and leanest is not None:
        shown.append(leanest[1:])
    return shown


def bulk_fast_throughput(space, evaluator: Evaluator, seq_len: int | None = None) -> SearchResult:
    """The fastest fitting plan at ``seq_len`` (default: the space's) by branch and bound over cells priced in bulk,
    then the light climb (module docstring). The space's hardware must be one the bulk model prices
    (:func:`autosp.planner.search.bulk_search.supported`)."""
    seq = space.workload.seq_len if seq_len is None else seq_len
    target = space if seq == space.workload.seq_len else space.with_workload(evaluator.workload(seq))
    start = evaluator.calls
    cells = Cells(target, partial=True)
    search = _Search(cells)
    layouts = families = 0
    for sp, ring, per in target.usable_layouts():
        layouts += 1
        families += len(per["zero_stage"]) * len(per["checkpointing"]) * len(per["ep"])
        search.offer(sp, ring, per["micro_batch"][0], per["overlap"][-1])
        search.first_structures.append((sp, ring, per["overlap"][-1]))
    search.drain()
    swept = len(cells.cells())
    search.layouts_climb()
    search.climb()
    for cell, i in _shown_rows(cells.cells(), search.best[0]):
        evaluator(row_candidate(target, cell.base, cell.rows, i), seq)
    scalar = evaluator.calls - start
    # nothing fits: every cell at the first micro-batch was priced (no bound prunes below -inf), so the leanest row
    # (shown: the scalar model ranks it first) has the space's least memory (memory grows with the micro-batch; no
    # overlap schedule changes it), which the infeasible request's message reports (planner/diagnose.py)
    ranked = ranked_at(evaluator, seq)
    leanest = ranked[0][0] if ranked and not np.isfinite(search.best[0]) else None
    return SearchResult(strategy="fast", seq_len=seq, ranked=ranked, leanest=leanest,
                        evaluations=cells.rows + search.bound_evaluations + evaluator.calls,
                        details={"layouts": layouts, "families": families, "cells_priced": len(cells.cells()),
                                 "climb_cells": len(cells.cells()) - swept,
                                 "bulk_evaluations": cells.rows, "bound_evaluations": search.bound_evaluations,
                                 "scalar_evaluations": scalar})


__all__ = ["CLIMB_STEPS", "Cell", "Cells", "MAX_TIES", "RUNNER_UP_FAMILIES", "bulk_fast_throughput", "cell_overlap"]
