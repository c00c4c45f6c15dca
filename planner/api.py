"""``plan_for``: the planner's one entry point (``autosp.plan`` and ``autosp-plan`` call it).

One request in, one :class:`Plan` out, in five steps: resolve the model and cluster and build the search space;
look the request up in the plan cache; run the search strategy (:mod:`autosp.planner.search.strategies`);
explain the runner-ups (:mod:`autosp.planner.explain`) or why nothing fits (:mod:`autosp.planner.diagnose`);
and write the result with its search metadata (:class:`~autosp.planner.search_info.SearchInfo`). How the
search runs besides the request (cache, shared study, measured trials) is one :class:`RunOptions`. Never
imports torch; optuna only when the Optuna search actually runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from autosp.errors import InfeasibleError, UsageError
from autosp.contract.plan import Plan, RunnerUp
from autosp.planner.request import PlanRequest, ResolvedRequest, resolve
from autosp.units import format_tokens


@dataclass(frozen=True)
class RunOptions:
    """How :func:`plan_for` runs, besides what the request asks.

    ``cache``: None or False (no cache), True (``$AUTOSP_CACHE`` or the default file), a path or a database URL
    (:mod:`autosp.planner.cache`). ``storage``: an Optuna storage URL shared by several planner workers
    (``study_name``: the study in it, default derived from the request; ``worker``: this worker's id on its
    trials); ``trials=0`` then runs no sampler trials and answers from the study as it is
    (:mod:`autosp.planner.search.optuna_study`). ``measure``: a :class:`autosp.planner.measure.MeasureOptions` (or
    its ``k``): run the top-k candidates with autosp-train and choose by the measurement
    (:mod:`autosp.planner.measure`). A shared study or a measurement bypasses the plan cache. ``diagnose=False``
    leaves out of the InfeasibleError how many GPUs would fit (pricing bigger clusters costs more than the search;
    ``autosp-plan sweep`` plans many requests)."""

    cache: object = None
    storage: str | None = None
    study_name: str | None = None
    worker: str | None = None
    measure: object = None
    diagnose: bool = True

    def checked(self, request: PlanRequest) -> "RunOptions":
        """These options, ``measure`` as MeasureOptions, after the checks that need no model or cluster."""
        if self.storage is None and (self.study_name is not None or self.worker is not None):
            raise UsageError("--study-name and --worker-id need --storage")
        if self.storage is not None and (request.search != "optuna" or request.objective != "throughput"):
            raise UsageError("--storage (a shared Optuna study) works with --search optuna and --objective throughput")
        measure = self.measure
        if isinstance(measure, int) and not isinstance(measure, bool):
            from autosp.planner.measure import MeasureOptions

            measure = MeasureOptions(k=measure) if measure else None
        if measure is not None and request.objective != "throughput":
            raise UsageError("--measure works with --objective throughput")
        if measure is not None and request.documents():
            raise UsageError("--measure trains on unpacked random tokens, so it cannot measure packed documents; "
                             "plan without --measure, or measure without --doc-lens/--mean-doc-len")
        return replace(self, measure=measure)

    def cached(self) -> bool:
        return self.cache is not None and self.cache is not False and self.storage is None and self.measure is None


def plan_for(request: PlanRequest, options: RunOptions | None = None, **option_fields) -> Plan:
    """The best plan for ``request``, run as ``options`` say (:class:`RunOptions`; its fields may be given as
    keywords instead). Raises UsageError for bad input and InfeasibleError when nothing fits."""
    started = time.perf_counter()
    options = replace(options or RunOptions(), **option_fields).checked(request)
    trials = request.effective_trials(shared=options.storage is not None)
    resolved = resolve(request)
    if options.measure is not None:
        options = replace(options, measure=options.measure.check(resolved.hardware))

    from autosp.planner.search.space_version import SPACE_VERSION

    request_key = resolved.key_material(trials, SPACE_VERSION)
    shared = _shared_study(options, resolved, request_key, collect_only=trials == 0)
    store = key = None
    if options.cached():
        from autosp.planner import cache as plan_cache
        from autosp.planner.cache.hits import cached_plan

        store = plan_cache.open_store(None if options.cache is True else options.cache)
        key = plan_cache.request_key(request_key)
        hit = cached_plan(store, key, started, request_key)
        if hit is not None:
            store.close()
            return hit
    # The space is built after the cache lookup: a cached request passed the space's checks when it was planned
    # (same key: same request and code), and a hit then imports neither the space nor the search.
    space = _space(request, resolved)
    found = _search(request, options, space, trials, shared)
    chosen = _explain(request, options, resolved, space, found, shared)
    info = _search_info(request, resolved, space, found, chosen, cache="miss" if store is not None else "off",
                        started=started)
    plan = Plan(model=resolved.model, hardware=resolved.hardware, workload=chosen.workload, candidate=chosen.candidate,
                estimate=chosen.estimate, objective=request.objective, search=info.to_dict(),
                runner_ups=tuple(chosen.runner_ups))
    if store is not None:
        store.put(key, plan.to_json(), request_key)
        store.close()
    return plan


def _space(request: PlanRequest, resolved: ResolvedRequest):
    """The search space of the request, its pins checked; a UsageError when the pins or the global batch leave
    nothing to search."""
    from autosp.planner.search.space import build_space

    hw = resolved.hardware
    space = build_space(resolved.model, hw, resolved.workload, allow_cross_node_sp=request.allow_cross_node_sp,
                        profile=resolved.profile, fixed=request.fix)
    if request.fix:
        from autosp.planner.pins import check_pins, empty_reason

        check_pins(space)
        if not all(space.choices().values()) or (space.size() == 0 and request.objective == "throughput"):
            raise UsageError(empty_reason(space))
    if request.global_batch is not None and space.size() == 0:
        dps = sorted({hw.world_size // sp for sp in space.sp})
        raise UsageError(f"--global-batch {request.global_batch} cannot be split over any data-parallel degree "
                         f"available here ({', '.join(map(str, dps))}); use a multiple of one of them")
    return space


def _shared_study(options: RunOptions, resolved: ResolvedRequest, request_key, collect_only: bool):
    """The shared Optuna study of ``--storage`` (:class:`~autosp.planner.search.optuna_study.Shared`), or None."""
    if options.storage is None:
        return None
    from autosp.planner.search.optuna_study import Shared, default_worker, study_key

    skey = study_key(request_key)
    model, hw, workload = resolved.model, resolved.hardware, resolved.workload
    return Shared(storage=options.storage, study_name=options.study_name or f"autosp-{skey[:12]}", request_key=skey,
                  summary=f"{model.name} at {format_tokens(workload.seq_len)} tokens on {hw.name}",
                  worker=options.worker or default_worker(), collect_only=collect_only)


@dataclass(frozen=True)
class _Found:
    """What the search step returns: the strategy that ran, how it searched, its result, the evaluator that
    holds every score, and the search's wall time."""

    strategy: str
    sampler: str
    result: object  # SearchResult
    evaluator: object  # Evaluator
    seconds: float


