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
from autosp.compiler.passes.chunking import chunking_pass
from autosp.compiler.passes.loss import loss_pass
from autosp.compiler.passes.mask import mask_pass
from autosp.compiler.passes.positions import position_pass
from autosp.compiler.passes.tiling_loss import loss_tiling_pass
from autosp.compiler.passes.tiling_mlp import mlp_tiling_pass

# The tiling passes run after the loss pass (loss tiling fuses the sum the loss pass made) and do
# nothing unless their plan knob (ctx.candidate.mlp_chunks, ctx.candidate.loss_chunks) is above 1; the attention pass
# applies ctx.candidate.overlap. The chunking pass (ctx.candidate.sequence_chunks > 1) runs last: it cuts out each decoder layer the
# others made, all-to-alls, ring attention and tiled MLP included.
PIPELINE = (mask_pass, position_pass, attention_pass, loss_pass, mlp_tiling_pass, loss_tiling_pass, check_pass,
            chunking_pass)

__all__ = ["PIPELINE", "attention_pass", "check_pass", "chunking_pass", "loss_pass", "loss_tiling_pass", "mask_pass",
           "mlp_tiling_pass", "position_pass"]
