"""The cost model's entry points: (ModelSpec, HardwareSpec, Workload, Candidate[, ModelProfile]) -> Estimate.

Every model-dependent cost comes from a :class:`~autosp.cost_models.profile.ModelProfile`: by default
the analytic one of ``model`` (docs/cost_model.md); pass ``profile=`` a graph-derived one
(:func:`autosp.profiling.graph.load_or_build`, docs/graph_profile.md) to price a model
that is not Llama-shaped.

``estimate`` raises ValueError (with the reason) for candidates the model cannot run: query heads
not divisible by the Ulysses degree (sp / ring), KV heads neither dividing nor divisible by it, or more
GPUs than the hardware has. Everything else (global batch bookkeeping, SP groups spanning nodes, ...) is the search's
policy; the estimate prices whatever it is given.
"""

from __future__ import annotations

import math

from autosp.cost_models import chunks, flops, ring
from autosp.cost_models.memory import capacity_bytes, memory_breakdown as _memory_breakdown, optimizer_host_bytes
from autosp.cost_models.profile import ModelProfile
from autosp.cost_models.shapes import Shapes
from autosp.contract.specs import Candidate, Estimate, HardwareSpec, MemoryBreakdown, ModelSpec, Workload
from autosp.cost_models.step_time import share_stage_free_terms, step_seconds_over_zero_stages, step_time_parts


def _check(hw: HardwareSpec, cand: Candidate) -> None:
    if cand.world_size > hw.world_size:
        raise ValueError(f"candidate needs {cand.world_size} GPUs (sp={cand.sp} x dp={cand.dp}); "
                         f"{hw.name} has {hw.world_size}")


def estimate(model: ModelSpec, hw: HardwareSpec, workload: Workload, cand: Candidate,
             profile: ModelProfile | None = None) -> Estimate:
    """Predicted per-GPU memory, step time, throughput and MFU of one candidate (``profile``: the
    model's costs; None = the analytic profile of ``model``)."""
    _check(hw, cand)
    sh = Shapes(model, workload, cand, profile)
    memory, (_kept, _transient, per_layer, host), notes = _memory_breakdown(model, hw, workload.dtype, cand, sh)
    n_params = sh.n_params
    time, ring_p2p, ring_exposed = step_time_parts(hw, cand, sh, n_params, per_layer)
    step = time.step
    tps = _tokens_per_second(workload, cand, step)
    model_flops_step = flops.model_flops(sh) * cand.grad_accum * cand.sp * cand.dp
    peak_all = hw.accelerator.peak_flops * cand.world_size
    mfu = model_flops_step / (step * peak_all) if 0 < step < math.inf and peak_all > 0 else 0.0
    notes += _layout_notes(hw, cand, sh, ring_p2p, ring_exposed)
    host_total = host + optimizer_host_bytes(cand, sh)
    notes += _chunk_notes(hw, cand, sh, host_total)
    return Estimate(memory=memory, time=time, capacity_bytes=capacity_bytes(hw), tokens_per_second=tps, mfu=mfu,
                    flops_per_step=model_flops_step, notes=notes, host_bytes=host_total)


def _tokens_per_second(workload: Workload, cand: Candidate, step: float) -> float:
    tokens = workload.seq_len * cand.micro_batch * cand.grad_accum * cand.dp
    return tokens / step if 0 < step < math.inf else 0.0


def tokens_per_second(model: ModelSpec, hw: HardwareSpec, workload: Workload, cand: Candidate,
                      profile: ModelProfile | None = None, shapes: Shapes | None = None) -> float:
    """``estimate(...).tokens_per_second`` alone: no memory breakdown (unless ``cand`` offloads activations or
    sequence chunks, whose copies it sizes) and no notes -- what a search's speed bound needs, at a third of the
    cost. ``shapes``: the candidate's Shapes, where the caller prices several candidates of one shape group."""
    _check(hw, cand)
    sh = Shapes(model, workload, cand, profile) if shapes is None else shapes
    per_layer = 0.0
    if cand.offload_activations or cand.offload_chunks:
        per_layer = _memory_breakdown(model, hw, workload.dtype, cand, sh)[1][2]
    return _tokens_per_second(workload, cand, step_time_parts(hw, cand, sh, sh.n_params, per_layer)[0].step)


