"""Predicted (cost model, no measurement): how Llama-3.1-8B's SP group should split into Ulysses x ring on 4, 8 and
16 nodes of 8 H100s, and what the split buys.

    .venv/bin/python studies/ring_layouts.py        # ~1-2 min; prints, and writes studies/results/ring_layouts.txt

For each cluster:

1. ``autosp-plan --model llama-3.1-8b --objective max-ctx --hw h100xN`` as a user runs it (default flags): the
   longest trainable context and the chosen U x R;
2. per SP layout (sp = U x R, every valid ring degree of the largest SP group, plus pure Ulysses at sp = 32
   where the cluster is bigger): its own longest context (the exhaustive max-context search restricted to that
   layout) and, at 1Mi and 4Mi tokens and at the longest contexts of pure Ulysses (U = 32, spanning nodes) and
   of the node-local hybrid (U = 8), its fastest fitting plan (exhaustive over that layout's candidates): step
   time, tokens/s, exposed communication (all-to-all + ring + ZeRO) and the ring's P2P.

Every number is a prediction of the analytic cost model (docs/cost_model.md) with the catalog's H100 figures;
none is measured here. The layouts are compared at the same sequence length, each with its best dial knobs,
so no knob is fixed by hand.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from autosp.contract.specs import Workload
from autosp.planner.api import plan_for
from autosp.planner.request import PlanRequest
from autosp.planner.search.evaluator import CTX_GRANULE, Evaluator, ranked_at
from autosp.planner.search.exhaustive import memory_lean_first
from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.cost_models.catalog.models import resolve_model
from autosp.planner.search.space import build_space
from autosp.units import format_gib, format_seconds, format_tokens

MODEL = "llama-3.1-8b"
CLUSTERS = ("h100x32", "h100x64", "h100x128")
SHORT_LENGTHS = (1 << 20, 4 << 20)
"""Besides the longest context all compared layouts fit, compare them at these lengths (tokens)."""


def layout_space(space, sp: int, ring: int):
    """``space`` restricted to one SP layout (all its dial knobs kept)."""
    return replace(space, sp=(sp,), ring=(ring,))


def layout_max_ctx(space, sp: int, ring: int) -> int:
    """The longest context (multiple of CTX_GRANULE) any micro-batch-1 candidate of this layout fits."""
    structural = replace(layout_space(space.with_workload(Workload(1 << 34)), sp, ring), micro_batch=(1,))
    evaluator = Evaluator(structural)
    best = 0
    for cand in sorted(structural.candidates(), key=memory_lean_first):
        best = max(best, evaluator.max_context(cand, must_beat=best))
    return best


def fastest(space, sp: int, ring: int, seq_len: int):
    """(candidate, estimate) of the fastest fitting candidate of this layout at ``seq_len``, or None."""
    target = layout_space(space.with_workload(Workload(seq_len)), sp, ring)
    evaluator = Evaluator(target)
    for cand in target.candidates():
        evaluator(cand)
    ranked = [(c, e) for c, e in ranked_at(evaluator) if e.fits]
    return ranked[0] if ranked else None


def ring_note(est) -> str:
    note = next((n for n in est.notes if n.startswith("ring of")), "")
    return note.split("; ", 1)[1] if "; " in note else "-"


def main() -> int:
    model = resolve_model(MODEL)
    lines = []

    def out(text=""):
        print(text, flush=True)
        lines.append(text)

    out("Predicted by the cost model (not measured): Llama-3.1-8B, SP layouts on H100 clusters, bf16.")
    for hw_name in CLUSTERS:
        hw = resolve_hardware(hw_name)
        plan = plan_for(PlanRequest(model=MODEL, hw=hw_name, objective="max-ctx"))
        c, e = plan.candidate, plan.estimate
        out()
        out(f"== {hw_name}: autosp-plan --model {MODEL} --objective max-ctx --hw {hw_name}")
        out(f"   longest context {format_tokens(plan.workload.seq_len)} ({plan.workload.seq_len:,}) with "
            f"{c.short()}; step {format_seconds(e.time.step)}, memory {format_gib(e.memory.total)}")
        space = build_space(model, hw, Workload(CTX_GRANULE))
        world = hw.world_size
        layouts = [(world, r) for r in space.rings_for(world)]
        if world > model.n_heads:
            layouts.append((model.n_heads, 1))   # pure Ulysses at its head-count limit, dp = world / 32
        ctx = {}
        out(f"   {'layout':<22}{'longest context':>18}")
        for sp, r in layouts:
            ctx[(sp, r)] = layout_max_ctx(space, sp, r)
            out(f"   {f'sp{sp} = U{sp // r} x R{r}':<22}{format_tokens(ctx[(sp, r)]):>18}")
        # the longest contexts of pure Ulysses (sp = 32 across nodes) and of the node-local hybrid (U = 8):
        # every layout that fits there is compared with them at that length
        references = sorted({ctx[(sp, r)] for sp, r in layouts if sp // r in (model.n_heads, hw.devices_per_node)})
        for seq in (*SHORT_LENGTHS, *references):
            out(f"   at {format_tokens(seq)} tokens ({seq:,}):")
            out(f"   {'layout':<22}{'step':>12}{'tokens/s':>12}{'exposed comm':>14}{'memory':>12}  ring P2P  /  best plan")
            for sp, r in layouts:
                if ctx[(sp, r)] < seq:
                    out(f"   {f'sp{sp} = U{sp // r} x R{r}':<22}{'does not fit':>12}")
                    continue
                cand, est = fastest(space, sp, r, seq)
                out(f"   {f'sp{sp} = U{sp // r} x R{r}':<22}{format_seconds(est.time.step):>12}"
                    f"{est.tokens_per_second:>12,.0f}{format_seconds(est.time.exposed_comm):>14}"
                    f"{format_gib(est.memory.total):>12}  {ring_note(est)}  /  {cand.short()}")
    Path(__file__).with_name("results").joinpath("ring_layouts.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
