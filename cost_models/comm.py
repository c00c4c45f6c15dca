"""Collective communication times, alpha-beta model (docs/cost_model.md, "Communication").

time = steps x alpha + bytes each GPU sends / (link bandwidth x comm_efficiency)

Placement: SP groups are packed inside a node first (ranks r..r+P-1 of a node), DP goes across.
Inside an SP group of P = U x R ranks, each Ulysses group is U consecutive ranks (inside a node unless
U > devices_per_node) and each ring is R ranks strided by U (cost_models/ring.py prices the ring).
A group of g ranks spans nodes when g > devices_per_node; then each GPU's traffic to peers in other
nodes goes over its share of the scale-out network (inter_node_bandwidth) and to peers in its own
node over NVLink/Infinity Fabric, concurrently; the slower of the two sets the time.
"""

from __future__ import annotations

import math

from autosp.contract import deepspeed_buffers as ds
from autosp.cost_models import moe
from autosp.cost_models.shapes import Shapes
from autosp.contract.specs import Candidate, HardwareSpec


def _xfer(nbytes: float, bandwidth: float) -> float:
    if nbytes <= 0:
        return 0.0
    return nbytes / bandwidth if bandwidth > 0 else math.inf


def all_to_all_time(hw: HardwareSpec, group: int, buffer_bytes: float) -> float:
    """One all-to-all over ``group`` ranks of a local buffer of ``buffer_bytes``: each rank keeps
    1/group of it and sends (group-1)/group; one latency term (NCCL posts all peer sends at once)."""
    if group <= 1 or buffer_bytes <= 0:
        return 0.0
    eff = hw.comm_efficiency
    local = min(group, hw.devices_per_node)
    intra = buffer_bytes * (local - 1) / group
    inter = buffer_bytes * (group - local) / group
    t_intra = _xfer(intra, hw.intra_node_bandwidth * eff)
    t_inter = _xfer(inter, hw.inter_node_bandwidth * eff)
    latency = hw.inter_node_latency if group > hw.devices_per_node else hw.intra_node_latency
    return latency + max(t_intra, t_inter)


def expert_all_to_all_time(hw: HardwareSpec, ms, s: float, e: int, recomputed_forwards: int,
                           mlp_chunks: int) -> float:
    """Seconds of one micro-batch's mixture-of-experts dispatch and combine all-to-alls on one GPU
    (cost_models/moe.py): :func:`moe.all_to_alls_per_layer` per MoE layer, each over the ep consecutive ranks of
    the EP group (intra-node peers over NVLink, the others over the scale-out network); a tiled MLP runs each per
    tile (the same bytes, one latency per tile). 0 without expert parallelism."""
    buffer = moe.dispatch_buffer_bytes(ms, s, e)
    if buffer <= 0:
        return 0.0
    one = all_to_all_time(hw, ms.ep, buffer)
    latency = hw.inter_node_latency if ms.ep > hw.devices_per_node else hw.intra_node_latency
    one += (max(1, mlp_chunks) - 1) * latency
    return ms.moe_layers * moe.all_to_alls_per_layer(recomputed_forwards) * one


