"""Infeasible requests: what the leanest plan would need, and how many GPUs of the same kind would make
the request fit (the one line ``autosp-plan`` prints with exit code 3)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np

from autosp.contract.knobs import BY_NAME, lean_alternatives, lean_knobs
from autosp.contract.specs import Candidate, Estimate
from autosp.errors import UsageError
from autosp.units import format_gib, format_tokens


def _leanest(space, seq_len: int):
    """(candidate, estimate) with the least memory of the space at ``seq_len``, or None where it has no candidate:
    where the bulk model prices the hardware, the whole space at its smallest micro-batch (memory grows with the
    micro-batch) priced in bulk, the points within bulk.ROUNDING_SLACK of the least re-priced by the scalar model,
    the simplest of the least kept; elsewhere the least among the memory-lean corner (:func:`_lean_corner`, which
    can miss leaner points)."""
    from autosp.cost_models import bulk
    from autosp.cost_models.estimate import estimate

    workload = replace(space.workload, seq_len=seq_len)
    target = space.with_workload(workload)
    if bulk.supported(target.hardware) is None:
        best = _least_memory_in_bulk(target.lean_micro_batch(), workload)
    else:
        corner = [cand for cand in _lean_corner(target) if not target.reason(cand)]
        best = _least_memory(target, workload, corner) if corner else None
    if best is None:
        return None
    return best, estimate(target.model, target.hardware, workload, best, target.profile)


def _least_memory_in_bulk(target, workload):
    """The least-memory candidate of ``target`` (every candidate priced in bulk, the near-least by the scalar
    model; ties: the simplest), or None."""
    from autosp.cost_models import bulk
    from autosp.cost_models.estimate import memory_only
    from autosp.planner.search.bulk_search import row_candidate, score_space
    from autosp.planner.search.evaluator import simplicity

    groups, arrays = score_space(target)
    memory = arrays["memory"]
    if not len(memory):
        return None
    near = np.flatnonzero(memory <= memory.min() * (1 + bulk.ROUNDING_SLACK))
    cands = [row_candidate(target, *groups[int(arrays["group"][i])], int(arrays["row"][i])) for i in near]
    return min(cands, key=lambda c: (memory_only(target.model, target.hardware, workload, c, target.profile).total,
                                     simplicity(c)))


def _lean_corner(target):
    """The memory-lean corner of each layout: every knob at its lean value (autosp.contract.knobs), then the
    variations that trade one memory for another: checkpointing, the offloads (they share the host's memory), ZeRO
    stage with loss tiling, ep."""
    for sp, ring in target.layouts():
        per = target.per_layout_choices(sp, ring)
        if per is None or not per["micro_batch"]:
            continue
        # ZeRO-3's gathered weights and prefetch buckets can cost more than it shards (on one GPU it shards
        # nothing), and with the loss tiled it keeps the LM head gathered (memory.zero3_gathered_params): the leanest
        # is ZeRO-3 with the loss tiled finest or untiled, or the highest other stage with the loss tiled finest.
        zero_loss = {(max(per["zero_stage"]), max(per["loss_chunks"] or (1,))), (max(per["zero_stage"]), 1),
                     (max(z for z in per["zero_stage"] if z < 3) if min(per["zero_stage"]) < 3 else 3,
                      max(per["loss_chunks"] or (1,)))}
        # offload: activation offload, or (with the most sequence chunks) chunk offload, or neither
        seq = max(per["sequence_chunks"] or (1,))
        offloads = [(True, 1, False), (False, 1, False), (False, seq, False), (False, seq, True)]
        eps = sorted({per["ep"][0], per["ep"][-1]})  # no expert parallelism, or the most (cost_models/moe.py)
        lean = lean_knobs({name: values or (BY_NAME[name].default,) for name, values in per.items()})
        params = lean_alternatives("offload_param", per["offload_param"] or (False,))
        for ckpt, (offload, chunks, chunk_off), optim, (zero, loss), ep, param in itertools.product(
                ("full", "sequence"), offloads, (True, False), sorted(zero_loss), eps, params):
            yield target.make(**dict(lean, sp=sp, ring=ring, zero_stage=zero, checkpointing=ckpt, loss_chunks=loss,
                                     offload_activations=offload, overlap="none", offload_optimizer=optim,
                                     sequence_chunks=chunks, offload_chunks=chunk_off, ep=ep,
                                     offload_param=param))


def _least_memory(target, workload, corner: list):
    """The first point of ``corner`` with the least memory by the scalar model: the corner is priced in bulk (one
    vectorised call per shape, where the bulk model prices this hardware) and only the points near the least are
    priced again one by one (within bulk.ROUNDING_SLACK of the least), so the choice is the scalar model's."""
    from autosp.cost_models import bulk
    from autosp.cost_models.estimate import memory_only

    if bulk.supported(target.hardware) is None:
        memories = bulk.estimate_many(target.model, target.hardware, workload, corner, target.profile).memory
        least = memories.min()
        if math.isfinite(least):
            corner = [cand for cand, m in zip(corner, memories) if m <= least * (1 + bulk.ROUNDING_SLACK)]
    best = None
    for cand in corner:
        memory = memory_only(target.model, target.hardware, workload, cand, target.profile).total
        if best is None or memory < best[1]:
            best = (cand, memory)
    return best[0]


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
    from autosp.planner.search.space import build_space

    hw = space.hardware
    last = None
    factor = first_factor
    while hw.nodes * factor <= MAX_SCALE_NODES:
        bigger = replace(hw, nodes=hw.nodes * factor)
        try:  # the pins hold on the bigger cluster too, or it is no answer (a hint that ignored them recedes)
            sub = build_space(space.model, bigger, replace(space.workload, seq_len=seq_len),
                              allow_cross_node_sp=cross, profile=space.profile, fixed=space.fixed)
        except UsageError:
            break
        lean = _leanest(sub, seq_len)
        if lean is not None and lean[1].fits:
            return bigger.nodes, None
        if lean is not None:
            last = (bigger, lean)
        factor *= 2
    return None, last


def _gpus_needed(space, seq_len: int, allow_cross_node_sp: bool):
    """(nodes with node-local SP groups or None, nodes with groups spanning nodes or None, leanest at the
    largest size tried).

    With ``allow_cross_node_sp`` (the default) only the second is searched; without it (the request said
    ``--no-cross-node-sp``) both are, the second from the cluster as it is: dropping the flag alone may be
    what is missing."""
    within = (None, None) if allow_cross_node_sp else _smallest_fit(space, seq_len, False, 2)
    across = _smallest_fit(space, seq_len, True, 2 if allow_cross_node_sp else 1)
    return within[0], across[0], across[1] or within[1]


def more_gpus_hint(space, seq_len: int, allow_cross_node_sp: bool) -> str:
    within, across, last = _gpus_needed(space, seq_len, allow_cross_node_sp)
    per = space.hardware.devices_per_node

    def gpus(nodes: int, extra: str = "") -> str:
        return f"about {nodes * per:,} GPUs would fit{extra} (--nodes {nodes})"

    if allow_cross_node_sp:
        if across is not None:
            return gpus(across)
    elif across is not None and across == space.hardware.nodes:
        return ("it fits on these GPUs with SP groups spanning nodes (drop --no-cross-node-sp: their all-to-alls "
                f"and ring steps then use the inter-node links){'; or ' + gpus(within) if within else ''}")
    elif across is not None and (within is None or across < within):
        return (gpus(across, " with SP groups spanning nodes (drop --no-cross-node-sp)")
                + (f"; {gpus(within, ' with node-local groups')}" if within else ""))
    elif within is not None:
        return gpus(within)
    if last is None:
        return "more GPUs of this kind would not help"
    bigger, (cand, est) = last
    return f"more GPUs would not help: even on {bigger.world_size:,} of them {_needs(cand, est)}"


def _searched_leanest(space, evaluator, leanest: Candidate):
    """(candidate, estimate) of the leanest point a search found (SearchResult.leanest), shown without an overlap
    schedule where it may have none (the schedule changes no memory), as :func:`_lean_corner` shows it."""
    knobs = {name: value for name, value in leanest.__dict__.items() if name not in ("dp", "grad_accum")}
    plain = space.make(**dict(knobs, overlap="none"))
    cand = leanest if space.reason(plain) else plain
    return cand, evaluator(cand, space.workload.seq_len)


def infeasible_message(space, evaluator, objective: str, allow_cross_node_sp: bool, hint: bool = True,
                       leanest: Candidate | None = None) -> str:
    """Why nothing fits, on one line; ``hint``: also how many GPUs would (it prices bigger clusters: a
    sweep, which plans many requests, leaves it out). ``leanest``: the space's least-memory point where the
    search found it (SearchResult.leanest; a throughput request's only), else the memory-lean corner is priced."""
    seq_len = space.workload.seq_len
    if objective == "max-ctx":
        from autosp.planner.search.evaluator import CTX_GRANULE

        seq_len = CTX_GRANULE
    lean = _searched_leanest(space, evaluator, leanest) if leanest is not None and objective != "max-ctx" \
        else _leanest(space, seq_len)
    hw = space.hardware
    where = f"{hw.nodes}x{hw.devices_per_node} {hw.accelerator.name}" if hw.nodes > 1 else \
        f"{hw.devices_per_node}x {hw.accelerator.name}"
    if lean is None:
        return f"no valid candidate for {space.model.name} on {where}"
    what = f"{space.model.name} at {format_tokens(seq_len)} tokens on {where}: {_needs(*lean)}"
    if not hint:
        return f"no plan fits {what}"
    return f"no plan fits {what}; {more_gpus_hint(space, seq_len, allow_cross_node_sp)}"


__all__ = ["infeasible_message", "more_gpus_hint"]
