"""The local moves every search strategy shares: one-knob moves, the best-improvement hill climb, and the greedy
walk that sets a structure's dial knobs (:func:`complete`).

The Optuna search (:mod:`autosp.planner.search.optuna_search`) refines its trials with them; the fast search
(:mod:`autosp.planner.search.fast`) is built from them. Pure functions of a search space and an ``estimate``
callable; no optuna, no numpy.
"""

from __future__ import annotations

from dataclasses import replace

from autosp.contract.knobs import BY_NAME, DIALS, MEMORY_STEPS, fast_dials
from autosp.contract.knobs import knobs_of as table_knobs_of


def knobs_of(space, cand) -> dict:
    return table_knobs_of(cand, space.KNOBS)


def single_moves(space, cand, stronger: bool) -> list:
    """One-knob moves that save memory (``stronger``: more tiling, stronger checkpointing, activation or
    optimizer offload, a higher ZeRO stage, a smaller micro-batch) or spend it for speed (the reverse)."""
    choices = space.choices()
    knobs = knobs_of(space, cand)
    moves = []

    def step(name, up):
        """Every value of ``name`` on that side of the current one (the cost of tiling or recompute
        is rarely linear: the first step often costs the most)."""
        values = choices[name]
        if knobs[name] not in values:
            return
        i = values.index(knobs[name])
        for value in (values[i + 1:] if up else values[:i]):
            moves.append(dict(knobs, **{name: value}))

    for name in MEMORY_STEPS:  # the table's memory-saving direction of each counted or enumerated knob
        step(name, up=stronger == (BY_NAME[name].memory_step > 0))
    for name in DIALS:  # the offloads: switched on (off) where the canonical form lets them
        if BY_NAME[name].kind is bool and BY_NAME[name].memory_step and getattr(cand, name) != stronger:
            moves.append(dict(knobs, **{name: stronger}))
    out = []
    for knob_set in moves:  # make() settles the rule table (sequence chunks take kv_async where head_pipeline was)
        other = space.make(**knob_set)
        if other != cand and not space.reason(other):
            out.append(other)
    return out


def hill_climb(space, start, better, fits, faster, neighbours, max_steps: int = 25, keep=None):
    """Best-improvement local search from ``start``.

    The neighbourhood is one move (:meth:`SearchSpace.neighbours`) followed, where it helps, by one
    compensating move: a neighbour that does not fit but is ``faster`` is *repaired* with each single
    memory-saving move, and a neighbour that fits *spends* its headroom with each single speed-gaining
    move. So the climb crosses the memory wall (e.g. a larger sp that frees memory for fewer loss
    chunks) that pure one-knob moves cannot. ``keep(candidate)`` confines the climb to a region.
    """
    current = start
    for _ in range(max_steps):
        best = current
        for other in neighbours(current):
            if keep is not None and not keep(other):
                continue
            if better(other, best):
                best = other
            if fits(other):
                follow = single_moves(space, other, stronger=False)
            elif faster(other, current):
                follow = single_moves(space, other, stronger=True)
            else:
                follow = ()
            for second in follow:
                if (keep is None or keep(second)) and better(second, best):
                    best = second
        if best == current:
            return current
        current = best
    return current


DIAL_KNOBS = DIALS

_WALK_OFFLOADS = tuple(name for name in DIALS if BY_NAME[name].kind is bool and BY_NAME[name].memory_step)
"""The true/false dials that save memory (the offloads), table order: the walk switches each on."""
"""The knobs that trade speed for memory within one structure (sp, ring, ZeRO, micro-batch, checkpointing,
overlap): the knob table's dials (autosp.contract.knobs); :func:`complete` sets them for a structure."""


WALK_SPEED_FLOOR = 1e-3
"""In :func:`complete`'s walk, a step that loses less than this fraction of the tokens/s is priced as losing
exactly this much (differences that small are below the cost model's resolution)."""


