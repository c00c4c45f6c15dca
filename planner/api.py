"""``make_plan``: the planner's one entry point (``autosp.plan`` and ``autosp-plan`` both call it).

Resolve the model and cluster, build the search space, look the request up in the plan cache, search
(Optuna by default, or exhaustively), explain the runner-ups, and return a :class:`Plan`. Never imports
torch; optuna only when the Optuna search actually runs.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import asdict, replace

from autosp.cost_models.specs import DTYPES, Candidate, Estimate, HardwareSpec, ModelSpec, Workload
from autosp.errors import InfeasibleError, UsageError
from autosp.planner.plan import OBJECTIVES, Plan, RunnerUp
from autosp.planner.shortfall import memory_shortfall
from autosp.planner.units import (MAX_TRIALS, check_seed, format_gib, format_seconds, format_tokens, parse_count,
                                  parse_ctx)

SEARCHES = ("optuna", "exhaustive")


def _resolve_model(model) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if not isinstance(model, str) or not model.strip():
        raise UsageError(f"--model must be a preset name or a path to a config.json, got {model!r}")
    from autosp.planner.models import resolve_model

    return resolve_model(model)


def _resolve_model_and_profile(model):
    """(ModelSpec, graph ModelProfile or None): presets keep the analytic profile; a config.json or a
    package.module:function is priced by its cached graph profile (autosp.planner.profiles)."""
    from autosp.planner.profiles import resolve_model_and_profile

    return resolve_model_and_profile(model)


def _fallback_reason(spec: ModelSpec) -> str | None:
    from autosp.planner.profile_fallback import fallback_reason

    return fallback_reason(spec)


def _resolve_hardware(hw, nodes) -> HardwareSpec:
    if nodes is not None:
        nodes = parse_count(nodes, "--nodes")
    if isinstance(hw, HardwareSpec):
        from autosp.planner.hardware_checks import validate_hardware, with_nodes

        where = f"hardware {hw.name!r}"
        return validate_hardware(hw if nodes is None else with_nodes(hw, nodes, where), where)
    if not isinstance(hw, str) or not hw.strip():
        raise UsageError(f"--hw must be a catalog name such as h100x8 or a path to a cluster file, got {hw!r}")
    from autosp.planner.hardware import resolve_hardware

    return resolve_hardware(hw, nodes=nodes)


def _check_options(objective, search, dtype, trials, top_k, seed):
    if objective not in OBJECTIVES:
        raise UsageError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if search not in SEARCHES:
        raise UsageError(f"--search must be one of {', '.join(SEARCHES)}, got {search!r}")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if trials is not None:
        trials = parse_count(trials, "--trials", most=MAX_TRIALS, hint="use --search exhaustive to score every candidate")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise UsageError(f"top_k must be a non-negative integer, got {top_k!r}")
    check_seed(seed)
    return trials


def request_description(model: ModelSpec, hw: HardwareSpec, workload: Workload, objective: str, search: str,
                        trials: int, seed: int, allow_cross_node_sp: bool, top_k: int, space_version: str) -> dict:
    """Everything the answer depends on (the plan cache's key material)."""
    return {"model": model.fingerprint(), "hardware": hw.fingerprint(), "workload": asdict(workload),
            "objective": objective, "search": search, "trials": trials if search == "optuna" else None,
            "seed": seed if search == "optuna" else None, "allow_cross_node_sp": allow_cross_node_sp,
            "top_k": top_k, "space_version": space_version}


def make_plan(model, ctx, hw, *, nodes=None, objective: str = "throughput", global_batch=None, dtype: str = "bf16",
              search: str = "optuna", trials=None, seed: int = 0, cache=None, allow_cross_node_sp: bool = False,
              top_k: int = 3, storage: str | None = None, study_name: str | None = None, worker: str | None = None,
              measure=None) -> Plan:
    """Search the best plan for training ``model`` at context ``ctx`` on cluster ``hw``.

    ``model``: a preset name, a path to a Hugging Face ``config.json``, a ``package.module:function``
    model factory, or a ModelSpec. Presets and ModelSpecs are priced by the analytic formulas; a
    config.json or a factory by its graph-derived profile (traced once, then cached per model fingerprint).
    ``ctx``: tokens per sequence (an int or a string such as ``"200k"``); with ``objective="max-ctx"``
    it may be None, otherwise it is the least context the plan must reach.
    ``hw``: a catalog name (``"h100x8"``), a cluster file, or a HardwareSpec; ``nodes`` overrides its
    node count. ``cache``: None (no cache), True (``$AUTOSP_CACHE`` or the default file), a path or a
    database URL (:mod:`autosp.planner.cache`).
    ``storage``: an Optuna storage URL shared by several planner workers (``study_name``: the study in it,
    default derived from the request; ``worker``: this worker's id on its trials); ``trials=0`` then
    runs no sampler trials and answers from the study as it is (:mod:`autosp.planner.study`).
    ``measure``: a :class:`autosp.planner.measure.MeasureOptions` (or its ``k``): run the top-k
    measurable candidates with autosp-train and choose by the measurement (:mod:`autosp.planner.measure`).
    A shared study or a measurement bypasses the plan cache.
    Raises UsageError for bad input and InfeasibleError when nothing fits.
    """
    started = time.perf_counter()
    collect_only = storage is not None and trials is not None and str(trials).strip() == "0"
    if storage is None and (study_name is not None or worker is not None):
        raise UsageError("--study-name and --worker-id need --storage")
    if storage is not None and (search != "optuna" or objective != "throughput"):
        raise UsageError("--storage (a shared Optuna study) works with --search optuna and --objective throughput")
    if isinstance(measure, int) and not isinstance(measure, bool):
        from autosp.planner.measure import MeasureOptions

        measure = MeasureOptions(k=measure) if measure else None
    if measure is not None and objective != "throughput":
        raise UsageError("--measure works with --objective throughput")
    trials = _check_options(objective, search, dtype, None if collect_only else trials, top_k, seed)
    if ctx is None:
        if objective != "max-ctx":
            raise UsageError("--ctx is required (except with --objective max-ctx)")
        seq_len = None
    else:
        seq_len = parse_ctx(ctx)
    if global_batch is not None:
        global_batch = parse_count(global_batch, "--global-batch")
    model_spec, profile = _resolve_model_and_profile(model)
    hw_spec = _resolve_hardware(hw, nodes)

    from autosp.planner.evaluator import CTX_GRANULE, Evaluator
    from autosp.planner.search import DEFAULT_TRIALS
    from autosp.planner.space import SPACE_VERSION, build_space
    from autosp.planner.versions import code_version, cost_model_version

    if trials is None:
        trials = 0 if collect_only else DEFAULT_TRIALS
    if measure is not None:
        measure = measure.check(hw_spec)
    workload = Workload(seq_len=seq_len or CTX_GRANULE, global_batch=global_batch, dtype=dtype)
    space = build_space(model_spec, hw_spec, workload, allow_cross_node_sp=allow_cross_node_sp, profile=profile)
    if global_batch is not None and space.size() == 0:
        dps = sorted({hw_spec.world_size // sp for sp in space.sp})
        raise UsageError(f"--global-batch {global_batch} cannot be split over any data-parallel degree "
                         f"available here ({', '.join(map(str, dps))}); use a multiple of one of them")

    request = request_description(model_spec, hw_spec, workload, objective, search, trials, seed,
                                  allow_cross_node_sp, top_k, SPACE_VERSION)
    request["workload"]["seq_len"] = seq_len  # None: max-ctx without a floor
    if profile is not None:
        request["model_profile"] = profile.fingerprint  # graph-derived costs: the plan depends on the trace
    shared = None
    if storage is not None:
        from autosp.planner.study import Shared, default_worker, study_key

        skey = study_key(request)
        shared = Shared(storage=storage, study_name=study_name or f"autosp-{skey[:12]}", request_key=skey,
                        summary=f"{model_spec.name} at {format_tokens(workload.seq_len)} tokens on {hw_spec.name}",
                        worker=worker or default_worker(), collect_only=collect_only)
    store, key = None, None
    if cache is not None and cache is not False and shared is None and measure is None:
        from autosp.planner import cache as plan_cache

        store = plan_cache.open_store(None if cache is True else cache)
        key = plan_cache.request_key(request)
        hit = _cached_plan(store, key, started, request)
        if hit is not None:
            store.close()
            return hit

    evaluator = Evaluator(space)
    search_started = time.perf_counter()
    if search == "optuna":
        from autosp.planner import search as optuna_search

        if objective == "throughput":
            result = optuna_search.optuna_throughput(space, evaluator, trials=trials, seed=seed, shared=shared)
        else:
            result = optuna_search.optuna_max_ctx(space, evaluator, trials=trials, seed=seed)
        sampler = (f"optuna TPESampler(multivariate, seed={seed}) + warm starts + local refinement" if shared is None
                   else f"optuna TPESampler(multivariate, per-worker seed from {seed}) + warm starts + local "
                        f"refinement, shared study {shared.study_name!r}")
    else:
        from autosp.planner import exhaustive

        result = (exhaustive.exhaustive_throughput(space, evaluator) if objective == "throughput"
                  else exhaustive.exhaustive_max_ctx(space, evaluator))
        sampler = "exhaustive"
    search_seconds = time.perf_counter() - search_started

    best = result.best
    if best is None:
        raise InfeasibleError(_infeasible_message(space, evaluator, objective, allow_cross_node_sp))
    cand, est = best
    if objective == "max-ctx":
        if seq_len is not None and result.seq_len < seq_len:
            raise InfeasibleError(
                f"the longest context any plan fits on {hw_spec.name} is {format_tokens(result.seq_len)} tokens "
                f"({result.seq_len:,}), short of the requested {format_tokens(seq_len)}; "
                f"{_more_gpus_hint(space, seq_len, allow_cross_node_sp)}")
        workload = replace(workload, seq_len=result.seq_len)

    runner_ups = explain_runner_ups(result, evaluator, objective, top_k)
    measured = None
    if measure is not None:
        from autosp.planner import measure as measuring

        def plan_for(c, e):
            return Plan(model=model_spec, hardware=hw_spec, workload=workload, candidate=c, estimate=e,
                        objective=objective, search={"strategy": "measure", "space_version": SPACE_VERSION})

        outcome = measuring.measure(space, evaluator, result, measure, trials, seed, plan_for,
                                    worker=shared.worker if shared is not None else "local")
        cand, est = outcome.chosen
        measured = outcome.table
        runner_ups = [RunnerUp(c, e, why) for c, e, why in outcome.others][:max(top_k, 0)] if top_k else []
    pad_tokens, pad_fraction = _padding(workload.seq_len, cand.sp)
    search_info = {
        "strategy": search,
        "sampler": sampler,
        "trials": result.trials if search == "optuna" else None,
        "evaluations": result.evaluations,
        "space_size": space.with_workload(workload).size(),
        "space_version": SPACE_VERSION,
        "cost_model_version": cost_model_version(),
        "code_version": code_version(),
        "seed": seed,
        "allow_cross_node_sp": allow_cross_node_sp,
        "search_wall_time_s": round(search_seconds, 4),
        "wall_time_s": round(time.perf_counter() - started, 4),
        "cache": "miss" if store is not None else "off",
        "padding_tokens": pad_tokens,
        "padding_fraction": round(pad_fraction, 6),
    }
    if profile is not None:
        search_info["model_profile"] = f"graph {profile.fingerprint}"
    elif _fallback_reason(model_spec):
        search_info["model_profile"] = f"analytic fallback ({_fallback_reason(model_spec)})"
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
        store.put(key, plan.to_json(), request)
        store.close()
    return plan


def _mismatch(plan: Plan, request: dict) -> str | None:
    """Why a cached plan does not answer ``request`` (a hand-edited or damaged row), or None."""
    if plan.model.fingerprint() != request.get("model"):
        return "its model differs from the request's"
    if plan.hardware.fingerprint() != request.get("hardware"):
        return "its hardware differs from the request's"
    if plan.objective != request.get("objective"):
        return "its objective differs from the request's"
    wanted = request.get("workload") or {}
    w = plan.workload
    if (w.dtype, w.global_batch, w.optimizer) != (wanted.get("dtype"), wanted.get("global_batch"),
                                                  wanted.get("optimizer")):
        return "its workload differs from the request's"
    if wanted.get("seq_len") is not None and (w.seq_len < wanted["seq_len"] if plan.objective == "max-ctx"
                                              else w.seq_len != wanted["seq_len"]):
        return "its context length differs from the request's"
    if plan.search.get("space_version") != request.get("space_version"):
        return "it comes from another search-space version"
    return None


def _cached_plan(store, key: str, started: float, request: dict | None = None) -> Plan | None:
    """The cached plan for ``key``, checked to be a valid plan answering ``request``; anything else is a
    miss, deleted, with one warning."""
    import json

    from autosp.planner.cache import warn_once
    from autosp.planner.plan import plan_from_dict

    text = store.get(key)
    if text is None:
        return None
    try:
        plan = plan_from_dict(json.loads(text))
        why = _mismatch(plan, request) if request is not None else None
    except (ValueError, UsageError) as err:
        why = f"its plan does not parse ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
    except Exception as err:  # noqa: BLE001 - a damaged row must never crash planning
        why = f"its plan does not parse ({type(err).__name__})"
    if why is not None:
        warn_once(f"plan cache {store.location}: ignored and deleted a cached plan because {why}; searching again")
        store.delete(key)  # a miss, and gone
        return None
    search = dict(plan.search, cache="hit", cache_location=store.location,
                  wall_time_s=round(time.perf_counter() - started, 4))
    return replace(plan, search=search)


def _padding(seq_len: int, sp: int) -> tuple[int, float]:
    from autosp.planner.space import padding

    return padding(seq_len, sp)


# -- runner-ups -----------------------------------------------------------------------------------

def _group(cand: Candidate) -> tuple:
    return (cand.sp, cand.zero_stage, cand.checkpointing)


def _differences(cand: Candidate, best: Candidate) -> str:
    names = {"sp": "sp", "zero_stage": "ZeRO", "micro_batch": "micro-batch", "grad_accum": "grad-accum",
             "checkpointing": "ckpt", "mlp_chunks": "mlp chunks", "loss_chunks": "loss chunks",
             "offload_activations": "offload", "overlap": "overlap", "offload_optimizer": "optimizer offload"}
    out = []
    for field, label in names.items():
        a, b = getattr(cand, field), getattr(best, field)
        if a != b:
            if isinstance(a, bool):
                a, b = ("on" if a else "off"), ("on" if b else "off")
            out.append(f"{label} {a} vs {b}")
    return ", ".join(out)


def _slower_because(cand: Candidate, est: Estimate, best: Candidate, best_est: Estimate) -> str:
    """Which component of the step makes ``cand`` slower than ``best``, per token trained."""
    def per_token(e: Estimate) -> dict:
        tokens = e.tokens_per_second * e.time.step
        if tokens <= 0:
            return {}
        t = e.time
        return {"compute": (t.compute - t.recompute) / tokens, "recompute": t.recompute / tokens,
                "exposed communication": t.exposed_comm / tokens, "activation offload": t.offload / tokens}

    a, b = per_token(est), per_token(best_est)
    if not a or not b:
        return "slower"
    deltas = {k: a[k] - b[k] for k in a}
    worst = max(deltas, key=deltas.get)
    if deltas[worst] <= 0:
        return "slower overall"
    best_tokens = best_est.tokens_per_second * best_est.time.step
    return f"more {worst} (+{format_seconds(deltas[worst] * best_tokens)} per step)"


def lost_because(cand: Candidate, est: Estimate, best: Candidate, best_est: Estimate, seq_len: int,
                 max_ctx: int | None = None) -> str:
    diff = _differences(cand, best)
    if not est.fits:
        text = (f"does not fit: needs {format_gib(est.memory.total)} > {format_gib(est.capacity_bytes)} "
                f"per GPU at {format_tokens(seq_len)} tokens" if math.isfinite(est.memory.total) else
                f"does not fit at {format_tokens(seq_len)} tokens: {memory_shortfall(est)}")
        if est.tokens_per_second > best_est.tokens_per_second:
            pct = 100 * (est.tokens_per_second / best_est.tokens_per_second - 1)
            text = f"would be {pct:.1f}% faster but " + text
        if max_ctx:
            text += f" (its longest context: {format_tokens(max_ctx)})"
        return f"{text} [{diff}]"
    ratio = est.tokens_per_second / best_est.tokens_per_second
    if ratio >= 0.9995:
        return f"same predicted speed; the winner is simpler or leaner [{diff}]"
    return f"{100 * (1 - ratio):.1f}% slower: {_slower_because(cand, est, best, best_est)} [{diff}]"


def explain_runner_ups(result, evaluator, objective: str, top_k: int) -> list[RunnerUp]:
    """Up to ``top_k`` alternatives that teach something: the fastest candidate that does not fit (if it
    beats the winner), then the best of each other (sp, ZeRO stage, checkpointing) family."""
    if top_k <= 0 or not result.ranked:
        return []
    best, best_est = result.ranked[0]
    chosen: list[tuple[Candidate, Estimate]] = []
    if objective == "throughput":
        too_big = [(c, e) for c, e in result.ranked if not e.fits]
        if too_big:
            fastest = max(too_big, key=lambda item: item[1].tokens_per_second)
            if fastest[1].tokens_per_second > best_est.tokens_per_second:
                chosen.append(fastest)
    groups = {_group(best)} | {_group(c) for c, _ in chosen}
    for cand, est in result.ranked[1:]:
        if len(chosen) >= top_k:
            break
        if _group(cand) in groups:
            continue
        groups.add(_group(cand))
        chosen.append((cand, est))
    out = []
    for cand, est in chosen[:top_k]:
        max_ctx = None
        if objective == "max-ctx" and not est.fits:
            knobs = {k: getattr(cand, k) for k in evaluator.space.KNOBS}
            max_ctx = evaluator.max_context(evaluator.space.make(**dict(knobs, micro_batch=1)))
        out.append(RunnerUp(cand, est, lost_because(cand, est, best, best_est, result.seq_len, max_ctx)))
    return out


# -- infeasible requests --------------------------------------------------------------------------

def _leanest(space, seq_len: int):
    """(candidate, estimate) with the least memory among the memory-lean corner of the space."""
    from autosp.planner.evaluator import Evaluator

    workload = replace(space.workload, seq_len=seq_len)
    target = space.with_workload(workload)
    evaluator = Evaluator(target)
    best = None
    for sp in target.sp:
        per = target.per_sp_choices(sp)
        if per is None or not per["micro_batch"]:
            continue
        # ZeRO-3 may not tile the loss of a tied model (space.zero3_loss_ok): then the leanest is either
        # ZeRO-3 untiled or the highest other stage with the loss tiled finest.
        zero_loss = {(max(per["zero_stage"]), max(per["loss_chunks"] or (1,))), (max(per["zero_stage"]), 1),
                     (max(z for z in per["zero_stage"] if z < 3) if min(per["zero_stage"]) < 3 else 3,
                      max(per["loss_chunks"] or (1,)))}
        for ckpt, offload, optim, (zero, loss) in itertools.product(("full", "sequence"), (True, False),
                                                                     (True, False), sorted(zero_loss)):
            cand = target.make(sp=sp, zero_stage=zero, micro_batch=min(per["micro_batch"]),
                               checkpointing=ckpt, mlp_chunks=max(per["mlp_chunks"] or (1,)),
                               loss_chunks=loss, offload_activations=offload,
                               overlap="none", offload_optimizer=optim)
            if target.reason(cand):
                continue
            est = evaluator(cand)
            if best is None or est.memory.total < best[1].memory.total:
                best = (cand, est)
    return best


def _needs(cand: Candidate, est: Estimate) -> str:
    """'(plan) needs X GiB per GPU, Y usable' or, when host memory is what runs out, the cost model's note."""
    if math.isfinite(est.memory.total):
        return (f"the leanest plan ({cand.short()}) needs {format_gib(est.memory.total)} per GPU, "
                f"{format_gib(est.capacity_bytes)} usable")
    why = next((n for n in est.notes if "host memory" in n), "its offloads exceed host memory")
    return f"the leanest plan ({cand.short()}) cannot fit: {why}"


MAX_SCALE_NODES = 4096


def _smallest_fit(space, seq_len: int, cross: bool, first_factor: int):
    """Scale the cluster by powers of two (same nodes, more of them) from ``first_factor`` until the leanest
    plan fits. Returns (nodes, None) for the smallest size that fits, or (None, (bigger hw, leanest) at the
    largest size tried, or None)."""
    from autosp.planner.space import build_space

    hw = space.hardware
    last = None
    factor = first_factor
    while hw.nodes * factor <= MAX_SCALE_NODES:
        bigger = replace(hw, nodes=hw.nodes * factor)
        sub = build_space(space.model, bigger, replace(space.workload, seq_len=seq_len), allow_cross_node_sp=cross,
                          profile=space.profile)
        lean = _leanest(sub, seq_len)
        if lean is not None and lean[1].fits:
            return bigger.nodes, None
        if lean is not None:
            last = (bigger, lean)
        factor *= 2
    return None, last


def _gpus_needed(space, seq_len: int, allow_cross_node_sp: bool):
    """(nodes without cross-node SP or None, nodes with it or None, leanest at the largest size tried).

    With ``allow_cross_node_sp`` only the second is searched; without it both are, the second from the
    cluster as it is (the flag alone may be what is missing)."""
    within = (None, None) if allow_cross_node_sp else _smallest_fit(space, seq_len, False, 2)
    across = _smallest_fit(space, seq_len, True, 2 if allow_cross_node_sp else 1)
    return within[0], across[0], across[1] or within[1]


def _more_gpus_hint(space, seq_len: int, allow_cross_node_sp: bool) -> str:
    within, across, last = _gpus_needed(space, seq_len, allow_cross_node_sp)
    hw = space.hardware
    per = hw.devices_per_node

    def fit(nodes, cross):
        spanning = " with SP groups spanning nodes" if cross else ""
        return (f"about {nodes * per:,} GPUs would fit{spanning} (--nodes {nodes}"
                f"{' --allow-cross-node-sp' if cross else ''})")

    without = f", {fit(within, False)[6:].replace(' would fit', '')} without" if within else ""
    if allow_cross_node_sp:
        if across is not None:
            return fit(across, False)
    elif across is not None and across == hw.nodes:
        return ("it fits on these GPUs with SP groups spanning nodes (--allow-cross-node-sp: their all-to-alls "
                f"use the inter-node links){', or ' + fit(within, False) if within else ''}")
    elif across is not None and (within is None or across < within):
        return fit(across, True) + without
    elif within is not None:
        return fit(within, False)
    if last is None:
        return "more GPUs of this kind would not help"
    bigger, (cand, est) = last
    return f"more GPUs would not help: even on {bigger.world_size:,} of them {_needs(cand, est)}"


def _infeasible_message(space, evaluator, objective: str, allow_cross_node_sp: bool) -> str:
    seq_len = space.workload.seq_len
    if objective == "max-ctx":
        from autosp.planner.evaluator import CTX_GRANULE

        seq_len = CTX_GRANULE
    lean = _leanest(space, seq_len)
    hw = space.hardware
    where = f"{hw.nodes}x{hw.devices_per_node} {hw.accelerator.name}" if hw.nodes > 1 else \
        f"{hw.devices_per_node}x {hw.accelerator.name}"
    if lean is None:
        return f"no valid candidate for {space.model.name} on {where}"
    what = f"{space.model.name} at {format_tokens(seq_len)} tokens on {where}: {_needs(*lean)}"
    return f"no plan fits {what}; {_more_gpus_hint(space, seq_len, allow_cross_node_sp)}"
