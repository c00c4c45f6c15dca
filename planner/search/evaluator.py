"""Scoring candidates with the cost model: memoised, counted, and shared by every search strategy.

The searches (:mod:`autosp.planner.search.exhaustive`, :mod:`autosp.planner.search.optuna_search`) only ever talk to an
:class:`Evaluator`, so they rank candidates the same way and count cost-model calls the same way.

Ranking (throughput objective): a candidate that fits beats one that does not; among those that fit,
more tokens/s wins; exact ties go to the simpler candidate (:func:`simplicity`), then to less memory.

Maximum context: :meth:`Evaluator.max_context` finds the longest sequence (a multiple of
:data:`CTX_GRANULE` tokens) a candidate fits, by doubling then bisecting. It assumes memory grows with
the sequence length, which holds for every term of the cost model.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from autosp.contract.knobs import simplicity_key
from autosp.contract.specs import Candidate, Estimate, Workload
from autosp.planner.search.limits import CTX_GRANULE, MAX_CTX  # noqa: F401  (re-exported: the searches import them here)



def simplicity(cand: Candidate) -> tuple:
    """Sort key: fewer moving parts first (used only to break exact ties deterministically): the knob table's
    simplicity order (autosp.contract.knobs.SIMPLICITY)."""
    return simplicity_key(cand)


def rank_key(cand: Candidate, est: Estimate) -> tuple:
    """Smaller is better: fitting first, then tokens/s, then simplicity, then memory."""
    if est.fits:
        return (0, -est.tokens_per_second, simplicity(cand), est.memory.total)
    return (1, est.memory.total - est.capacity_bytes, simplicity(cand))


@dataclass
class Evaluator:
    """Calls ``estimate_fn(model, hw, workload, candidate)`` at most once per (candidate, seq_len); by default
    the cost model with the space's graph-derived profile when it has one."""

    space: object  # autosp.planner.search.space.SearchSpace
    estimate_fn: object = None
    fits_fn: object = None
    estimate_calls: int = 0
    fits_calls: int = 0
    memo: dict = field(default_factory=dict)
    fits_memo: dict = field(default_factory=dict)
    max_ctx_memo: dict = field(default_factory=dict)

    def __post_init__(self):
        profile = getattr(self.space, "profile", None)  # a graph-derived ModelProfile, or None (analytic)
        if self.estimate_fn is None:
            from autosp.cost_models import estimate

            self.estimate_fn = estimate if profile is None else functools.partial(estimate, profile=profile)
        if self.fits_fn is None:
            from autosp.cost_models import fits

            self.fits_fn = fits if profile is None else functools.partial(fits, profile=profile)

    @property
    def calls(self) -> int:
        """Cost-model calls so far: full estimates plus memory-only feasibility checks."""
        return self.estimate_calls + self.fits_calls

    def workload(self, seq_len: int | None = None) -> Workload:
        base = self.space.workload
        return base if seq_len is None or seq_len == base.seq_len else replace(base, seq_len=seq_len)

    def __call__(self, cand: Candidate, seq_len: int | None = None) -> Estimate:
        seq = self.space.workload.seq_len if seq_len is None else seq_len
        key = (cand, seq)
        est = self.memo.get(key)
        if est is None:
            est = self.estimate_fn(self.space.model, self.space.hardware, self.workload(seq), cand)
            self.estimate_calls += 1
            self.memo[key] = est
        return est

    def evaluated(self, seq_len: int | None = None) -> dict[Candidate, Estimate]:
        seq = self.space.workload.seq_len if seq_len is None else seq_len
        return {cand: est for (cand, s), est in self.memo.items() if s == seq}

    def fits(self, cand: Candidate, seq_len: int) -> bool:
        """Valid at ``seq_len`` and within memory (a memory-only cost-model call unless already scored)."""
        key = (cand, seq_len)
        if key in self.memo:
            return self.memo[key].fits
        ok = self.fits_memo.get(key)
        if ok is None:
            workload = self.workload(seq_len)
            ok = not self.space.reason(cand, workload) and self.fits_fn(self.space.model, self.space.hardware,
                                                                         workload, cand)
            self.fits_calls += 1
            self.fits_memo[key] = ok
        return ok

    def max_context(self, cand: Candidate, must_beat: int = 0) -> int:
        """Longest multiple of CTX_GRANULE tokens ``cand`` fits, or 0.

        With ``must_beat`` > 0 the answer is exact only when it exceeds ``must_beat``; a candidate that
        cannot fit ``must_beat + CTX_GRANULE`` tokens costs one evaluation and returns 0 (it cannot win).
        """
        if cand in self.max_ctx_memo:
            return self.max_ctx_memo[cand]
        g = CTX_GRANULE
        shortest = -(-self.space.min_seq_len(cand) // g) * g  # tiled candidates are valid only from here
        start = max((must_beat // g) * g + g, shortest, g)
        if not self.fits(cand, start):
            if must_beat == 0:
                self.max_ctx_memo[cand] = 0
            return 0
        lo, hi = start, None  # lo fits; hi (once known) does not
        probe = start * 2
        while probe <= MAX_CTX:
            if not self.fits(cand, probe):
                hi = probe
                break
            lo, probe = probe, probe * 2
        if hi is None:
            hi = min(probe, MAX_CTX + g)
        lo_units, hi_units = lo // g, hi // g
        while hi_units - lo_units > 1:
            mid = (lo_units + hi_units) // 2
            if self.fits(cand, mid * g):
                lo_units = mid
            else:
                hi_units = mid
        self.max_ctx_memo[cand] = lo_units * g
        return lo_units * g


@dataclass
class SearchResult:
    """What a search strategy found, at sequence length ``seq_len``."""

    strategy: str
    seq_len: int
    ranked: list  # [(Candidate, Estimate)] evaluated at seq_len, best first
    evaluations: int
    trials: int = 0
    max_ctx: dict = field(default_factory=dict)  # Candidate -> longest context it fits (max-ctx only)
    details: dict = field(default_factory=dict)
    study: object = None  # the optuna Study behind an Optuna search (measured trials are recorded in it)
    leanest: object = None
    """Where nothing fits and the search priced the memory of every point of the space (the quick search in bulk):
    the Candidate with the least memory at ``seq_len``, priced through the evaluator. None: not known."""

    @property
    def best(self):
        """(Candidate, Estimate) of the winner, or None when nothing fits."""
        if self.ranked and self.ranked[0][1].fits:
            return self.ranked[0]
        return None


def ranked_at(evaluator: Evaluator, seq_len: int | None = None) -> list:
    """The candidates scored at ``seq_len``, best first; with pins (``--fix``), only those that keep every pin:
    every strategy's ranking comes from here, so no plan can come out that drops a pin."""
    items = evaluator.evaluated(seq_len).items()
    fixed = getattr(evaluator.space, "fixed", ())
    if fixed:
        from autosp.planner.search.space import pin_reason

        items = [(c, e) for c, e in items if pin_reason(c, fixed) is None]
    return sorted(items, key=lambda item: rank_key(*item))


class _NoBar:
    def update(self, n=1):
        pass

    def set_postfix_str(self, s):
        pass

    def close(self):
        pass


def progress_bar(total: int | None, desc: str):
    """A tqdm bar on stderr when stderr is a terminal; it appears only if the work lasts > 0.5 s."""
    import sys

    if not sys.stderr.isatty():
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with optuna
        return _NoBar()
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, delay=0.5, dynamic_ncols=True)


__all__ = ["CTX_GRANULE", "MAX_CTX", "Evaluator", "SearchResult", "progress_bar", "rank_key", "ranked_at",
           "simplicity"]
