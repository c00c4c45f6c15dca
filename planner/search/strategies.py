"""The search strategies behind one interface, chosen from a table (:data:`STRATEGIES`).

A strategy takes a :class:`SearchJob` (the space, its evaluator and the run's settings) and returns a
:class:`~autosp.planner.search.evaluator.SearchResult`; it also says, in one line, how it searched (the plan's
``search.sampler``). Adding a strategy is a class and a row of the table; nothing else picks by name.

- ``optuna``: TPE trials, structure sweep, local refinement (:mod:`.optuna_search`); the default.
- ``fast``: branch and bound over the structure families, no sampler (:mod:`.fast`).
- ``exhaustive``: every candidate scored (:mod:`.exhaustive`), in bulk with numpy where the space allows it
  (:mod:`.bulk_search`).

:func:`choose` is the one rule that changes the strategy asked for: an Optuna search of a space that costs less to
score whole is answered exhaustively (the exact optimum, for less time). Importing this module imports neither
optuna nor numpy; each strategy imports its own when it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from autosp.planner.search.evaluator import Evaluator, SearchResult
from autosp.planner.search.optuna_search import FAMILY_SWEEP_EVALUATIONS

EVALUATIONS_PER_TRIAL = 75
"""What one Optuna trial costs, in cost-model evaluations: TPE's sampling time per trial over the time of
one evaluation inside the exhaustive search (studies/search_quality.py measures both: 4.2 ms and 0.057 ms,
a ratio of 75, in studies/results/search_quality_seed0_n150_before_family_sweep.txt; 74 and 56 in earlier
runs)."""

OPTUNA_FIXED_EVALUATIONS = 2_700 + FAMILY_SWEEP_EVALUATIONS
"""The cost-model calls an Optuna search makes besides its trials: the structure sweep and the local
refinement (a median of 2,755 calls, the trials' included, before the family completion existed:
studies/results/search_quality_seed0_n150_before_family_sweep.txt), and at most FAMILY_SWEEP_EVALUATIONS
for the family completion."""

SECONDS_PER_EVALUATION = 1e-4
"""One cost-model evaluation inside the exhaustive search, rounded up (0.044 to 0.103 ms in the runs of
studies/search_quality.py): how many evaluations a time budget buys."""


def optuna_cost(trials: int, time_budget: float | None = None) -> float:
    """What the Optuna search with ``trials`` trials (and at most ``time_budget`` seconds) costs, in
    cost-model evaluations."""
    cost = trials * EVALUATIONS_PER_TRIAL + OPTUNA_FIXED_EVALUATIONS
    return cost if time_budget is None else min(cost, time_budget / SECONDS_PER_EVALUATION)


def exhaustive_is_cheaper(space_size: int, trials: int, time_budget: float | None = None) -> bool:
    """Whether scoring every candidate costs no more than the Optuna search would: then the default search
    scores the whole space (the exact optimum, for less time)."""
    return space_size <= optuna_cost(trials, time_budget)


def bulk_is_cheaper(space_size: int, trials_asked, time_budget) -> bool:
    """Whether the default search scores the space whole with the bulk cost model (planner/search/bulk_search.py): an
    exact answer for less than the Optuna search costs, up to BULK_EXHAUSTIVE_CANDIDATES candidates. An explicit
    ``--trials`` or ``--time-budget`` asks for the sampler, and gets it."""
    from autosp.planner.search.bulk_search import BULK_EXHAUSTIVE_CANDIDATES

    return trials_asked is None and time_budget is None and space_size <= BULK_EXHAUSTIVE_CANDIDATES


@dataclass(frozen=True)
class SearchJob:
    """What a strategy is asked to do: search ``space`` through ``evaluator`` for ``objective``.

    ``trials_asked``: the trials the request named (None: the default), ``trials``: what the search runs
    (:meth:`PlanRequest.effective_trials`). ``top_k``: how many candidates the result must rank at least (the
    runner-ups, or the measured trials). ``shared``: an :class:`~autosp.planner.search.optuna_study.Shared` study.
    ``deadline``: a ``time.monotonic()`` by which the sampler stops."""

    space: object  # autosp.planner.search.space.SearchSpace
    evaluator: Evaluator
    objective: str
    trials: int
    seed: int = 0
    top_k: int = 3
    trials_asked: int | None = None
    time_budget: float | None = None
    deadline: float | None = None
    shared: object = None

    def in_bulk(self) -> bool:
        """Whether the bulk cost model can price this job's space (throughput only)."""
        from autosp.planner.search import bulk_search

        return self.objective == "throughput" and bulk_search.supported(self.space)


