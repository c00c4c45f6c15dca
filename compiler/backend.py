"""The torch.compile backend: run the SP passes on the Dynamo graph, then AOTAutograd.

The passes work on the graph Dynamo captured (torch-level ops, before AOTAutograd), traced at the
*local* sequence length because the runtime calls the model on the local shard: every shape in it is
already right and no symbolic-shape surgery is needed. After the passes, AOTAutograd derives the
backward (the all-to-all's gradient is its inverse, the loss's gradient is the token-weighted one) and
Inductor (default) or the eager interpreter (``aot_eager``) runs it.
"""

from __future__ import annotations

import os
import sys

from torch import fx

from autosp.compiler import ops  # noqa: F401  (registers torch.ops.autosp_ops.*)
from autosp.compiler.context import SPContext
from autosp.compiler.options import BACKENDS
from autosp.compiler.passes import PIPELINE


def apply_passes(gm: fx.GraphModule, example_inputs, ctx: SPContext, passes=PIPELINE) -> fx.GraphModule:
    for sp_pass in passes:
        sp_pass(gm, example_inputs, ctx)
    gm.graph.lint()
    gm.recompile()
    ctx.stats.graphs += 1
    return gm


def _describe(gm: fx.GraphModule) -> None:
    from autosp.compiler.passes.common import where

    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    first = where(calls[0]) if calls else "-"
    names = sorted({str(getattr(n.target, "__name__", n.target)) for n in calls})
    print(f"[autosp] graph with {len(calls)} ops from {first}: {', '.join(names)[:300]}", file=sys.stderr)


def make_backend(ctx: SPContext, backend: str = "inductor", passes=PIPELINE):
    if backend not in BACKENDS:
        from autosp.errors import UsageError

        raise UsageError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")

    def autosp_backend(gm: fx.GraphModule, example_inputs):
        if os.environ.get("AUTOSP_DEBUG_GRAPHS"):
            _describe(gm)
        apply_passes(gm, example_inputs, ctx, passes)
        # --- partitioner (checkpointing policy, activation offload: passes/checkpointing.py) ----------
        from autosp.compiler.passes.checkpointing import SPPartitioner

        partitioner = SPPartitioner(ctx)
        # ------------------------------------------------------------------------------------------------
        if backend == "inductor":
            from torch._inductor.compile_fx import compile_fx

            from autosp.compiler.passes.attention import inductor_config_patches  # overlap windows

            return compile_fx(gm, example_inputs, config_patches={"custom_partitioner_fn": partitioner,
                                                                  **inductor_config_patches(ctx)})
        from torch._dynamo.backends.common import aot_autograd
        from torch._dynamo.backends.debugging import boxed_nop

        # torch's aot_eager with the autosp partitioner in place of min_cut_rematerialization_partition
        return aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop, partition_fn=partitioner,
                            keep_inference_input_mutations=True)(gm, example_inputs)

    return autosp_backend


__all__ = ["BACKENDS", "apply_passes", "make_backend"]
