"""Step time: compute, recompute, exposed communication under the overlap schedule, offload.

See docs/cost_model.md ("Step time") for the assumptions. All times are seconds on one GPU; a step
is ``grad_accum`` micro-batches plus one optimizer step.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from autosp.cost_models import (chunks as seq_chunks, comm, flops, linear_attention, moe, optimizer_offload,
                                param_offload, ring, softcap)
from autosp.cost_models.shapes import Shapes
from autosp.contract.specs import Candidate, HardwareSpec, TimeBreakdown

ZERO_OVERLAP_FRACTION = 0.8
"""Share of a compute window that overlapped ZeRO collectives can hide behind (NCCL kernels take SMs
and HBM bandwidth from the compute they overlap; DeepSpeed overlap_comm)."""

TILE_OVERHEAD_S = 20e-6
"""Fixed cost of one tile of sequence tiling (MLP or logits+loss chunk): kernel launches for smaller
GEMMs, the tiling loop and its bookkeeping. Makes more chunks cost a little more, as measured."""

HOST_ADAM_BANDWIDTH_PER_NODE = 0.6 * 2 * 307.2e9
"""The host DRAM bandwidth of a node whose profile does not give one (``HardwareSpec.host_memory_bandwidth`` 0):
a DGX H100 node's, two sockets of 8 DDR5-4800 channels (307.2 GB/s each; Intel ARK, Xeon Platinum 8480+, the CPU
of DGX H100 per its user guide) at the 60% a STREAM-like kernel sustains."""


def host_memory_bandwidth(hw: HardwareSpec) -> float:
    """The sustained host DRAM bandwidth of one of ``hw``'s nodes (B/s), shared by the node's GPUs: CPU Adam streams
    the optimizer states through it under optimizer offload (ZeRO-Offload's CPU Adam is bandwidth-bound, arXiv
    2101.06840 sec. 5.1), and offloaded chunks' host<->device copies move each byte through it once. The profile's
    figure (the catalog's, from the node's CPUs, or ``autosp-calibrate``'s measurement), else
    HOST_ADAM_BANDWIDTH_PER_NODE."""
    return hw.host_memory_bandwidth or HOST_ADAM_BANDWIDTH_PER_NODE


HEAD_PIPELINE_CHUNKS = 4
"""``head_pipeline`` splits each layer's attention into this many head groups (fewer if a rank has
fewer local query heads); the all-to-all of group i+1 runs under the attention of group i."""


def _head_chunks(sh: Shapes) -> int:
    return max(1, min(HEAD_PIPELINE_CHUNKS, sh.local_heads))


def _exposed_attention_comm(overlap: str, t_q: float, t_k: float, t_v: float, t_o: float,
                            t_proj_q: float, t_attention: float, chunks: int) -> float:
    """Exposed all-to-all time of one pass (forward, backward or recompute) of one layer.

    none: everything. kv_async: the K and V all-to-alls run while the Q projection (and its backward)
    computes, so up to that compute is hidden. head_pipeline over C chunks: the first chunk's
    all-to-all is exposed, the rest only where it outlasts the attention compute it overlaps:
    T/C + (C-1)/C x max(0, T - A).
    """
    total = t_q + t_k + t_v + t_o
    if overlap == "kv_async":
        return total - min(t_k + t_v, t_proj_q)
    if overlap == "head_pipeline" and chunks > 1:
        return total / chunks + (chunks - 1) / chunks * max(0.0, total - t_attention)
    return total


def _zero_times(hw: HardwareSpec, cand: Candidate, sh: Shapes, n_params: float) -> tuple[float, float, float, float]:
    """ZeRO's collectives (comm.zero_times): a dense model's over all dp x sp ranks; a mixture of experts' routed
    experts (each rank's E / ep of them) separately over the world / ep ranks holding the same experts, strided by
    ep, so that group crosses nodes whenever the world does (cost_models/moe.py)."""
    if sh.moe is None:
        return comm.zero_times(hw, cand, n_params, sh.e)
    ms = sh.moe
    rest = comm.zero_times(hw, cand, n_params - ms.expert_params, sh.e)
    group = ms.world // ms.ep
    experts = comm.zero_times(hw, cand, ms.expert_params / ms.ep, sh.e, group=group,
                              spans=group > 1 and ms.world > hw.devices_per_node)
    return tuple(a + b for a, b in zip(rest, experts))


def step_time(hw: HardwareSpec, cand: Candidate, sh: Shapes, n_params: float,
              offload_layer_bytes: float) -> TimeBreakdown:
    return step_time_parts(hw, cand, sh, n_params, offload_layer_bytes)[0]


def step_time_parts(hw: HardwareSpec, cand: Candidate, sh: Shapes, n_params: float,
                    offload_layer_bytes: float) -> tuple[TimeBreakdown, float, float]:
    """(TimeBreakdown, ring P2P seconds per step, of which exposed). The ring's P2P is part of the
    breakdown's ``attention_comm`` (with the all-to-alls) and its exposed share part of ``exposed_comm``;
    the two extra numbers let the estimate explain it."""
    c = _micro_compute(hw, cand, sh)
    t_optimizer, optimizer_copies = _optimizer_times(hw, cand, sh, n_params, c)
    # parameter offload: each pass fetches the weights from the host, prefetched under its compute
    passes_compute = (c.fwd, c.recompute, c.bwd) if param_offload.passes(cand) == 3 else (c.fwd, c.bwd)
    _param_copy, param_exposed = param_offload.fetch_times(hw, cand, sh, passes_compute, ZERO_OVERLAP_FRACTION)
    attention_comm_micro, exposed_attention_micro, ring_micro, ring_exposed_micro = _attention_comm(hw, cand, sh, c)
    offload_micro = _activation_offload(hw, cand, sh, c, offload_layer_bytes)
    # mixture of experts: dispatch and combine all-to-alls, on the critical path (cost_models/moe.py)
    expert_micro = comm.expert_all_to_all_time(hw, sh.moe, sh.s, sh.e, flops.layer_forwards_recomputed(sh, cand)[0],
                                               cand.mlp_chunks)
    zero_total, zero_exposed = _zero(hw, cand, sh, n_params, c)

    ga = cand.grad_accum
    compute = ga * c.micro + t_optimizer
    recompute = ga * c.recompute
    attention_comm = ga * attention_comm_micro
    exposed = ga * (exposed_attention_micro + expert_micro) + zero_exposed
    offload = ga * (offload_micro + param_exposed) + optimizer_copies
    breakdown = TimeBreakdown(compute=compute, recompute=recompute, attention_comm=attention_comm,
                              zero_comm=zero_total, offload=offload, exposed_comm=exposed,
                              step=compute + exposed + offload, expert_comm=ga * expert_micro)
    return breakdown, ga * ring_micro, ga * ring_exposed_micro


_BEYOND_ZERO = operator.attrgetter(*(name for name in Candidate.__dataclass_fields__
                                   if name not in ("zero_stage", "offload_optimizer")))
"""A candidate's knobs other than its ZeRO stage and optimizer offload (what step_seconds_over_zero_stages shares)."""


def share_stage_free_terms(cands: list[Candidate]) -> bool:
    """Whether ``cands`` differ only in their ZeRO stage (and optimizer offload) and offload neither parameters,
    activations nor sequence chunks: what :func:`step_seconds_over_zero_stages` takes."""
    shared = _BEYOND_ZERO(cands[0])
    return not any(c.offload_param or c.offload_activations or c.offload_chunks or _BEYOND_ZERO(c) != shared
                   for c in cands)


def step_seconds_over_zero_stages(hw: HardwareSpec, cands: list[Candidate], sh: Shapes, n_params: float) -> list[float]:
    """``step_time_parts(hw, cand, sh, n_params, 0.0)[0].step`` for each of ``cands``, which must
    :func:`share_stage_free_terms` (a search's speed bound: its undialed points, one per stage). The terms no ZeRO
    stage changes (the compute, the attention's communication, the experts' all-to-alls) are computed once; each
    step adds them up in step_time_parts' order, so every result is that function's to the last bit."""
    first = cands[0]
    if not share_stage_free_terms(cands):
        raise ValueError("step_seconds_over_zero_stages takes candidates that differ only in their ZeRO stage "
                         "and offload neither parameters, activations nor sequence chunks")
    c = _micro_compute(hw, first, sh)
    _copy, attention_exposed, _ring, _ring_exposed = _attention_comm(hw, first, sh, c)
    expert_micro = comm.expert_all_to_all_time(hw, sh.moe, sh.s, sh.e, flops.layer_forwards_recomputed(sh, first)[0],
                                               first.mlp_chunks)
    ga = first.grad_accum
    steps = []
    for cand in cands:
        t_optimizer, optimizer_copies = _optimizer_times(hw, cand, sh, n_params, c)
        _total, zero_exposed = _zero(hw, cand, sh, n_params, c)
        compute = ga * c.micro + t_optimizer
        exposed = ga * (attention_exposed + expert_micro) + zero_exposed
        steps.append(compute + exposed + optimizer_copies)  # no activation or parameter offload: 0 + 0 there
    return steps


@dataclass(slots=True)  # built once per estimate: no frozen-init overhead
class _Micro:
    """The compute of one micro-batch (seconds) and the rates the communication terms compare it with."""

    fwd: float
    bwd: float
    recompute: float
    att_fwd: float  # attention's share of the forward
    mm_rate: float

    @property
    def micro(self) -> float:
        return self.fwd + self.bwd + self.recompute


def _micro_compute(hw: HardwareSpec, cand: Candidate, sh: Shapes) -> _Micro:
    """Forward, backward and recompute time of one micro-batch: matmuls, attention, pointwise traffic, and
    the fixed overhead of each tile and chunk."""
    peak = hw.accelerator.peak_flops
    mm_rate = peak * hw.matmul_efficiency
    att_rate = peak * hw.attention_efficiency
    mem_bw = hw.accelerator.memory_bandwidth
    L = sh.L
    mm_fwd = flops.matmul_flops_forward(sh) + moe.imbalance_flops_forward(sh.moe, sh.s)  # busiest EP rank
    att_fwd = flops.attention_flops_forward(sh)
    mm_re, att_re = flops.recompute_flops(sh, cand)
    pw_base, pw_re = flops.pointwise_bytes(sh, cand)
    t_mm_fwd = mm_fwd / mm_rate
    # ring steps and sequence chunks run shorter, slower attention kernels (1 without either)
    ring_factor = seq_chunks.compute_factor(sh)
    capped_fwd, capped_bwd = softcap.attention_slowdown(sh.model)  # Gemma 2's attention soft-capping
    t_att_fwd = att_fwd / att_rate * ring_factor * capped_fwd
    t_pw = pw_base / mem_bw if mem_bw > 0 else 0.0
    prof = sh.prof
    pw_bwd = prof.pw_bwd_factor
    t_fwd = t_mm_fwd + t_att_fwd + t_pw / (1.0 + pw_bwd)
    t_bwd = (prof.matmul_bwd_factor * t_mm_fwd + prof.attn_bwd_factor * t_att_fwd * capped_bwd / capped_fwd
             + pw_bwd * t_pw / (1.0 + pw_bwd))
    t_recompute = (mm_re / mm_rate + att_re / att_rate * ring_factor * capped_fwd
                   + (pw_re / mem_bw if mem_bw > 0 else 0.0))
    if sh.lin is not None:  # a hybrid's linear-attention cores (cost_models/linear_attention.py)
        lin_fwd, lin_bwd, lin_re = linear_core_seconds(hw, sh, cand.checkpointing)
        t_fwd, t_bwd, t_recompute = t_fwd + lin_fwd, t_bwd + lin_bwd, t_recompute + lin_re
    if cand.mlp_chunks > 1:  # chunks run in the forward, again (with grad) in the backward, and in a full recompute
        t_recompute += TILE_OVERHEAD_S * cand.mlp_chunks * L * (3 if cand.checkpointing == "full" else 2)
    if cand.loss_chunks > 1:
        t_recompute += TILE_OVERHEAD_S * cand.loss_chunks * 2
    if sh.N > 1:  # every chunk of every layer in the forward, each recompute and the backward
        t_recompute += TILE_OVERHEAD_S * sh.N * L * (2 + flops.layer_forwards_recomputed(sh, cand)[0])
    return _Micro(fwd=t_fwd, bwd=t_bwd, recompute=t_recompute, att_fwd=t_att_fwd, mm_rate=mm_rate)


def linear_core_seconds(hw: HardwareSpec, sh: Shapes, policy: str) -> tuple[float, float, float]:
    """(forward, backward, recompute) seconds of a hybrid model's linear-attention cores in one micro-batch: their
    chunked matmuls at the attention kernels' rate (Triton kernels of small matmuls, as flash attention's), the
    backward re-running the forward (linear_attention.BWD_FACTOR), a full checkpoint the forward once more."""
    rate = hw.accelerator.peak_flops * hw.attention_efficiency
    forward = linear_attention.core_flops_forward(sh.lin) / rate
    return forward, linear_attention.BWD_FACTOR * forward, forward if policy == "full" else 0.0


def linear_all_to_all_seconds(hw: HardwareSpec, sh: Shapes, policy: str) -> float:
    """Seconds of a hybrid model's linear-attention all-to-alls in one micro-batch (0 without, or with U = 1): per
    layer the slots in and the output back in the forward, their gradients in the backward, the forward's again
    under full checkpointing; all on the critical path (the op waits for its whole input; no overlap schedule
    applies to these layers)."""
    ls = sh.lin
    if ls is None or ls.U <= 1:
        return 0.0
    one = sum(comm.all_to_all_time(hw, ls.U, sh.s * width * sh.e) for width in linear_attention.all_to_all_widths(ls))
    return ls.layers * (3 if policy == "full" else 2) * one


def _optimizer_times(hw: HardwareSpec, cand: Candidate, sh: Shapes, n_params: float, c: _Micro) -> tuple[float, float]:
    """(the optimizer step, the exposed host copies of an offloaded optimizer) in seconds."""
    if not cand.offload_optimizer:
        mem_bw = hw.accelerator.memory_bandwidth
        local = moe.optimizer_params(sh.moe, n_params, cand.zero_stage)
        return (flops.optimizer_bytes(local, cand) / mem_bw if mem_bw > 0 else 0.0), 0.0
    # ZeRO-Offload as DeepSpeed runs it (optimizer_offload.py): host passes over the partition at the GPU's share of
    # the node's DRAM bandwidth; the gradients come down during the backwards (hidden up to the overlap fraction,
    # like ZeRO's own reduce-scatter); the updated weights go back up before the next forward
    local = n_params / (cand.sp * cand.dp)
    t_optimizer = optimizer_offload.host_step_seconds(local, host_memory_bandwidth(hw) / hw.devices_per_node)
    offload = optimizer_offload.copies_exposed(local, sh.e, cand.zero_stage, param_offload.enabled(cand),
                                               cand.grad_accum, hw.host_bandwidth * hw.comm_efficiency,
                                               ZERO_OVERLAP_FRACTION * c.bwd)
    return t_optimizer, offload


def _attention_comm(hw: HardwareSpec, cand: Candidate, sh: Shapes, c: _Micro) -> tuple[float, float, float, float]:
    """(attention communication, of which exposed, ring P2P, of which exposed) of one micro-batch: the Ulysses
    all-to-alls and the ring's P2P of every pass that runs attention."""
    L, La = sh.L, sh.La  # a hybrid model's linear layers have their own all-to-alls (linear_all_to_all_seconds)
    t_q, t_k, t_v, t_o = comm.ulysses_layer_times(hw, sh)
    per_pass = t_q + t_k + t_v + t_o
    # full recompute repeats the forward all-to-alls (sequence never recomputes a collective); a chunked layer
    # repeats them in its own recompute too, and under full once more; the ring's passes come back only with a
    # recomputed attention (a chunked layer's own recompute leaves attention out)
    forwards, with_attention = flops.layer_forwards_recomputed(sh, cand)
    passes = 2 + forwards if sh.N > 1 else (3 if cand.checkpointing == "full" else 2)
    ring_passes = 3 if with_attention else 2
    attention_comm_micro = La * passes * per_pass
    if per_pass > 0 and La:
        t_proj_q = 2.0 * sh.s * sh.qproj_params / c.mm_rate
        chunks = _head_chunks(sh)
        att_layer_fwd = c.att_fwd / La
        exposed_fwd = _exposed_attention_comm(cand.overlap, t_q, t_k, t_v, t_o, t_proj_q, att_layer_fwd, chunks)
        exposed_bwd = _exposed_attention_comm(cand.overlap, t_q, t_k, t_v, t_o, 2.0 * t_proj_q,
                                              sh.prof.attn_bwd_factor * att_layer_fwd, chunks)
        exposed_attention_micro = La * (exposed_fwd * (passes - 1) + exposed_bwd)
    else:
        exposed_attention_micro = 0.0
    if sh.lin is not None:
        linear = linear_all_to_all_seconds(hw, sh, cand.checkpointing)
        attention_comm_micro += linear
        exposed_attention_micro += linear

    # ring P2P of one micro-batch: each forward pass (forward, full recompute) and the backward
    ring_fwd, ring_fwd_exposed, ring_bwd, ring_bwd_exposed = ring.layer_times(hw, cand, sh, c.att_fwd / L,
                                                                               sh.prof.attn_bwd_factor)
    ring_micro = L * (ring_fwd * (ring_passes - 1) + ring_bwd)
    ring_exposed_micro = L * (ring_fwd_exposed * (ring_passes - 1) + ring_bwd_exposed)
    attention_comm_micro += ring_micro
    exposed_attention_micro += ring_exposed_micro
    return attention_comm_micro, exposed_attention_micro, ring_micro, ring_exposed_micro


def _activation_offload(hw: HardwareSpec, cand: Candidate, sh: Shapes, c: _Micro, offload_layer_bytes: float) -> float:
    """Exposed activation offload of one micro-batch: D2H in forward, H2D in backward, per layer, overlapped with
    compute."""
    L = sh.L
    offload_micro = 0.0
    recomputed = sh.N > 1 and cand.checkpointing == "full"
    if cand.offload_chunks:
        link = hw.host_bandwidth * hw.comm_efficiency
        dram = host_memory_bandwidth(hw) / hw.devices_per_node
        layer_set = sh.s * seq_chunks.saved_bytes_per_token(sh) if recomputed else offload_layer_bytes
        _copies, exposed_layer = seq_chunks.offload_exposed(sh, layer_set, c.fwd / L, (c.bwd + c.recompute) / L,
                                                            link, dram, recomputed=recomputed)
        offload_micro = L * exposed_layer
    if cand.offload_activations and (sh.N == 1 or recomputed) and offload_layer_bytes > 0:
        t_copy = comm._xfer(offload_layer_bytes, hw.host_bandwidth * hw.comm_efficiency)
        layer_fwd = c.fwd / L
        layer_bwd = (c.bwd + c.recompute) / L
        offload_micro += L * (max(0.0, t_copy - layer_fwd) + max(0.0, t_copy - layer_bwd))
    return offload_micro


def _zero(hw: HardwareSpec, cand: Candidate, sh: Shapes, n_params: float, c: _Micro) -> tuple[float, float]:
    """(ZeRO's communication per step, of which exposed)."""
    z_step, z_fwd, z_bwd, z_exposed = _zero_times(hw, cand, sh, n_params)
    ga = cand.grad_accum
    zero_total = z_step + ga * (z_fwd + z_bwd)
    zero_exposed = z_exposed
    if z_fwd or z_bwd:
        zero_exposed += ga * (max(0.0, z_fwd - ZERO_OVERLAP_FRACTION * c.fwd)
                              + max(0.0, z_bwd - ZERO_OVERLAP_FRACTION * (c.bwd + c.recompute)))
    if cand.zero_stage == 3:
        zero_exposed += ga * z_fwd / sh.L  # the first layer's gather has nothing to hide behind
    return zero_total, zero_exposed


__all__ = ["HEAD_PIPELINE_CHUNKS", "HOST_ADAM_BANDWIDTH_PER_NODE", "host_memory_bandwidth", "linear_all_to_all_seconds",
           "linear_core_seconds",
           "TILE_OVERHEAD_S", "ZERO_OVERLAP_FRACTION", "share_stage_free_terms", "step_seconds_over_zero_stages",
           "step_time", "step_time_parts"]
