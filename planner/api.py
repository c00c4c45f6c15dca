"""``make_plan``: the planner's one entry point (``autosp.plan`` and ``autosp-plan`` both call it).

Resolve the model and cluster, build the search space, look the request up in the plan cache, search
(Optuna by default, or exhaustively), explain the runner-ups (:mod:`autosp.planner.explain`) or why
nothing fits (:mod:`autosp.planner.diagnose`), and return a :class:`Plan`. Never imports torch; optuna
only when the Optuna search actually runs.
"""

from __future__ import annotations

import time
from dataclasses import replace

from autosp.errors import InfeasibleError, UsageError
from autosp.planner.plan import Plan, RunnerUp
from autosp.planner.request import PlanRequest, resolve
from autosp.planner.search import FAMILY_SWEEP_EVALUATIONS
from autosp.units import format_tokens

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
    """Whether the default search scores the space whole with the bulk cost model (planner/bulk_search.py): an
    exact answer for less than the Optuna search costs, up to BULK_EXHAUSTIVE_CANDIDATES candidates. An explicit
    ``--trials`` or ``--time-budget`` asks for the sampler, and gets it."""
    from autosp.planner.bulk_search import BULK_EXHAUSTIVE_CANDIDATES

    return trials_asked is None and time_budget is None and space_size <= BULK_EXHAUSTIVE_CANDIDATES


def make_plan(model, ctx, hw, *, nodes=None, objective: str = "throughput", global_batch=None, dtype: str = "bf16",
              search: str = "optuna", trials=None, seed: int = 0, cache=None, allow_cross_node_sp: bool = True,
              top_k: int = 3, storage: str | None = None, study_name: str | None = None, worker: str | None = None,
              measure=None, time_budget=None, fix=(), doc_lens=None, mean_doc_len=None,
              attention_kernel=None) -> Plan:
    """Search the best plan for training ``model`` at context ``ctx`` on cluster ``hw``: the keyword form of
    :func:`plan_for` (the arguments are the fields of :class:`~autosp.planner.request.PlanRequest`, whose
    docs say what each takes, and the run options of :func:`plan_for`)."""
    request = PlanRequest(model=model, ctx=ctx, hw=hw, nodes=nodes, objective=objective, global_batch=global_batch,
                          dtype=dtype, allow_cross_node_sp=allow_cross_node_sp, search=search, trials=trials,
                          seed=seed, time_budget=time_budget, top_k=top_k, fix=fix, doc_lens=doc_lens,
                          mean_doc_len=mean_doc_len, attention_kernel=attention_kernel)
    return plan_for(request, cache=cache, storage=storage, study_name=study_name, worker=worker, measure=measure)


