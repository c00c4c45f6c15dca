"""Optuna search over the same space as :mod:`autosp.planner.search.exhaustive`, with a fraction of the calls.

One Optuna study per request, in memory, seeded (same request + same seed = same plan):

1. **Warm start**: a few hand-picked candidates are enqueued first (the memory-lean ALST-style recipe
   with every ring degree of the largest SP group, and two faster variants on the node-local Ulysses x ring
   layout) so that even at extreme contexts the study sees feasible points early; never more than the
   trials asked for.
2. **TPE** (multivariate ``TPESampler``) proposes the knobs for ``trials`` trials. The per-GPU memory
   is a *constraint*: each trial records ``(memory - capacity) / capacity`` (and a validity flag) with
   ``Trial.set_constraint``, and the constrained TPE ranks feasible trials by the objective and
   infeasible ones by their violation.
3. **Structure sweep** (:func:`structure_sweep`): every (sp, ring, ZeRO, checkpointing) family once, at
   the smallest micro-batch and the most overlapping schedule, its tiling and offload dials chosen
   greedily (:func:`complete`): a few cost-model calls per family, so no family is left out because TPE
   did not sample it (without it, 60 trials stopped at 0.984 of the optimum on one of 52 random
   requests, ``studies/search_quality.py``).
4. **Local refinement**: a best-improvement hill climb (:func:`hill_climb`) from the best scored
   candidates of :data:`REFINE_STARTS` different (sp, ring, ZeRO, checkpointing) families and of every
   other checkpointing policy found to fit. A move changes one knob
   (sp together with the overlap schedule and the tokens-per-GPU-preserving micro-batch), optionally
   followed by one compensating move: a faster neighbour that does not fit is *repaired* with a
   memory-saving move, a neighbour that fits *spends* its headroom on a speed-gaining one. TPE finds
   the right region of a space of tens of thousands of points; the climb finishes the last percent
   that a hundred sampler trials rarely reach (without it TPE alone stopped 3-11% short on some of
   the test cases). The climb runs outside the Optuna study (no sampler cost per step).
5. **Family completion** (:func:`family_sweep`): every candidate of the best-scoring (sp, ring, ZeRO,
   checkpointing) families is scored, best family first, within :data:`FAMILY_SWEEP_EVALUATIONS` cost-model
   calls. The steps before find a family's region but can stop short of its best combination of
   micro-batch, tiling, offload and overlap, which moves several knobs at once (on the space with ring,
   sequence chunks and parameter offload they stopped at 0.978 of the optimum on 3 of 134 random requests,
   studies/results/search_quality_seed0_n150_before_family_sweep.txt).

Objectives: ``throughput`` maximises predicted tokens/s. ``max-ctx`` maximises each candidate's
longest trainable context (binary search through the cost model), then runs a throughput study at the
winning context.

Trials proposing a candidate already scored cost no cost-model call (the evaluator memoises), so
``evaluations`` (cost-model calls) can be smaller than ``trials``; the refinement's calls count too.
"""

from __future__ import annotations

import itertools
import time
import warnings
from dataclasses import asdict, replace

from autosp.contract.knobs import FAMILY, family_of, fast_dials, lean_knobs
from autosp.planner.search.evaluator import MAX_CTX, Evaluator, SearchResult, progress_bar, rank_key, ranked_at
from autosp.planner.search.moves import DIAL_KNOBS, complete, hill_climb, knobs_of
from autosp.planner.search.limits import DEFAULT_TRIALS, MAX_TRIALS

REFINE_STARTS = 3
"""Local refinement climbs from the best trial of this many different (sp, ring, ZeRO, checkpointing) families."""
FAMILY_SWEEP_EVALUATIONS = 12_000
"""Cost-model calls the family completion may spend (~0.7 s at 0.057 ms a call): enough for every family of
a one-GPU space (16 families, ~17,000 candidates, the fitting ones first) and for the few best families of a
large one; about 1.5x what the trials and the refinement cost (60 trials x ~75 evaluations' worth of sampler
time + ~2,750 calls, studies/results/search_quality_seed0_n150_before_family_sweep.txt)."""


