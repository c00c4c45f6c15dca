"""The quick search (``--search fast``, the default of ``autosp-plan sweep``): no sampler, a few hundred
cost-model calls per request, for commands that plan hundreds of requests at once.

It is the default search's structure sweep and local refinement (:mod:`autosp.planner.search.optuna_search`) without the
TPE trials, made cheap by two properties of the cost model (the first asserted over a whole space in
tests/planner/test_sweep.py; the search's quality against the default and the exhaustive searches is measured
by ``studies/sweep_quality.py``):

- within one structure (sp, ring, ZeRO stage, checkpointing), the dial knobs (MLP and logits+loss tiling,
  activation and optimizer offload, :data:`~autosp.planner.search.moves.DIAL_KNOBS`) only ever cost time: the
  undialed point of a family (fewest chunks, no offload) bounds the tokens/s of every point of it;
- more tiling and a higher ZeRO stage only save device memory, and so do the offloads, but the two offloads
  share the node's host memory: the leanest points of a family are its most tiled ones at the highest ZeRO
  stage (and the highest below 3, where a tied model may tile its loss), with each offload on or off.

Where the bulk cost model prices the space (every catalogued cluster), ``throughput`` runs in bulk
(:mod:`autosp.planner.search.fast_bulk`): the same bounds, every family completed exactly by one bulk call per
shape group instead of the greedy walk below, which remains the search elsewhere.

``throughput``: each (sp, ring, ZeRO, checkpointing) family is bounded by its undialed point (one call);
families are completed (:func:`~autosp.planner.search.moves.complete`: the greedy dial walk) best bound first,
a family none of whose leanest points fits is skipped (memory-only calls), and the sweep stops when the best
fitting plan found is at least the next family's bound (branch and bound: by the first property no family
that could win is left out; within a family the dial walk is greedy, as in the default search). A light climb then moves the micro-batch, the overlap schedule and
the dials of the winner one knob at a time (re-choosing the dials after a structural move).

``max-ctx``: the leanest point of every (sp, ring, checkpointing, overlap) family at micro-batch 1, ZeRO 3
and ZeRO 2 (a tied model may tile its loss only below ZeRO 3) is searched for its longest context; a family
that cannot beat the record costs one memory-only call (:meth:`Evaluator.max_context` with ``must_beat``).
The fastest plan at the longest context is then the throughput search above at that length.
"""

from __future__ import annotations

import itertools

from autosp.contract.knobs import BY_NAME, LEAN_NEST, STRUCTURAL, STRUCTURE, lean_alternatives
from autosp.planner.search.evaluator import CTX_GRANULE, MAX_CTX, Evaluator, SearchResult, ranked_at
from autosp.planner.search.moves import DIAL_KNOBS, complete, undialed

CLIMB_STEPS = 8
"""Moves of the light climb after the branch and bound (it rarely takes more than two)."""

CLIMB_KNOBS = tuple(k for k in STRUCTURAL if BY_NAME[k].role == STRUCTURE and k != "checkpointing") + DIAL_KNOBS
"""What the light climb moves: the structure knobs of the table but checkpointing (ZeRO stage, micro-batch,
overlap; the layout and the checkpointing policy stay), then the dials, which are re-chosen after a structural
move."""


