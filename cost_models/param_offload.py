"""ZeRO-3 parameter offload (``Candidate.offload_param``; DeepSpeed ``zero_optimization.offload_param: {device:
cpu}``): what it moves off the device, what it keeps on the host and what its copies cost (docs/cost_model.md
section 13).

With ``offload_param`` each rank's bf16 partition of the weights (2 B x its 1/N_d share of the parameters) lives
in pinned host memory instead of on the device. Before a module runs (forward, a full-checkpointing recompute,
backward) its partition is copied host-to-device and all-gathered like any ZeRO-3 parameter, then released; the
device therefore holds only the parameters in flight -- the same "gathered" set ZeRO-3 always holds
(:func:`autosp.cost_models.memory.zero3_gathered_params`: the module in use, one prefetch bucket, the persistent
small parameters, the LM head when the loss is tiled) -- and none of the resident partition. On one GPU that is
the difference between 16 GB of bf16 weights for Llama-3.1-8B and about 1.5 GB.

Copies: each pass over the layers fetches every rank's partition once (Psi / N_d x 2 B over the GPU's host link at
``host_bandwidth`` x ``comm_efficiency``). DeepSpeed prefetches the next modules while the current one computes,
so a pass's copies hide behind that pass's compute up to the same overlap fraction as ZeRO's own collectives;
the first module's copy (the embedding, or a layer) has nothing to hide behind. Passes per micro-batch: forward
and backward, plus the recompute forward under ``full`` checkpointing (it runs the module's forward again, with its
parameters gathered again). The optimizer step writes the updated weights into the host partition directly
(CPU Adam with offload_optimizer), so no copy of the weights back to the device follows the step.

Pure functions over plain floats, like the rest of the cost model.
"""

from __future__ import annotations

from autosp.cost_models.shapes import Shapes
from autosp.contract.specs import Candidate, HardwareSpec

def enabled(cand: Candidate) -> bool:
    """Parameter offload applies only at ZeRO stage 3 (Candidate rejects it elsewhere)."""
    return bool(cand.offload_param) and cand.zero_stage == 3


def host_bytes(sh: Shapes, cand: Candidate) -> float:
    """Host bytes one GPU's weight partition takes: its 1/N_d share of the parameters in the training dtype
    (DeepSpeed keeps the offloaded partition in the dtype the model trains in: 2 B in bf16, 4 B in fp32)."""
    if not enabled(cand):
        return 0.0
    return sh.e * sh.n_params / (cand.sp * cand.dp)


def passes(cand: Candidate) -> int:
    """Passes over the layers per micro-batch that fetch the weights: forward, backward, and the recompute
    forward of ``full`` checkpointing."""
    return 3 if cand.checkpointing == "full" else 2


def fetch_bytes_per_pass(sh: Shapes, cand: Candidate) -> float:
    """Bytes one GPU copies host-to-device in one pass: its whole partition."""
    return host_bytes(sh, cand)


def first_module_bytes(sh: Shapes, cand: Candidate) -> float:
    """Bytes of the first module's partition a pass must wait for (the larger of a layer and the embedding)."""
    return sh.e * max(sh.layer_params, sh.lm_head_params) / (cand.sp * cand.dp)


def fetch_times(hw: HardwareSpec, cand: Candidate, sh: Shapes, pass_compute: tuple[float, ...],
                overlap_fraction: float) -> tuple[float, float]:
    """(copy seconds, exposed seconds) of one micro-batch: each pass's copies against that pass's compute
    (``pass_compute``: one time per pass, in order), hidden up to ``overlap_fraction`` of it, plus the first
    module's copy of each pass."""
    if not enabled(cand):
        return 0.0, 0.0
    link = hw.host_bandwidth * hw.comm_efficiency
    if link <= 0:
        return float("inf"), float("inf")
    per_pass = fetch_bytes_per_pass(sh, cand) / link
    first = first_module_bytes(sh, cand) / link
    total = exposed = 0.0
    for compute in pass_compute:
        total += per_pass
        exposed += first + max(0.0, per_pass - first - overlap_fraction * compute)
    return total, exposed


__all__ = ["enabled", "fetch_bytes_per_pass", "fetch_times", "first_module_bytes",
           "host_bytes", "passes"]