class Strategy(Protocol):
    def run(self, job: SearchJob) -> SearchResult:
        """The search's result."""

    def describe(self, job: SearchJob) -> str:
        """How it searched, in one line (the plan's ``search.sampler``)."""


class OptunaStrategy:
    def run(self, job: SearchJob) -> SearchResult:
        from autosp.planner.search import optuna_search

        if job.objective == "throughput":
            return optuna_search.optuna_throughput(job.space, job.evaluator, trials=job.trials, seed=job.seed,
                                                   shared=job.shared, deadline=job.deadline)
        from autosp.planner.search.fast import fast_longest_context

        return optuna_search.optuna_max_ctx(job.space, job.evaluator, trials=job.trials, seed=job.seed,
                                            deadline=job.deadline, lean_sweep=fast_longest_context)

    def describe(self, job: SearchJob) -> str:
        if job.shared is None:
            return (f"optuna TPESampler(multivariate, seed={job.seed}) + warm starts + structure sweep + "
                    "local refinement")
        return (f"optuna TPESampler(multivariate, per-worker seed from {job.seed}) + warm starts + structure sweep + "
                f"local refinement, shared study {job.shared.study_name!r}")


class FastStrategy:
    def run(self, job: SearchJob) -> SearchResult:
        from autosp.planner.search import fast

        by_objective = {"throughput": fast.fast_throughput, "max-ctx": fast.fast_max_ctx}
        return by_objective[job.objective](job.space, job.evaluator)

    def describe(self, job: SearchJob) -> str:
        return "fast: branch and bound over the structure families + light climb (no sampler)"


class ExhaustiveStrategy:
    def run(self, job: SearchJob) -> SearchResult:
        from autosp.planner.search import exhaustive

        if job.in_bulk():
            from autosp.planner.search import bulk_search

            return bulk_search.bulk_throughput(job.space, job.evaluator, top_k=job.top_k)
        by_objective = {"throughput": exhaustive.exhaustive_throughput, "max-ctx": exhaustive.exhaustive_max_ctx}
        return by_objective[job.objective](job.space, job.evaluator)

    def describe(self, job: SearchJob) -> str:
        return "exhaustive" + (", priced in bulk (numpy)" if job.in_bulk() else "")


STRATEGIES: dict[str, Strategy] = {"optuna": OptunaStrategy(), "fast": FastStrategy(),
                                   "exhaustive": ExhaustiveStrategy()}
"""Every strategy, by the name ``--search`` takes (:data:`autosp.planner.request.SEARCHES` lists the same)."""


def choose(asked: str, job: SearchJob) -> tuple[str, str]:
    """(the strategy that runs, why it is not the one ``asked``, or "").

    An Optuna search (throughput, not shared) of a space that costs less to score whole is answered exhaustively."""
    if asked != "optuna" or job.objective != "throughput" or job.shared is not None:
        return asked, ""
    size, in_bulk = job.space.size(), job.in_bulk()
    if not (exhaustive_is_cheaper(size, job.trials, job.time_budget)
            or in_bulk and bulk_is_cheaper(size, job.trials_asked, job.time_budget)):
        return asked, ""
    return "exhaustive", (f" (the {size:,} candidates cost less to score than the Optuna search: "
                          + ("a whole space in bulk costs about what one Optuna trial does)" if in_bulk else
                             f"about {optuna_cost(job.trials, job.time_budget):,.0f} evaluations)"))


def run_search(asked: str, job: SearchJob) -> tuple[str, str, SearchResult]:
    """(the strategy that ran, how it searched, its result) for the strategy ``asked``."""
    name, why = choose(asked, job)
    strategy = STRATEGIES[name]
    result = strategy.run(job)
    return name, strategy.describe(job) + why, result


__all__ = ["EVALUATIONS_PER_TRIAL", "OPTUNA_FIXED_EVALUATIONS", "SECONDS_PER_EVALUATION", "STRATEGIES",
           "SearchJob", "Strategy", "bulk_is_cheaper", "choose", "exhaustive_is_cheaper", "optuna_cost",
           "run_search"]