FAMILY_SWEEP_BULK_CANDIDATES = 400_000
"""The family completion's budget, in candidates, where the bulk cost model scores the families
(planner/search/bulk_search.py: about 1 us a candidate, so about what FAMILY_SWEEP_EVALUATIONS scalar calls cost)."""


def _import_optuna():
    import optuna

    # ERROR, not WARNING: Optuna logs a trial that raised (Ctrl-C included) as a warning with its traceback,
    # and autosp's own guard already turns every exception into one line (autosp/guard.py)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    optuna.logging.disable_propagation()
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def _set_constraints(optuna, trial, values: dict) -> None:
    if hasattr(trial, "set_constraint"):  # optuna >= 5
        for key, value in values.items():
            trial.set_constraint(key, value)
    else:  # optuna 4.x: read back by the sampler's constraints_func
        trial.set_user_attr("constraints", [values[k] for k in sorted(values)])


def _sampler(optuna, seed: int, n_startup: int):
    kwargs = dict(seed=seed, multivariate=True, n_startup_trials=n_startup)
    if not hasattr(optuna.trial.Trial, "set_constraint"):
        kwargs["constraints_func"] = lambda t: t.user_attrs.get("constraints", [1.0, 1.0])
    return optuna.samplers.TPESampler(**kwargs)