def ring_time(hw: HardwareSpec, group: int, nbytes: float, kind: str, calls: int = 1) -> float:
    """A ring all-gather / reduce-scatter ((g-1)/g of ``nbytes`` per rank, g-1 steps) or all-reduce
    (twice that), issued as ``calls`` bucketed collectives. ``nbytes`` is the full (unsharded) size.
    Across nodes NCCL runs one ring per NIC, so each GPU's NIC share is the bottleneck."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    factor = 2.0 if kind == "all_reduce" else 1.0
    spans = group > hw.devices_per_node
    bandwidth = (hw.inter_node_bandwidth if spans else hw.intra_node_bandwidth) * hw.comm_efficiency
    latency = hw.inter_node_latency if spans else hw.intra_node_latency
    steps = factor * (group - 1) * max(1, calls)
    return steps * latency + _xfer(factor * (group - 1) / group * nbytes, bandwidth)


def ulysses_layer_times(hw: HardwareSpec, sh: Shapes) -> tuple[float, float, float, float]:
    """(q, k, v, out) all-to-all times of one layer's forward for one micro-batch on one GPU.

    The all-to-alls run over the U Ulysses ranks (U = P without a ring; none for a pure ring).
    Buffers: q and out carry s x q elements; k and v carry s x k_eff (KV heads replicated U / n_kv
    times when U > n_kv, so every rank receives the KV head its query heads need). The backward runs
    the same four on the gradients; full recompute repeats the forward four. With N sequence chunks
    each runs N times on 1/N of the tokens: the same bytes, N latencies.
    """
    P = sh.U
    if P <= 1:
        return 0.0, 0.0, 0.0, 0.0
    # all_to_all_time for the two buffer sizes, with the link split computed once
    eff = hw.comm_efficiency
    local = min(P, hw.devices_per_node)
    latency = hw.inter_node_latency if P > hw.devices_per_node else hw.intra_node_latency
    latency *= sh.N  # sequence-chunked layers run each all-to-all once per chunk, 1/N of the bytes each
    unit = sh.s * sh.e / P
    intra_bw, inter_bw = hw.intra_node_bandwidth * eff, hw.inter_node_bandwidth * eff
    times = []
    for width in (sh.q, sh.k_eff):
        t_intra = _xfer(unit * width * (local - 1), intra_bw)
        t_inter = _xfer(unit * width * (P - local), inter_bw)
        times.append(latency + (t_intra if t_intra > t_inter else t_inter))
    t_q, t_kv = times
    return t_q, t_kv, t_kv, t_q


def ulysses_bytes_per_layer(sh: Shapes) -> float:
    """Bytes one GPU sends in one layer's forward all-to-alls over its U Ulysses ranks (for tests and reports)."""
    if sh.U <= 1:
        return 0.0
    return (2 * sh.q + 2 * sh.k_eff) * sh.s * sh.e * (sh.U - 1) / sh.U


def zero_times(hw: HardwareSpec, cand: Candidate, n_params: float, e: int, group: int | None = None,
               spans: bool | None = None) -> tuple[float, float, float, float]:
    """ZeRO collectives over the dp x sp group, in seconds.

    Returns (per_step, per_micro_fwd, per_micro_bwd, exposed_per_step): comm once per optimizer step,
    comm overlappable with each micro-batch's forward, with each backward, and the part of the
    per-step comm that is never hidden.
    stage 0: all-reduce of the gradients after the last backward (DeepSpeed reduces at the
    accumulation boundary) - exposed; stage 1: reduce-scatter of the gradients at the boundary plus
    all-gather of the updated parameters - exposed; stage 2: reduce-scatter in every backward
    (overlapped), all-gather of the parameters after the step (exposed); stage 3: all-gather of the
    parameters in every forward and again in every backward, reduce-scatter of the gradients in
    every backward (all prefetched/overlapped; the first layer's gather is exposed).

    ``group`` and ``spans``: another group than all dp x sp ranks, and whether it crosses nodes (the routed
    experts' expert-data-parallel group: cost_models/moe.py).
    """
    g = cand.sp * cand.dp if group is None else group
    if g <= 1:
        return 0.0, 0.0, 0.0, 0.0
    # ring_time inlined: one link for every ZeRO collective of this group
    spans = g > hw.devices_per_node if spans is None else spans
    bandwidth = (hw.inter_node_bandwidth if spans else hw.intra_node_bandwidth) * hw.comm_efficiency
    alpha = (hw.inter_node_latency if spans else hw.intra_node_latency) * (g - 1)
    one_pass = _xfer((g - 1) / g * n_params * e, bandwidth)  # reduce-scatter or all-gather bytes
    reduce_calls = math.ceil(n_params / ds.reduce_bucket_elements(n_params))
    stage = cand.zero_stage
    if stage == 0:
        t = 2.0 * (alpha * reduce_calls + one_pass)  # all-reduce = reduce-scatter + all-gather
        return t, 0.0, 0.0, t
    gather_calls = math.ceil(n_params / (ds.STAGE3_PREFETCH_BUCKET_SIZE if stage == 3 else ds.ALLGATHER_BUCKET_SIZE))
    reduce_scatter = alpha * reduce_calls + one_pass
    all_gather = alpha * gather_calls + one_pass
    if stage == 1:
        t = reduce_scatter + all_gather
        return t, 0.0, 0.0, t
    if stage == 2:
        return all_gather, 0.0, reduce_scatter, all_gather
    return 0.0, all_gather, all_gather + reduce_scatter, 0.0


__all__ = ["all_to_all_time", "expert_all_to_all_time", "ring_time", "ulysses_bytes_per_layer", "ulysses_layer_times", "zero_times"]