def _lean_points(space, per: dict, tiles: int | None = None, **structure):
    """The leanest points of a structure, one per offload pair and sequence-chunking choice
    (the most chunks, their saved tensors offloaded or kept, or no chunks: chunked layers need checkpointing
    none or full, and offloaded chunks share the host's memory with the other offloads); ``tiles``: use the
    first ``tiles`` tiling levels only (default all)."""
    mlp, loss = per["mlp_chunks"], per["loss_chunks"]
    if tiles is not None:
        mlp, loss = mlp[:min(tiles, len(mlp))], loss[:min(tiles, len(loss))]
    # each dial of the table's lean nesting (autosp.contract.knobs.LEAN_NEST), leanest value first: the most chunks
    # or none, each offload on or off (they share the host's memory), the most experts sharded or none
    alternatives = [(structure[name],) if name in structure else
                    lean_alternatives(name, per.get(name) or (BY_NAME[name].default,)) for name in LEAN_NEST]
    base = {k: v for k, v in structure.items() if k not in LEAN_NEST}
    seen = set()
    for values in itertools.product(*alternatives):
        dials = dict(zip(LEAN_NEST, values))
        # make() settles the rule table: sequence chunks take kv_async where the structure has head_pipeline (else
        # every chunked point would be invalid and a family that fits only chunked screened out)
        cand = space.make(**base, mlp_chunks=mlp[-1], loss_chunks=loss[-1], **dials)
        if cand not in seen and not space.reason(cand):
            seen.add(cand)
            yield cand


def _leanest_fits(space, evaluator, seq: int, per: dict, structure: dict, memo: dict) -> bool:
    """Whether one of the leanest points of the structure at its highest ZeRO stage (and the highest below 3),
    fits at ``seq`` (memory-only calls; ``memo`` keeps the answer per structure)."""
    higher = [z for z in per["zero_stage"] if z >= structure["zero_stage"]]
    # the highest stage is the leanest, except where ZeRO-3's gathered weights and prefetch buckets cost more than
    # it shards (on one GPU it shards nothing): the highest stage below 3 is tried too
    for zero in {higher[-1], max((z for z in higher if z < 3), default=higher[-1])}:
        key = tuple(sorted(dict(structure, zero_stage=zero).items()))
        ok = memo.get(key)
        if ok is None:
            ok = memo[key] = any(evaluator.fits(c, seq)
                                 for c in _lean_points(space, per, **dict(structure, zero_stage=zero)))
        if ok:
            return True
    return False


def _families(space):
    """(sp, ring, per-layout choices, ZeRO stage, checkpointing) of every structure family."""
    for sp, ring, per in space.usable_layouts():
        for zero, ckpt in itertools.product(per["zero_stage"], per["checkpointing"]):
            yield sp, ring, per, zero, ckpt


def _climb(space, start, estimate, key):
    """Best-improvement moves of one :data:`CLIMB_KNOBS` knob; a structural move also tries its dials
    re-chosen by :func:`complete`."""
    current = start
    choices = space.choices()
    for _ in range(CLIMB_STEPS):
        best = current
        knobs = {k: getattr(current, k) for k in space.KNOBS}
        for name in CLIMB_KNOBS:
            for value in choices[name]:
                if value == knobs[name]:
                    continue
                other = space.make(**dict(knobs, **{name: value}))
                if other == current or space.reason(other):
                    continue
                tried = [other]
                if name not in DIAL_KNOBS:
                    done = complete(space, other, estimate)
                    if done is not None:
                        tried.append(done)
                for cand in tried:
                    if key(cand) < key(best):
                        best = cand
        if best == current:
            return current
        current = best
    return current