def tokens_per_second_over_zero_stages(model: ModelSpec, hw: HardwareSpec, workload: Workload,
                                       cands: list[Candidate], profile: ModelProfile | None = None,
                                       shapes: Shapes | None = None) -> list[float]:
    """:func:`tokens_per_second` of each of ``cands``, candidates of one shape that differ only in their ZeRO stage
    (and optimizer offload): the same numbers, the terms no stage changes computed once
    (:func:`step_time.step_seconds_over_zero_stages`) where they :func:`step_time.share_stage_free_terms`, else one
    by one."""
    for cand in cands:
        _check(hw, cand)
    sh = Shapes(model, workload, cands[0], profile) if shapes is None else shapes
    if not share_stage_free_terms(cands):
        return [tokens_per_second(model, hw, workload, c, profile, sh) for c in cands]
    steps = step_seconds_over_zero_stages(hw, cands, sh, sh.n_params)
    return [_tokens_per_second(workload, cand, step) for cand, step in zip(cands, steps)]


def _chunk_notes(hw: HardwareSpec, cand: Candidate, sh: Shapes, host_total: float) -> tuple[str, ...]:
    """One-line remarks on sequence-chunked layers: chunk size, attention block speed, host memory per node."""
    if sh.N == 1:
        return ()
    notes = ()
    speed = 1.0 / chunks.compute_factor(sh) * (ring.compute_factor(sh) if sh.R > 1 else 1.0)
    line = f"each layer runs in {sh.N} sequence chunks of {sh.c:,} local tokens"
    if speed < 0.98:
        line += f"; chunked attention runs at {100 * speed:.0f}% of the unchunked kernel's speed"
    notes += (line,)
    if cand.offload_chunks:
        per_node = host_total * min(hw.devices_per_node, cand.world_size)
        notes += (f"offloaded chunks: {per_node / 2 ** 30:,.0f} GiB of pinned host memory per node "
                  f"(node has {hw.host_memory_bytes / 2 ** 30:,.0f} GiB)",)
    return notes


def _layout_notes(hw: HardwareSpec, cand: Candidate, sh: Shapes, ring_p2p: float,
                  ring_exposed: float) -> tuple[str, ...]:
    """One-line remarks on the SP layout: padding, KV replication, links, and what the ring costs."""
    notes = ()
    if sh.S_pad != sh.S:
        multiple = (f"a multiple of sp={cand.sp}" if cand.ring == 1 else
                    f"a multiple of 2 x sp = {2 * cand.sp}: 2 x ring zigzag chunks over {cand.ulysses} Ulysses ranks")
        notes += (f"sequence padded from {sh.S} to {sh.S_pad} tokens ({multiple})",)
    if sh.kv_copies > 1:
        degree = f"sp={cand.sp}" if cand.ring == 1 else f"ulysses={cand.ulysses}"
        notes += (f"each KV head is replicated {sh.kv_copies}x for the all-to-all ({degree} > {sh.n_kv} KV heads)",)
    per_node = hw.devices_per_node
    if cand.ring == 1:
        if cand.sp > per_node:
            notes += (f"the SP group of {cand.sp} spans nodes: its all-to-alls use the inter-node network",)
        return notes
    if cand.ulysses > per_node:
        notes += (f"the Ulysses group of {cand.ulysses} spans nodes: its all-to-alls use the inter-node network",)
    where = (f"spans {cand.sp // per_node} nodes (ranks strided by {cand.ulysses}): its K/V blocks cross the "
             "inter-node network" if ring.spans_nodes(hw, cand) else "stays inside a node")
    block = ring.kv_block_bytes(sh) / 1e6
    # floored: "100%" only when nothing is exposed
    hidden = math.floor(100.0 * (1.0 - ring_exposed / ring_p2p)) if ring_p2p > 0 else 100
    notes += (f"ring of {cand.ring} {where}; {block:,.1f} MB K/V blocks, P2P {_seconds(ring_p2p)} per step of "
              f"which {_seconds(ring_exposed)} exposed ({hidden:.0f}% hidden under blockwise attention)",)
    diag, off = ring.block_speeds(sh)
    if min(diag, off) < 0.98:
        notes += (f"ring attention blocks of {sh.S_pad // (2 * cand.ring):,} tokens run at {100 * off:.0f}% "
                  f"(diagonal {100 * diag:.0f}%) of the whole-sequence kernel's speed",)
    return notes


