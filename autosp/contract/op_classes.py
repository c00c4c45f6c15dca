"""Op classes shared by the cost model and the compiler: which aten ops are matmuls or attention, and which
classes each checkpointing policy keeps.

The graph-derived cost model (:mod:`autosp.profiling.graph`) classifies the ops of a traced
training step with these tables to predict what each policy saves and recomputes; the compiler
(:mod:`autosp.compiler.passes.checkpointing`) classifies the ops of the joint graph with the same tables
to tag what the partitioner must save or recompute. Defining them once keeps the prediction and the
compiled graph in agreement (``tests`` tie both readers to this module). Plain Python, no torch: names
are aten op names (``torch.ops.aten.mm.default._opname == "mm"``) or, for torch-level calls Dynamo
records, a function's ``__name__``.
"""

from __future__ import annotations

MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "dot", "mv", "einsum", "linear",
                        "_int_mm", "_scaled_mm", "convolution"})
"""Ops whose work is a matrix product (weights times activations, or two activations)."""

ATTENTION_WORDS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention",
                   "flex_attention", "ring_attention", "span_attention", "gated_delta")
"""An op whose name contains one of these is an attention kernel (forward, or backward when its name also
contains ``backward``): SDPA's dispatch targets on every device, FlexAttention, and the compiler's
``autosp_ops::ring_attention`` and ``autosp_ops::span_attention`` (packed documents, sliding windows), and
``autosp_ops::gated_delta_core`` (a Gated DeltaNet layer's conv + recurrence, the linear attention of
Qwen3-Next / Qwen3.5). Ring attention moves key/value blocks between ranks but is classed as
attention, not as a collective: its output and log-sum-exp are saved like SDPA's, and it is recomputed only
under ``full``, where every ring rank recomputes it in the same backward order."""

KEEP_CLASSES = {"none": None,
                "selective": frozenset({"matmul", "attention", "collective"}),
                "sequence": frozenset({"attention", "collective"}),
                "full": frozenset()}
"""Op classes whose outputs a checkpointing policy saves (never recomputes); every other forward value of
a layer is recomputed in the backward, except the layer's input. ``none`` (None) saves whatever the
backward needs: no recompute at all. One entry per
:data:`autosp.contract.specs.CHECKPOINTING_POLICIES`, in its order."""


def is_matmul(name: str) -> bool:
    return name in MATMUL_OPS


def attention_kind(name: str) -> str | None:
    """``attention``, ``attention_backward`` or None (not an attention kernel)."""
    if any(word in name for word in ATTENTION_WORDS):
        return "attention_backward" if "backward" in name else "attention"
    return None


__all__ = ["ATTENTION_WORDS", "KEEP_CLASSES", "MATMUL_OPS", "attention_kind", "is_matmul"]