def _search(request: PlanRequest, options: RunOptions, space, trials: int, shared) -> _Found:
    from autosp.planner.search.evaluator import Evaluator
    from autosp.planner.search.strategies import SearchJob, run_search

    evaluator = Evaluator(space)
    started = time.perf_counter()
    deadline = None if request.time_budget is None else time.monotonic() + request.time_budget
    job = SearchJob(space=space, evaluator=evaluator, objective=request.objective, trials=trials, seed=request.seed,
                    top_k=max(request.top_k, getattr(options.measure, "k", 0) or 0), trials_asked=request.trials,
                    time_budget=request.time_budget, deadline=deadline, shared=shared)
    strategy, sampler, result = run_search(request.search, job)
    return _Found(strategy, sampler, result, evaluator, time.perf_counter() - started)


@dataclass(frozen=True)
class _Chosen:
    """The explain step's answer: the winner, the workload it was priced at (max-ctx: the longest context
    found), the runner-ups with why each lost, and the measured trials' table (with ``--measure``)."""

    candidate: object
    estimate: object
    workload: object
    runner_ups: list
    measured: list | None = None


def _explain(request: PlanRequest, options: RunOptions, resolved: ResolvedRequest, space, found: _Found,
             shared) -> _Chosen:
    """The winner of the search and why the others lost; an error that says why when nothing fits."""
    from autosp.planner.diagnose import infeasible_message, more_gpus_hint
    from autosp.planner.explain import explain_runner_ups

    result, objective, workload = found.result, request.objective, resolved.workload
    best = result.best
    if best is None and request.fix and not result.ranked and not result.max_ctx:
        from autosp.planner.pins import empty_reason

        raise UsageError(empty_reason(space))  # no candidate keeps the pins at all
    if best is None:
        raise InfeasibleError(infeasible_message(space, found.evaluator, objective, request.allow_cross_node_sp,
                                                 hint=options.diagnose, leanest=result.leanest))
    if objective == "max-ctx":
        seq_len = request.ctx
        if seq_len is not None and result.seq_len < seq_len:
            raise InfeasibleError(
                f"the longest context any plan fits on {resolved.hardware.name} is {format_tokens(result.seq_len)} "
                f"tokens ({result.seq_len:,}), short of the requested {format_tokens(seq_len)}"
                + (f"; {more_gpus_hint(space, seq_len, request.allow_cross_node_sp)}" if options.diagnose else ""))
        workload = replace(workload, seq_len=result.seq_len)
    chosen = _Chosen(*best, workload, explain_runner_ups(result, found.evaluator, objective, request.top_k))
    return chosen if options.measure is None else _measured(request, options, resolved, space, found, chosen, shared)


