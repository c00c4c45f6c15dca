"""Longest trainable context with sequence-chunked layers: the planner's predictions (``--objective max-ctx``, no
other flags) for the cases of issue 13, next to ALST's published maxima (Bekman et al., arXiv 2506.13996).

    .venv/bin/python -m studies.chunk_max_ctx      # ~1-2 min on 2 cores; writes studies/results/chunk_max_ctx.txt

Predictions only (no GPU here): each row is the plan autosp-plan chooses, its predicted step time, and the pinned
host memory it needs per node (ALST's nodes had 1.9 TB; the catalog's DGX H100 has 2 TB, of which the cost model
lets offloads use 80%). For each case the chosen layout is also priced without sequence chunks (checkpointing,
activation offload, MLP and loss tiling re-chosen for the longest context), to show what the chunks add. On one GPU, ALST's recipe also offloads the parameters (ZeRO-3
``offload_param``), which autosp's space does not search yet; a what-if line takes the parameters and their
gradients off the GPU in the cost model to say what it would add.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from pathlib import Path

from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.cost_models.catalog.models import resolve_model
from autosp.cost_models.estimate import estimate, max_seq_len
from autosp.contract.specs import CHECKPOINTING_POLICIES, Workload
from autosp.planner.api import plan_for
from autosp.planner.request import PlanRequest
from autosp.planner.search.space import LOSS_CHUNKS, MLP_CHUNKS
from autosp.units import format_seconds, format_tokens

RESULTS = Path(__file__).resolve().parent / "results" / "chunk_max_ctx.txt"
GIB = 2 ** 30
CASES = [  # (model, hardware, ALST's published maximum, the target)
    ("llama-3.1-8b", "h100", 500_000, 750_000),
    ("llama-3.1-8b", "h100x8", 3_700_000, 5_700_000),
    ("llama-3.1-8b", "h100x32", 15_000_000, 23_000_000),
    ("llama-3.1-70b", "h100x32", 4_000_000, None),
    ("llama-3.1-70b", "h100x64", 10_000_000, None),
]
GRANULE = 1024


def _without_params(model, hw, cand) -> int:
    """Longest context of ``cand`` with its parameters and gradients off the GPU (a what-if for offload_param)."""
    def ok(units: int) -> bool:
        est = estimate(model, hw, Workload(seq_len=units * GRANULE), cand)
        kept = est.memory.total - est.memory.parameters - est.memory.gradients   # inf when host memory runs out
        return kept <= est.capacity_bytes

    lo, hi = 0, 1
    while ok(hi) and hi < 2 ** 24:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo * GRANULE


def _best_unchunked(model, hw, cand):
    """(longest context, candidate) of ``cand``'s layout (sp, ring, ZeRO) without sequence chunks: checkpointing
    (with activation offload), MLP and loss tiling and optimizer offload re-chosen for the longest context."""
    best = (0, cand)
    optims = (False, True) if cand.zero_stage >= 1 else (False,)
    for policy, mlp, loss, optim in itertools.product(CHECKPOINTING_POLICIES, MLP_CHUNKS, LOSS_CHUNKS, optims):
        other = replace(cand, sequence_chunks=1, offload_chunks=False, mlp_chunks=mlp, loss_chunks=loss,
                        checkpointing=policy, offload_activations=policy != "none", offload_optimizer=optim)
        ctx = max_seq_len(model, hw, other, multiple_of=GRANULE)
        if ctx > best[0]:
            best = (ctx, other)
    return best


def rows() -> list[str]:
    lines = []
    for model_name, hw_name, alst, target in CASES:
        model, hw = resolve_model(model_name), resolve_hardware(hw_name)
        started = time.perf_counter()
        plan = plan_for(PlanRequest(model=model_name, hw=hw_name, objective="max-ctx"))
        seconds = time.perf_counter() - started
        ctx, cand, est = plan.workload.seq_len, plan.candidate, plan.estimate
        per_node = est.host_bytes * min(hw.devices_per_node, cand.world_size)
        before, unchunked = _best_unchunked(model, hw, cand)
        goal = f"; target {format_tokens(target)}: {'met' if ctx >= target else 'NOT met'}" if target else ""
        lines += [
            f"{model_name} on {hw.world_size} x H100 ({hw_name}): {format_tokens(ctx)} ({ctx:,}) tokens   "
            f"[planned in {seconds:.1f} s]",
            f"  ALST published {format_tokens(alst)} -> autosp / ALST = {ctx / alst:.2f}{goal}",
            f"  plan: {cand.short()}",
            f"  predicted step {format_seconds(est.time.step)} (recompute {format_seconds(est.time.recompute)}, "
            f"exposed comm {format_seconds(est.time.exposed_comm)}, offload {format_seconds(est.time.offload)}); "
            f"MFU {100 * est.mfu:.1f}%",
            f"  GPU {est.memory.total / GIB:.1f} of {est.capacity_bytes / GIB:.1f} GiB; pinned host "
            f"{est.host_bytes / GIB:,.0f} GiB per GPU = {per_node / GIB:,.0f} GiB per node "
            f"(node {hw.host_memory_bytes / GIB:,.0f} GiB, 80% usable)",
            f"  the best plan of the same layout without sequence chunks ({unchunked.short()}): "
            f"{format_tokens(before)} -> chunks add {ctx / before:.2f}x" if before else
            "  without sequence chunks: does not fit",
        ]
        if hw.world_size == 1:
            what_if = _without_params(model, hw, cand)
            lines.append(f"  what-if offload_param (parameters and gradients off the GPU, not searched yet): "
                         f"{format_tokens(what_if)} ({what_if / alst:.2f} x ALST)")
        lines.append("")
        print("\n".join(lines[-8:]), flush=True)
    return lines


def main() -> int:
    lines = ["Longest context with sequence-chunked layers (autosp-plan --objective max-ctx, predictions)", ""]
    lines += rows()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
