"""The FX passes that turn a single-device Dynamo graph into the sequence-parallel graph.

Each pass is ``pass(gm, example_inputs, ctx) -> None``: it rewrites ``gm.graph`` in place, has one
concern, and raises :class:`autosp.errors.UsageError` naming the op and source line when the graph is
outside what it can make exact. :data:`PIPELINE` is the order the backend runs them in; the mask pass
comes first (it evaluates the mask on the untouched graph and deletes it before positions are offset
and attention is rewired).

Later plan knobs (checkpointing, MLP/loss tiling, offload, overlap) each become one more pass here.
"""

from autosp.compiler.passes.attention import attention_pass
from autosp.compiler.passes.check import check_pass
from autosp.compiler.passes.loss import loss_pass
from autosp.compiler.passes.mask import mask_pass
from autosp.compiler.passes.positions import position_pass

PIPELINE = (mask_pass, position_pass, attention_pass, loss_pass, check_pass)

__all__ = ["PIPELINE", "attention_pass", "check_pass", "loss_pass", "mask_pass", "position_pass"]