def _seconds(t: float) -> str:
    if not math.isfinite(t):
        return "inf s"
    if t >= 100:
        return f"{t:,.0f} s"
    return f"{t:.3g} s" if t >= 1 else f"{1e3 * t:.3g} ms"


def attention_share(model: ModelSpec, workload: Workload, cand: Candidate,
                    profile: ModelProfile | None = None) -> dict:
    """What packed documents and sliding windows leave of the attention: ``fraction`` of the causal S^2
    triangle's FLOPs (averaged over the layers; 1 unpacked and unwindowed), the model FLOPs of attention per
    step with and without (``flops``, ``triangle_flops``, forward + backward over all GPUs), and what
    describes the workload (documents, their mean length, the window and the layers it covers)."""
    sh = Shapes(model, workload, cand, profile)
    work, _steps = ring.attention_steps(sh)
    triangle = 3.0 * 2.0 * sh.S * sh.S * sh.attn_width * sh.La * sh.b * cand.grad_accum * cand.dp  # softmax layers
    from autosp.cost_models.documents import doc_stats

    docs, mean = doc_stats(workload.doc_lens) if workload.doc_lens else (0, 0.0)
    window = sh.window if 0 < sh.window < sh.S_pad else 0
    return {"fraction": work, "flops": work * triangle, "triangle_flops": triangle, "documents": docs,
            "mean_doc_len": mean, "sliding_window": window, "windowed_layers": sh.windowed if window else 0,
            "layers": sh.L}


def memory_only(model: ModelSpec, hw: HardwareSpec, workload: Workload, cand: Candidate,
                profile: ModelProfile | None = None) -> MemoryBreakdown:
    """Just the memory breakdown (cheaper than a full estimate; for feasibility and max-context search)."""
    _check(hw, cand)
    sh = Shapes(model, workload, cand, profile)
    return _memory_breakdown(model, hw, workload.dtype, cand, sh)[0]


def fits(model: ModelSpec, hw: HardwareSpec, workload: Workload, cand: Candidate,
         profile: ModelProfile | None = None) -> bool:
    return memory_only(model, hw, workload, cand, profile).total <= capacity_bytes(hw)


def max_seq_len(model: ModelSpec, hw: HardwareSpec, cand: Candidate, dtype: str = "bf16",
                multiple_of: int = 1, upper: int = 1 << 31, profile: ModelProfile | None = None,
                compile_backend: str = "inductor") -> int:
    """The longest sequence (a multiple of ``multiple_of``) whose memory fits, by binary search on the
    memory model (monotone in seq_len); 0 if not even ``multiple_of`` tokens fit."""
    step = max(1, multiple_of)

    def ok(units: int) -> bool:
        return fits(model, hw, Workload(seq_len=units * step, dtype=dtype, compile_backend=compile_backend), cand,
                    profile)

    lo, hi = 0, max(1, upper // step)
    if ok(hi):
        return hi * step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo * step


__all__ = ["attention_share", "estimate", "fits", "max_seq_len", "memory_only", "tokens_per_second",
           "tokens_per_second_over_zero_stages"]