def undialed(space, per: dict, **structure):
    """The fastest point of a structure: fewest chunks, no offload (as far as the space allows)."""
    dials = {k: v for k, v in fast_dials(per).items() if k not in structure}
    return space.make(**structure, **dials)


def complete(space, cand, estimate):
    """The structure of ``cand`` with its dial knobs chosen greedily, for every expert-parallel degree of the
    space (one walk each: ep trades expert-state memory and ZeRO traffic for all-to-alls, in either direction, so
    it is not a step of the walk; a dense model has one degree). Returns the fastest fitting point, or None."""
    eps = space.choices()["ep"]
    if len(eps) == 1:
        return _walk(space, replace(cand, ep=eps[0]) if cand.ep != eps[0] else cand, estimate)
    best = None
    for ep in eps:
        done = _walk(space, replace(cand, ep=ep), estimate)
        if done is not None and (best is None or estimate(done).tokens_per_second > estimate(best).tokens_per_second):
            best = done
    return best


def _walk(space, cand, estimate):
    """Start from the fastest dial (no tiling, no offload) and walk towards less memory: at each point try
    every single memory-saving step (next tiling level, an offload, the next ZeRO stage); remember the
    fastest step that fits, and continue the walk through the step that saves the most memory per unit
    of speed lost, until the walk itself fits. Returns the fastest fitting point seen, or None."""
    choices = space.choices()
    # the fastest dial the space offers (a pinned dial has one value)
    knobs = {**knobs_of(space, cand), **fast_dials(choices), "ep": cand.ep}  # complete() walks each ep apart
    current = space.make(**knobs)
    if space.reason(current):
        return None
    best = None

    def consider(c, e):
        nonlocal best
        if e.fits and (best is None or e.tokens_per_second > best[1].tokens_per_second):
            best = (c, e)

    for _ in range(16):
        est = estimate(current)
        consider(current, est)
        if est.fits:
            break
        base = knobs_of(space, current)
        options = []
        for name in (n for n in MEMORY_STEPS if n in DIALS):  # the next tiling or chunking level
            values = choices[name]
            i = values.index(base[name])
            if i + 1 < len(values):
                options.append(dict(base, **{name: values[i + 1]}))
        # each offload switched on (activation offload not beside chunk offload: both fill the host's memory); where
        # a rule of the table does not let it apply, make() settles it off again and the option is dropped
        for name in _WALK_OFFLOADS:
            if not base[name] and not (name == "offload_activations" and base["offload_chunks"]):
                options.append(dict(base, **{name: True}))
        higher = [z for z in choices["zero_stage"] if z > current.zero_stage]
        if higher:
            options.append(dict(base, zero_stage=higher[0]))
        # make() settles the rule table (sequence chunks take kv_async where head_pipeline was)
        options = [o for o in (space.make(**k) for k in options) if o != current and not space.reason(o)]
        scored = [(o, estimate(o)) for o in options]
        for o, e in scored:
            consider(o, e)
        walk = [(o, e) for o, e in scored if not e.fits]
        if not walk:
            break

        def value(item):
            o, e = item
            saved = est.memory.total - e.memory.total
            # speed changes under WALK_SPEED_FLOOR count as free: among them the larger memory saving wins (a
            # step that costs nothing but saves little, e.g. ZeRO-3 on a tied model, must not shut out one
            # that saves most of the memory for 0.02% of the speed, e.g. tiling the loss)
            lost = max(est.tokens_per_second - e.tokens_per_second, WALK_SPEED_FLOOR * est.tokens_per_second,
                       1e-300)  # 0 tokens/s: a link of 0 B/s
            return saved / lost

        current = max(walk, key=value)[0]
    return best[0] if best else None


__all__ = ["DIAL_KNOBS", "WALK_SPEED_FLOOR", "complete", "hill_climb", "knobs_of", "single_moves", "undialed"]