def fast_throughput(space, evaluator: Evaluator, seq_len: int | None = None, in_bulk: bool | None = None) -> SearchResult:
    """The fastest fitting plan at ``seq_len`` (default: the space's) by branch and bound over the
    structure families, then a light climb (module docstring). Where the bulk cost model prices the space
    (``in_bulk`` None: wherever it can), each family is completed exactly in bulk
    (:mod:`autosp.planner.search.fast_bulk`); else by the scalar dial walk below."""
    from autosp.planner.search.evaluator import rank_key

    if in_bulk is None:
        from autosp.planner.search.bulk_search import supported

        in_bulk = supported(space)
    if in_bulk:
        from autosp.planner.search.fast_bulk import bulk_fast_throughput

        return bulk_fast_throughput(space, evaluator, seq_len)

    seq = space.workload.seq_len if seq_len is None else seq_len
    target = space if seq == space.workload.seq_len else space.with_workload(evaluator.workload(seq))

    def estimate(c):
        return evaluator(c, seq)

    def key(c):
        return rank_key(c, estimate(c))

    bounded = []
    for sp, ring, per, zero, ckpt in _families(target):
        structure = dict(sp=sp, ring=ring, zero_stage=zero, micro_batch=per["micro_batch"][0], checkpointing=ckpt,
                         overlap=per["overlap"][-1])
        # the family's speed bound: its fastest dial at every expert-parallel degree (one for a dense model)
        points = [c for c in (undialed(target, per, **structure, ep=ep) for ep in per.get("ep", (1,)))
                  if not target.reason(c)]
        if not points:
            continue
        cand = max(points, key=lambda c: estimate(c).tokens_per_second)
        bounded.append((estimate(cand).tokens_per_second, cand, per, structure))
    after_bounds = evaluator.calls
    bounded.sort(key=lambda item: -item[0])
    best, completed, screened, lean_memo = None, 0, 0, {}
    for bound, cand, per, structure in bounded:
        if best is not None and bound <= estimate(best).tokens_per_second:
            break  # no point of this family (or of any after it) can beat the best that fits
        if not estimate(cand).fits and not _leanest_fits(target, evaluator, seq, per, structure, lean_memo):
            screened += 1
            continue  # not even its leanest point fits
        done = complete(target, cand, estimate)
        completed += 1
        if done is not None and (best is None or key(done) < key(best)):
            best = done
    after_sweep = evaluator.calls
    if best is not None:
        _climb(target, best, estimate, key)
    return SearchResult(strategy="fast", seq_len=seq, ranked=ranked_at(evaluator, seq), evaluations=evaluator.calls,
                        details={"families": len(bounded), "families_completed": completed,
                                 "families_screened_out": screened, "bound_evaluations": after_bounds,
                                 "sweep_evaluations": after_sweep - after_bounds,
                                 "refine_evaluations": evaluator.calls - after_sweep})


def fast_longest_context(space, evaluator: Evaluator) -> int:
    """The longest context the leanest point of any family fits (micro-batch 1); every family's answer is in
    ``evaluator.max_ctx_memo``. Where a family's most-tiled point is valid only from a length beyond the
    record, its less tiled points are tried too (tiles of fewer than MIN_TILE_TOKENS are invalid)."""
    structural = space.with_workload(evaluator.workload(MAX_CTX)).lean_micro_batch()
    micro = structural.micro_batch[0]
    best = 0
    for sp, ring in structural.layouts():
        per = structural.per_layout_choices(sp, ring)
        if per is None or not per["mlp_chunks"] or not per["loss_chunks"]:
            continue
        zeros = [z for z in (3, 2) if z in per["zero_stage"]] or [per["zero_stage"][-1]]
        for ckpt, overlap, zero in itertools.product(per["checkpointing"], per["overlap"], zeros):
            structure = dict(sp=sp, ring=ring, zero_stage=zero, micro_batch=micro, checkpointing=ckpt, overlap=overlap)
            for level in range(max(len(per["mlp_chunks"]), len(per["loss_chunks"])), 0, -1):
                valid_at_record = True
                for cand in _lean_points(structural, per, tiles=level, **structure):
                    best = max(best, evaluator.max_context(cand, must_beat=best))
                    valid_at_record = structural.min_seq_len(cand) <= best + CTX_GRANULE
                if valid_at_record:
                    break  # valid at the record: the less tiled points are no leaner
    return best


def fast_max_ctx(space, evaluator: Evaluator) -> SearchResult:
    best_ctx = fast_longest_context(space, evaluator)
    if best_ctx == 0:
        return SearchResult(strategy="fast", seq_len=0, ranked=[], evaluations=evaluator.calls,
                            max_ctx=dict(evaluator.max_ctx_memo))
    result = fast_throughput(space, evaluator, seq_len=best_ctx)
    result.max_ctx = dict(evaluator.max_ctx_memo)
    return result


__all__ = ["CLIMB_KNOBS", "CLIMB_STEPS", "fast_longest_context", "fast_max_ctx", "fast_throughput", "undialed"]
