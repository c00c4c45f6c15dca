"""Exhaustive search: score every valid candidate of the space (the reference the Optuna search is tested
against, and the right tool when the space is small or the answer must be provably the best).

- ``throughput``: one cost-model call per candidate; the ranking is :func:`evaluator.rank_key`.
- ``max-ctx``: the longest context any candidate fits, then the fastest candidate at that context.
  Micro-batch 1 is enough for the first stage (a bigger micro-batch never fits a longer sequence).
  Candidates are visited memory-lean first, and one that cannot fit the best context found so far
  plus one granule is dismissed after a single call, so the search stays exact and cheap.
"""

from __future__ import annotations

from autosp.cost_models.specs import CHECKPOINTING_POLICIES
from autosp.planner.search.evaluator import MAX_CTX, Evaluator, SearchResult, progress_bar, ranked_at


def exhaustive_throughput(space, evaluator: Evaluator, seq_len: int | None = None, label: str = "exhaustive") -> SearchResult:
    seq = space.workload.seq_len if seq_len is None else seq_len
    target = space if seq == space.workload.seq_len else space.with_workload(evaluator.workload(seq))
    candidates = list(target.candidates())
    bar = progress_bar(len(candidates), label)
    for cand in candidates:
        evaluator(cand, seq)
        bar.update()
    bar.close()
    return SearchResult(strategy="exhaustive", seq_len=seq, ranked=ranked_at(evaluator, seq),
                        evaluations=evaluator.calls, details={"space_size": len(candidates)})


def memory_lean_first(cand) -> tuple:
    return (-cand.offload_param, -cand.offload_optimizer, -cand.zero_stage,
            -CHECKPOINTING_POLICIES.index(cand.checkpointing), -cand.offload_chunks, -cand.sequence_chunks,
            -cand.offload_activations,
            -cand.mlp_chunks, -cand.loss_chunks, -cand.sp, -cand.ring, cand.overlap)


def longest_context(space, evaluator: Evaluator, label: str = "max-ctx") -> tuple[int, dict]:
    """(the longest context any micro-batch-1 candidate fits, {candidate: its exact max context} for
    the candidates that set a new record)."""
    structural = space.with_workload(evaluator.workload(MAX_CTX)).lean_micro_batch()
    candidates = sorted(structural.candidates(), key=memory_lean_first)
    best, records = 0, {}
    bar = progress_bar(len(candidates), label)
    for cand in candidates:
        ctx = evaluator.max_context(cand, must_beat=best)
        if ctx > best:
            best, records[cand] = ctx, ctx
        bar.update()
    bar.close()
    return best, records


def exhaustive_max_ctx(space, evaluator: Evaluator) -> SearchResult:
    best_ctx, records = longest_context(space, evaluator)
    if best_ctx == 0:
        return SearchResult(strategy="exhaustive", seq_len=0, ranked=[], evaluations=evaluator.calls,
                            max_ctx=records)
    result = exhaustive_throughput(space, evaluator, seq_len=best_ctx, label="fastest at max-ctx")
    result.max_ctx = dict(evaluator.max_ctx_memo)
    return result


__all__ = ["exhaustive_max_ctx", "exhaustive_throughput", "longest_context", "memory_lean_first"]