def _measured(request, options, resolved, space, found: _Found, chosen: _Chosen, shared) -> _Chosen:
    """``--measure``: the top-k candidates run for a few steps; the measurement chooses."""
    from autosp.planner import measure as measuring
    from autosp.planner.search.space import SPACE_VERSION

    def plan_of(c, e):
        return Plan(model=resolved.model, hardware=resolved.hardware, workload=chosen.workload, candidate=c,
                    estimate=e, objective=request.objective,
                    search={"strategy": "measure", "space_version": SPACE_VERSION})

    outcome = measuring.measure(space, found.evaluator, found.result, options.measure, plan_of,
                                worker=shared.worker if shared is not None else "local")
    top_k = request.top_k
    runner_ups = [RunnerUp(c, e, why) for c, e, why in outcome.others][:max(top_k, 0)] if top_k else []
    return _Chosen(*outcome.chosen, chosen.workload, runner_ups, measured=outcome.table)


def _search_info(request: PlanRequest, resolved: ResolvedRequest, space, found: _Found, chosen: _Chosen, cache: str,
                 started: float):
    """The plan's ``search`` section: how the answer was found, and what it depends on."""
    from autosp.planner.profile_fallback import fallback_reason
    from autosp.planner.search.evaluator import CTX_GRANULE
    from autosp.planner.search.space import SPACE_VERSION
    from autosp.planner.search_info import SearchInfo
    from autosp.planner.versions import code_version, cost_model_version

    model, profile, workload, cand = resolved.model, resolved.profile, chosen.workload, chosen.candidate
    result, max_ctx = found.result, request.objective == "max-ctx"
    pad_tokens, pad_fraction = _padding(workload.seq_len, cand.sp, cand.ring)
    attention = None
    if workload.doc_lens or model.sliding_window:
        from autosp.cost_models.estimate import attention_share

        attention = attention_share(model, workload, cand, profile)
    why_analytic = fallback_reason(model) if profile is None else None
    return SearchInfo(
        strategy=found.strategy, requested_search=request.search, sampler=found.sampler,
        trials=result.trials if found.strategy == "optuna" else None, evaluations=result.evaluations,
        space_size=space.with_workload(workload).size(), space_version=SPACE_VERSION,
        cost_model_version=cost_model_version(), code_version=code_version(), seed=request.seed,
        allow_cross_node_sp=request.allow_cross_node_sp, search_wall_time_s=round(found.seconds, 4),
        time_budget_s=request.time_budget, wall_time_s=round(time.perf_counter() - started, 4), cache=cache,
        padding_tokens=pad_tokens, padding_fraction=round(pad_fraction, 6),
        attention_kernel=resolved.hardware.attention_kernel or None, attention=attention,
        model_profile=(f"graph {profile.fingerprint}" if profile is not None
                       else f"analytic fallback ({why_analytic})" if why_analytic else None),
        fixed=dict(request.fix) if request.fix else None,
        max_ctx_tokens=result.seq_len if max_ctx else None, max_ctx_granule=CTX_GRANULE if max_ctx else None,
        details=dict(result.details), measured=chosen.measured,
        excluded_sp={str(sp): why for sp, why in space.excluded_sp} if space.excluded_sp else None)


def _padding(seq_len: int, sp: int, ring: int = 1) -> tuple[int, float]:
    from autosp.planner.search.space import padding

    return padding(seq_len, sp, ring)


__all__ = ["RunOptions", "plan_for"]