def node_local_ring(space, sp: int) -> int:
    """The ring degree of ``sp`` whose Ulysses group is the largest that stays inside a node (the USP /
    LoongTrain layout: all-to-alls on NVLink, the ring across nodes); the smallest valid ring otherwise."""
    rings = space.rings_for(sp)
    if not rings:
        return 1
    local = [r for r in rings if sp // r <= space.hardware.devices_per_node]
    return min(local) if local else min(rings)


def warm_starts(space) -> list[dict]:
    """Knob settings worth trying first: lean on memory (with every ring degree of the largest sp: which
    layout is leanest depends on the model's heads), then two faster relatives on the node-local layout."""
    choices = space.choices()
    if not all(choices.values()):
        return []  # pins that exclude each other: no start
    sp = max(choices["sp"])
    # every knob at its lean value (autosp.contract.knobs), layers unchunked (the chunked starts follow), the
    # node-local ring split of the largest sp, no expert parallelism, no overlap
    lean = dict(lean_knobs(choices), sp=sp, ring=node_local_ring(space, sp), overlap="none", sequence_chunks=1,
                offload_chunks=False)
    lean.pop("ep", None)
    # the leanest layers: sequence-chunked and recomputed (only their inputs kept, offloaded), the chunks of the
    # layer in its backward offloaded; and chunked layers kept whole in host memory
    chunked = dict(lean, sequence_chunks=max(choices["sequence_chunks"]), offload_chunks=True, mlp_chunks=1)
    chunked_on_device = dict(chunked, checkpointing="none")
    middle = dict(lean, checkpointing="sequence", offload_activations=False, mlp_chunks=4, loss_chunks=8,
                  overlap="kv_async", offload_optimizer=False, offload_param=False)
    fast = dict(middle, zero_stage=1, checkpointing="selective", mlp_chunks=1, loss_chunks=8)
    # ZeRO-3's gathered weights and prefetch buckets can cost more than it shards (on one GPU it shards nothing):
    # then the leanest plan is ZeRO-2, so start from both.
    lean_tiled_loss = dict(lean, zero_stage=2)
    other_rings = [dict(lean, ring=r) for r in space.rings_for(sp) if r != lean["ring"]]
    starts = []
    for knobs in (lean, chunked, chunked_on_device, lean_tiled_loss, middle, fast, *other_rings):
        knobs = {k: v if v in choices[k] else choices[k][-1] for k, v in knobs.items()}
        cand = space.make_nearest(**knobs)
        if not space.admits(cand):
            continue  # a start that breaks a pin or a rule: the sampler could not be told about it
        knobs = knobs_of(space, cand)
        if knobs not in starts:
            starts.append(knobs)
    return starts


class _Study:
    """An Optuna study over ``space``'s knobs with a given per-candidate objective; in memory, or shared
    with other workers through a storage (``shared``: :class:`autosp.planner.search.optuna_study.Shared`)."""

    def __init__(self, space, seed: int, trials: int, value_fn, label: str, shared=None):
        self.optuna = _import_optuna()
        self.space = space
        self.value_fn = value_fn  # cand -> (value, constraints dict)
        self.trials = trials
        self.label = label
        self.shared = shared
        self.worker = shared.worker if shared is not None else "local"
        n_startup = max(5, min(20, trials // 6))
        if shared is None:
            self.study = self.optuna.create_study(direction="maximize",
                                                  sampler=_sampler(self.optuna, seed, n_startup))
            self.enqueued = []
        else:
            from autosp.planner.search.optuna_study import open_study

            sampler = _sampler(self.optuna, shared.sampler_seed(seed), n_startup)
            self.study = open_study(self.optuna, shared, sampler)
        self.n_trials = 0
        self.stopped_by_deadline = False
        self.enqueued: list[dict] = []

    def _objective(self, trial):
        choices = self.space.choices()
        knobs = {k: trial.suggest_categorical(k, list(choices[k])) for k in self.space.KNOBS}
        cand = self.space.make_nearest(**knobs)
        value, constraints = self.value_fn(cand)
        trial.set_user_attr("candidate", asdict(cand))
        trial.set_user_attr("worker", self.worker)
        trial.set_user_attr("source", "enqueued" if trial.params in self.enqueued else "sampler")
        trial.set_user_attr("fits", all(v <= 0 for v in constraints.values()))
        _set_constraints(self.optuna, trial, constraints)
        return value

    def run(self, n: int, bar, deadline: float | None = None) -> None:
        """Run ``n`` trials, or fewer if the ``deadline`` (time.monotonic()) comes first."""
        if n <= 0:
            return
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            self.stopped_by_deadline = True
            return
        done = [0]

        def count(*_):
            done[0] += 1
            bar.update()

        while done[0] < n:  # one pass, unless a worker of a shared study loses a race (below)
            try:
                self.study.optimize(self._objective, n_trials=n - done[0], timeout=timeout, callbacks=[count])
                break
            except ValueError as err:
                # Two workers of a shared study could pop the same enqueued warm start where the database
                # ignores SELECT ... FOR UPDATE (optuna/optuna#4621; SQLite study files take the write lock at
                # BEGIN instead, planner/search/optuna_study.py): the slower one cannot tell a trial the other completed.
                # That trial is scored; go on with the rest.
                if self.shared is None or "Cannot tell a COMPLETE trial" not in str(err):
                    raise
                done[0] += 1
                timeout = None if deadline is None else deadline - time.monotonic()
                if timeout is not None and timeout <= 0:
                    break
        self.n_trials += done[0]
        if done[0] < n:
            self.stopped_by_deadline = True

    def enqueue(self, knob_sets) -> int:
        count = 0
        for knobs in knob_sets:
            self.enqueued.append(dict(knobs))
            if self.shared is None:
                self.study.enqueue_trial(knobs)
            else:  # once per study, whichever worker comes first
                self.study.enqueue_trial(knobs, skip_if_exists=True)
            count += 1
        return count


def structure_sweep(space, estimate) -> None:
    """Score, through ``estimate``, the dial-completed candidate (:func:`complete`) of every (sp, ring, ZeRO
    stage, checkpointing) family at the smallest micro-batch and the most overlapping schedule valid for
    its layout; the refinement then starts from the best of them as well as from the best trials."""
    for sp, ring in space.layouts():
        per = space.per_layout_choices(sp, ring)
        if per is None or not per["micro_batch"] or not per["overlap"]:
            continue  # no micro-batch or overlap schedule of the space (a pinned one) goes with this layout
        for zero, ckpt in itertools.product(per["zero_stage"], per["checkpointing"]):
            complete(space, space.make(sp=sp, ring=ring, zero_stage=zero, micro_batch=min(per["micro_batch"]),
                                       checkpointing=ckpt, overlap=per["overlap"][-1], **fast_dials()), estimate)


def family_sweep(space, ranked, estimate, budget: int = FAMILY_SWEEP_EVALUATIONS, best_of=None):
    """Score, through ``estimate``, every candidate of the (sp, ring, ZeRO, checkpointing) families of the
    candidates in ``ranked``, in its order (the families of fitting candidates first, then those whose scored
    members all miss the memory by a little: their best member may fit), skipping a family that would take the
    calls spent past ``budget``. Returns the best fitting candidate scored, or None. ``best_of(members)``, when
    given, returns the best fitting candidate of a family's sub-space at once (the bulk cost model:
    planner/search/bulk_search.py), which is then the only one scored through ``estimate``."""
    spent, seen, best = 0, set(), None
    for cand, _ in ranked:
        family = family_of(cand)
        if family in seen:
            continue
        seen.add(family)
        members = replace(space, **{name: (value,) for name, value in zip(FAMILY, family)})
        size = members.size()
        if spent + size > budget:
            continue
        spent += size
        for member in (members.candidates() if best_of is None else filter(None, [best_of(members)])):
            score = estimate(member)
            if score.fits and (best is None or score.tokens_per_second > best[1].tokens_per_second):
                best = (member, score)
    return best[0] if best else None


def _distinct_starts(ranked, k: int) -> list:
    """Where the refinement climbs from: the best fitting candidates of the ``k`` best (sp, ring, ZeRO,
    checkpointing) families, plus the best fitting candidate of every checkpointing policy not among
    them (the policies are separate basins: moving between them usually needs three knobs at once)."""
    starts, families, policies = [], set(), set()
    fitting = [cand for cand, est in ranked if est.fits]
    for cand in fitting:
        family = family_of(cand)
        if family not in families:
            families.add(family)
            policies.add(cand.checkpointing)
            starts.append(cand)
        if len(starts) == k:
            break
    for cand in fitting:
        if cand.checkpointing not in policies:
            policies.add(cand.checkpointing)
            starts.append(cand)
    return starts


def optuna_throughput(space, evaluator: Evaluator, trials: int = DEFAULT_TRIALS, seed: int = 0,
                      seq_len: int | None = None, label: str = "optuna", shared=None,
                      deadline: float | None = None) -> SearchResult:
    """TPE trials, then local refinement. With ``shared`` (:class:`autosp.planner.search.optuna_study.Shared`) the study
    lives in a storage other workers share: the refinement starts from every worker's trials, records
    what it finds as trials, and the result ranks the study's trials (its best is the study's best
    feasible trial). ``trials`` = 0 is allowed only then: no sampler trials, just refine and read.
    ``deadline`` (a time.monotonic() value) stops the sampler trials early; the warm starts and the
    refinement (a few hundred cost-model calls) still run."""
    seq = space.workload.seq_len if seq_len is None else seq_len
    target = space if seq == space.workload.seq_len else space.with_workload(evaluator.workload(seq))

    def value_fn(cand):
        reason = target.reason(cand)
        if reason:
            return 0.0, {"valid": 1.0, "memory": 1.0}
        est = evaluator(cand, seq)
        excess = (est.memory.total - est.capacity_bytes) / est.capacity_bytes
        return est.tokens_per_second, {"valid": 0.0, "memory": excess}

    study = _Study(target, seed, trials, value_fn, label, shared=shared)
    bar = progress_bar(None if deadline is not None else max(trials, len(warm_starts(target))) + REFINE_STARTS + 3,
                       label)  # a time budget: count trials, no total
    _sample(study, target, evaluator, seq, trials, shared, deadline, bar)
    after_trials = evaluator.calls
    structure_sweep(target, lambda c: evaluator(c, seq))
    after_sweep = evaluator.calls
    ends = _refine(target, evaluator, seq, bar)
    after_refine = evaluator.calls
    completed = _complete_families(target, evaluator, seq)
    if completed is not None:
        ends.append(completed)
    bar.close()
    ranked = ranked_at(evaluator, seq)
    details = {"trial_evaluations": after_trials, "sweep_evaluations": after_sweep - after_trials,
               "refine_evaluations": after_refine - after_sweep, "family_evaluations": evaluator.calls - after_refine}
    if study.stopped_by_deadline:
        details["stopped_by"] = f"time budget after {study.n_trials} trials"

    if shared is not None:
        ranked, details["study"] = _record_and_rank(study, target, evaluator, seq, ranked, ends)
    return SearchResult(strategy="optuna", seq_len=seq, ranked=ranked, evaluations=evaluator.calls,
                        trials=study.n_trials, details=details, study=study.study)


def _sample(study, target, evaluator, seq: int, trials: int, shared, deadline, bar) -> None:
    """The warm starts and the sampler's trials; in a shared study, every worker's finished trials scored too."""
    if shared is None or not shared.collect_only:
        study.run(study.enqueue(warm_starts(target)[:trials]), bar)  # a worker's --trials N bounds its starts too
        study.run(max(0, trials - study.n_trials), bar, deadline)
    if shared is not None:
        from autosp.planner.search.optuna_study import finished_candidates

        finished = finished_candidates(study.optuna, study.study)  # every worker's trials
        if shared.collect_only and not finished:
            from autosp.errors import UsageError

            raise UsageError(f"the shared study {shared.study_name!r} has no finished trials yet: run workers "
                             f"with --trials N first (same request and --study-name), then --trials 0")
        for cand in finished:
            if not target.reason(cand):
                evaluator(cand, seq)


def _refine(target, evaluator, seq: int, bar) -> list:
    """The local refinement: the end point of each climb (the best candidates scored so far are its starts)."""
    keys = {}

    def key(c):
        k = keys.get(c)
        if k is None:
            k = keys[c] = rank_key(c, evaluator(c, seq))
        return k

    def better(a, b):
        return key(a) < key(b)

    def faster(a, b):
        return evaluator(a, seq).tokens_per_second > evaluator(b, seq).tokens_per_second

    def fits(a):
        return evaluator(a, seq).fits

    # climb inside each start's checkpointing policy first (each policy is its own basin), then let the
    # best point found move freely, with structural moves that re-choose the tiling/offload dial
    ends = []
    for start in _distinct_starts(ranked_at(evaluator, seq), REFINE_STARTS):
        policy = start.checkpointing
        ends.append(hill_climb(target, start, better, fits, faster, target.neighbours,
                               keep=lambda c, policy=policy: c.checkpointing == policy))
        bar.update()
    if ends:
        def with_completions(c):
            """One-knob moves, plus every structural move with its dial re-chosen by :func:`complete`."""
            for other in target.neighbours(c):
                yield other
                if any(getattr(other, k) != getattr(c, k) for k in target.KNOBS if k not in DIAL_KNOBS):
                    done = complete(target, other, lambda x: evaluator(x, seq))
                    if done is not None:
                        yield done
            done = complete(target, c, lambda x: evaluator(x, seq))
            if done is not None:
                yield done

        ends.append(hill_climb(target, min(ends, key=key), better, fits, faster, with_completions))
    return ends


def _complete_families(target, evaluator, seq: int):
    """The family completion (:func:`family_sweep`), in bulk where the space allows it: its best candidate or None."""
    from autosp.planner.search import bulk_search

    if bulk_search.supported(target):  # whole families in bulk: many more of them for the same time
        completed = family_sweep(target, ranked_at(evaluator, seq), lambda c: evaluator(c, seq),
                                 budget=FAMILY_SWEEP_BULK_CANDIDATES,
                                 best_of=lambda members: bulk_search.best_of(members, evaluator, seq))
    else:
        completed = family_sweep(target, ranked_at(evaluator, seq), lambda c: evaluator(c, seq))
    return completed


def _record_and_rank(study, target, evaluator, seq, ranked, ends):
    """Shared study: add the refinement's results (the best candidate scored here, and each climb's
    end) as trials, then rank the study's finished trials, best first; and describe the study."""
    from autosp.planner.search.optuna_study import add_trial, display, finished_candidates, summary_of

    optuna = study.optuna
    present = set(finished_candidates(optuna, study.study))
    best_here = next((c for c, e in ranked if e.fits), None)
    for cand in ([best_here] if best_here is not None else []) + list(ends):
        if cand not in present and not target.reason(cand):
            add_trial(optuna, study.study, target, cand, evaluator(cand, seq), "refine", study.worker)
            present.add(cand)
    in_study = set(finished_candidates(optuna, study.study))
    for cand in in_study:
        if not target.reason(cand):
            evaluator(cand, seq)
    ranked = [(c, e) for c, e in ranked_at(evaluator, seq) if c in in_study]
    info = {"storage": display(study.shared.storage), "study_name": study.shared.study_name,
            "worker": study.worker, **summary_of(optuna, study.study)}
    return ranked, info


def optuna_max_ctx(space, evaluator: Evaluator, trials: int = DEFAULT_TRIALS, seed: int = 0,
                   deadline: float | None = None, lean_sweep=None) -> SearchResult:
    """The longest context (TPE over the structural knobs at micro-batch 1, then a hill climb), then the
    fastest plan at it. ``lean_sweep(space, evaluator)``, when given, also prices the leanest point of every
    structure family into ``evaluator.max_ctx_memo`` before the climb (:func:`autosp.planner.search.fast.
    fast_longest_context`): where only a narrow corner of the space fits at all, TPE's trials may miss every
    fitting point (Llama-3.1-70B on two H100s: 60 trials found none, the leanest point fits 60k tokens)."""
    structural = space.with_workload(evaluator.workload(MAX_CTX)).lean_micro_batch()

    def value_fn(cand):
        if structural.reason(cand):
            return 0.0, {"valid": 1.0}
        ctx = evaluator.max_context(cand)
        return float(ctx), {"valid": 0.0 if ctx > 0 else 1.0}

    study = _Study(structural, seed, trials, value_fn, "optuna max-ctx")
    bar = progress_bar(None if deadline is not None else max(trials, len(warm_starts(structural))) + REFINE_STARTS,
                       "optuna max-ctx")
    study.run(study.enqueue(warm_starts(structural)[:trials]), bar)
    study.run(max(0, trials - study.n_trials), bar, deadline)
    if lean_sweep is not None:
        lean_sweep(space, evaluator)

    def better(a, b):
        incumbent = evaluator.max_context(b)
        return evaluator.max_context(a, must_beat=incumbent) > incumbent

    memo = evaluator.max_ctx_memo
    starts = sorted((c for c in memo if memo[c] > 0), key=lambda c: -memo[c])[:REFINE_STARTS]
    for start in starts:
        hill_climb(structural, start, better, lambda a: False, lambda a, b: False, structural.neighbours)
        bar.update()
    bar.close()
    stage1_trials = study.n_trials
    best_ctx = max(memo.values(), default=0)
    if best_ctx == 0:
        return SearchResult(strategy="optuna", seq_len=0, ranked=[], evaluations=evaluator.calls,
                            trials=stage1_trials, max_ctx=dict(memo))
    for cand, ctx in memo.items():  # the candidates that reach the longest context are in the ranking for sure
        if ctx == best_ctx:         # (at the boundary the throughput study may not sample one that fits)
            evaluator(cand, best_ctx)
    result = optuna_throughput(space, evaluator, trials=max(20, trials // 2), seed=seed, seq_len=best_ctx,
                               label="optuna at max-ctx", deadline=deadline)
    result.trials += stage1_trials
    if study.stopped_by_deadline:
        result.details["stopped_by"] = f"time budget after {stage1_trials} trials (longest context)"

    result.max_ctx = dict(memo)
    return result


__all__ = ["DEFAULT_TRIALS", "FAMILY_SWEEP_BULK_CANDIDATES", "FAMILY_SWEEP_EVALUATIONS", "MAX_TRIALS", "REFINE_STARTS",
           "family_sweep", "node_local_ring", "optuna_max_ctx",
           "optuna_throughput", "structure_sweep", "warm_starts"]