def plan_for(request: PlanRequest, *, cache=None, storage: str | None = None, study_name: str | None = None,
             worker: str | None = None, measure=None, diagnose: bool = True) -> Plan:
    """The best plan for ``request``.

    ``cache``: None (no cache), True (``$AUTOSP_CACHE`` or the default file), a path or a database URL
    (:mod:`autosp.planner.cache`). ``storage``: an Optuna storage URL shared by several planner workers
    (``study_name``: the study in it, default derived from the request; ``worker``: this worker's id on
    its trials); ``trials=0`` then runs no sampler trials and answers from the study as it is
    (:mod:`autosp.planner.study`). ``measure``: a :class:`autosp.planner.measure.MeasureOptions` (or its
    ``k``): run the top-k candidates with autosp-train and choose by the measurement
    (:mod:`autosp.planner.measure`). A shared study or a measurement bypasses the plan cache.
    ``diagnose=False`` leaves out of the InfeasibleError how many GPUs would fit (pricing bigger clusters costs
    more than the search; ``autosp-plan sweep`` plans many requests).
    Raises UsageError for bad input and InfeasibleError when nothing fits.
    """
    started = time.perf_counter()
    objective, search, seed = request.objective, request.search, request.seed
    allow_cross_node_sp, top_k, time_budget = request.allow_cross_node_sp, request.top_k, request.time_budget
    if storage is None and (study_name is not None or worker is not None):
        raise UsageError("--study-name and --worker-id need --storage")
    if storage is not None and (search != "optuna" or objective != "throughput"):
        raise UsageError("--storage (a shared Optuna study) works with --search optuna and --objective throughput")
    if isinstance(measure, int) and not isinstance(measure, bool):
        from autosp.planner.measure import MeasureOptions

        measure = MeasureOptions(k=measure) if measure else None
    if measure is not None and objective != "throughput":
        raise UsageError("--measure works with --objective throughput")
    if measure is not None and request.documents():
        raise UsageError("--measure trains on unpacked random tokens, so it cannot measure packed documents; plan "
                         "without --measure, or measure without --doc-lens/--mean-doc-len")
    trials = request.effective_trials(shared=storage is not None)
    collect_only = trials == 0
    resolved = resolve(request)
    model_spec, profile, hw_spec, workload = resolved.model, resolved.profile, resolved.hardware, resolved.workload
    seq_len, global_batch = request.ctx, request.global_batch

    from autosp.planner.space_version import SPACE_VERSION

    request_key = resolved.key_material(trials, SPACE_VERSION)
    store, key = None, None
    if cache is not None and cache is not False and storage is None and measure is None:
        # Looked up before the space is built: a cached request passed its checks when it was planned (same
        # key, same request and code), and a hit then imports neither the space nor the search.
        from autosp.planner import cache as plan_cache
        from autosp.planner.cache.hits import cached_plan

        store = plan_cache.open_store(None if cache is True else cache)
        key = plan_cache.request_key(request_key)
        hit = cached_plan(store, key, started, request_key)
        if hit is not None:
            store.close()
            return hit

    from autosp.planner.evaluator import CTX_GRANULE, Evaluator
    from autosp.planner.space import build_space
    from autosp.planner.versions import code_version, cost_model_version

    if measure is not None:
        measure = measure.check(hw_spec)
    space = build_space(model_spec, hw_spec, workload, allow_cross_node_sp=allow_cross_node_sp, profile=profile,
                        fixed=request.fix)
    if request.fix:
        from autosp.planner.pins import check_pins, empty_reason

        check_pins(space)
        if not all(space.choices().values()) or (space.size() == 0 and objective == "throughput"):
            raise UsageError(empty_reason(space))
    if global_batch is not None and space.size() == 0:
        dps = sorted({hw_spec.world_size // sp for sp in space.sp})
        raise UsageError(f"--global-batch {global_batch} cannot be split over any data-parallel degree "
                         f"available here ({', '.join(map(str, dps))}); use a multiple of one of them")

    shared = None
    if storage is not None:
        from autosp.planner.study import Shared, default_worker, study_key

        skey = study_key(request_key)
        shared = Shared(storage=storage, study_name=study_name or f"autosp-{skey[:12]}", request_key=skey,
                        summary=f"{model_spec.name} at {format_tokens(workload.seq_len)} tokens on {hw_spec.name}",
                        worker=worker or default_worker(), collect_only=collect_only)
    evaluator = Evaluator(space)
    search_started = time.perf_counter()
    strategy = search
    from autosp.planner import bulk_search

    in_bulk = objective == "throughput" and bulk_search.supported(space)
    if search == "optuna" and objective == "throughput" and shared is None and (
            exhaustive_is_cheaper(space.size(), trials, time_budget)
            or in_bulk and bulk_is_cheaper(space.size(), request.trials, time_budget)):
        strategy = "exhaustive"  # a small space: every candidate costs less than the Optuna search would
    if strategy == "optuna":
        from autosp.planner import search as optuna_search

        deadline = None if time_budget is None else time.monotonic() + time_budget
        if objective == "throughput":
            result = optuna_search.optuna_throughput(space, evaluator, trials=trials, seed=seed, shared=shared,
                                                     deadline=deadline)
        else:
            from autosp.planner.fast import fast_longest_context

            result = optuna_search.optuna_max_ctx(space, evaluator, trials=trials, seed=seed, deadline=deadline,
                                                  lean_sweep=fast_longest_context)
        sampler = (f"optuna TPESampler(multivariate, seed={seed}) + warm starts + structure sweep + local refinement"
                   if shared is None else
                   f"optuna TPESampler(multivariate, per-worker seed from {seed}) + warm starts + structure sweep + "
                   f"local refinement, shared study {shared.study_name!r}")
    elif strategy == "fast":
        from autosp.planner import fast

        result = (fast.fast_throughput(space, evaluator) if objective == "throughput"
                  else fast.fast_max_ctx(space, evaluator))
        sampler = "fast: branch and bound over the structure families + light climb (no sampler)"
    else:
        from autosp.planner import exhaustive

        if in_bulk:
            result = bulk_search.bulk_throughput(space, evaluator, top_k=max(top_k, getattr(measure, "k", 0) or 0))
        else:
            result = (exhaustive.exhaustive_throughput(space, evaluator) if objective == "throughput"
                      else exhaustive.exhaustive_max_ctx(space, evaluator))
        sampler = "exhaustive" + (", priced in bulk (numpy)" if in_bulk else "")
        if search != strategy:
            sampler += (f" (the {space.size():,} candidates cost less to score than the Optuna search: "
                        + ("a whole space in bulk costs about what one Optuna trial does)" if in_bulk else
                           f"about {optuna_cost(trials, time_budget):,.0f} evaluations)"))
    search_seconds = time.perf_counter() - search_started

    from autosp.planner.diagnose import infeasible_message, more_gpus_hint
    from autosp.planner.explain import explain_runner_ups

    best = result.best
    if best is None and request.fix and not result.ranked and not result.max_ctx:
        from autosp.planner.pins import empty_reason

        raise UsageError(empty_reason(space))  # no candidate keeps the pins at all
    if best is None:
        raise InfeasibleError(infeasible_message(space, evaluator, objective, allow_cross_node_sp, hint=diagnose))
    cand, est = best
    if objective == "max-ctx":
        if seq_len is not None and result.seq_len < seq_len:
            raise InfeasibleError(
                f"the longest context any plan fits on {hw_spec.name} is {format_tokens(result.seq_len)} tokens "
                f"({result.seq_len:,}), short of the requested {format_tokens(seq_len)}"
                + (f"; {more_gpus_hint(space, seq_len, allow_cross_node_sp)}" if diagnose else ""))
        workload = replace(workload, seq_len=result.seq_len)

    runner_ups = explain_runner_ups(result, evaluator, objective, top_k)
    measured = None
    if measure is not None:
        from autosp.planner import measure as measuring

        def plan_of(c, e):
            return Plan(model=model_spec, hardware=hw_spec, workload=workload, candidate=c, estimate=e,
                        objective=objective, search={"strategy": "measure", "space_version": SPACE_VERSION})

        outcome = measuring.measure(space, evaluator, result, measure, plan_of,
                                    worker=shared.worker if shared is not None else "local")
        cand, est = outcome.chosen
        measured = outcome.table
        runner_ups = [RunnerUp(c, e, why) for c, e, why in outcome.others][:max(top_k, 0)] if top_k else []
    pad_tokens, pad_fraction = _padding(workload.seq_len, cand.sp, cand.ring)
    search_info = {
        "strategy": strategy,
        "requested_search": search,  # what a re-check asks for (a small space asked of Optuna is scored whole)
        "sampler": sampler,
        "trials": result.trials if strategy == "optuna" else None,
        "evaluations": result.evaluations,
        "space_size": space.with_workload(workload).size(),
        "space_version": SPACE_VERSION,
        "cost_model_version": cost_model_version(),
        "code_version": code_version(),
        "seed": seed,
        "allow_cross_node_sp": allow_cross_node_sp,
        "search_wall_time_s": round(search_seconds, 4),
        "time_budget_s": time_budget,
        "wall_time_s": round(time.perf_counter() - started, 4),
        "cache": "miss" if store is not None else "off",
        "padding_tokens": pad_tokens,
        "padding_fraction": round(pad_fraction, 6),
        "attention_kernel": hw_spec.attention_kernel or None,
    }
    if workload.doc_lens or model_spec.sliding_window:
        from autosp.cost_models.estimate import attention_share

        search_info["attention"] = attention_share(model_spec, workload, cand, profile)
    if profile is not None:
        search_info["model_profile"] = f"graph {profile.fingerprint}"
    else:
        from autosp.planner.profile_fallback import fallback_reason

        why = fallback_reason(model_spec)
        if why:
            search_info["model_profile"] = f"analytic fallback ({why})"
    if request.fix:
        search_info["fixed"] = dict(request.fix)
    if objective == "max-ctx":
        search_info["max_ctx_tokens"] = result.seq_len
        search_info["max_ctx_granule"] = CTX_GRANULE
    if result.details:
        search_info.update({k: v for k, v in result.details.items() if k != "space_size"})
    if measured is not None:
        search_info["measured"] = measured
    if space.excluded_sp:
        search_info["excluded_sp"] = {str(sp): why for sp, why in space.excluded_sp}
    plan = Plan(model=model_spec, hardware=hw_spec, workload=workload, candidate=cand, estimate=est,
                objective=objective, search=search_info, runner_ups=tuple(runner_ups))
    if store is not None:
        store.put(key, plan.to_json(), request_key)
        store.close()
    return plan


def _padding(seq_len: int, sp: int, ring: int = 1) -> tuple[int, float]:
    from autosp.planner.space import padding

    return padding(seq_len, sp, ring)


__all__ = ["EVALUATIONS_PER_TRIAL", "OPTUNA_FIXED_EVALUATIONS", "SECONDS_PER_EVALUATION", "bulk_is_cheaper",
           "exhaustive_is_cheaper",
           "make_plan", "optuna_cost", "plan_for"]
