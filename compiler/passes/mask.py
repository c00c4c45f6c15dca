"""Mask pass: replace proven-causal attention masks by SDPA's causal kernel path.

Under torch.compile, Hugging Face models (transformers 5.x) materialise a [B, 1, s, s] boolean mask from
the positions and hand it to SDPA with ``is_causal=False``. Traced at the local length s, that mask is
wrong for the full-length attention after the all-to-all, and at the full length it must never exist
(an S x S mask costs O(S^2) memory on every rank). Under causal attention it carries no information:
real tokens never see the pads the runtime appends, and a right-padded user mask was already verified
and dropped by the runtime.

So for every SDPA call with a mask, this pass proves the mask causal and rewrites the call to
``attn_mask=None, is_causal=True``; dead-code elimination then deletes the mask construction.

The proof is numerical, on the real example inputs Dynamo compiled with: the subgraph the mask depends
on (aranges, the position ids; when a graph break delivers the mask as a graph input, the input
itself) is evaluated and must equal ``tril(ones(s, s))`` for every batch row and head (boolean masks:
True where allowed; additive float masks: 0 where allowed and a value that underflows exp() elsewhere).
The runtime guarantees the inputs that could change it between calls cannot: it passes no
``attention_mask`` to the model, or an all-ones one (zigzag shards, span mode), so the mask depends on
no data of the batch.
A model with sliding windows (``ctx.layer_windows``) builds, for its windowed layers, a band over the
local rows: accepted as well (the attention pass applies each layer's window to the global sequence).
Packed documents never reach the model as a mask: in span mode the runtime passes an all-ones
``attention_mask``, which makes Hugging Face build the plain causal mask, and publishes the documents
to the attention ops instead. A mask that depends on parameters or activations, or that is neither of
these (document masks, bidirectional prefixes) is an error.
"""

from __future__ import annotations

import torch
from torch import fx

from autosp.compiler.context import SPContext
from autosp.compiler.passes.common import SDPA, SDPA_ARGS, SDPA_DEFAULTS, evaluate, fail, is_call, normalized, set_named_args


def _allowed(mask: torch.Tensor) -> torch.Tensor | None:
    """Boolean 'may attend' matrix of an SDPA mask, or None if it is not a pure allow/deny mask."""
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        return None
    allowed = mask == 0
    denied = mask[~allowed]
    # exp(x - max) must be exactly 0 for denied entries: -inf, or at most half the dtype's minimum.
    if denied.numel() and not bool(((denied == float("-inf")) | (denied <= torch.finfo(mask.dtype).min / 2)).all()):
        return None
    return allowed


def is_causal_mask(mask: torch.Tensor, length: int, window: int | None = None) -> bool:
    """Is ``mask`` the causal mask over ``length`` rows (with ``window``: Hugging Face's sliding-window mask,
    key j allowed for query i iff i - window < j <= i)?"""
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2 or tuple(mask.shape[-2:]) != (length, length):
        return False
    allowed = _allowed(mask)
    if allowed is None:
        return False
    expected = torch.ones(length, length, dtype=torch.bool, device=mask.device).tril()
    if window is not None:
        expected = expected.triu(1 - window)
    return bool((allowed == expected).all())


def mask_pass(gm: fx.GraphModule, example_inputs, ctx: SPContext) -> None:
    changed = False
    for node in list(gm.graph.nodes):
        if not is_call(node, SDPA):
            continue
        args = normalized(node, SDPA_ARGS, SDPA_DEFAULTS)
        mask = args["attn_mask"]
        if mask is None:
            if not args["is_causal"]:
                fail("attention without a causal mask is not supported with sequence parallelism "
                     "(autosp trains causal LMs: use is_causal=True or a causal mask)", node)
            continue
        if args["is_causal"]:
            fail("SDPA with both attn_mask and is_causal=True is not supported", node)
        if not isinstance(mask, fx.Node):
            fail("SDPA with a constant attention mask is not supported with sequence parallelism", node)
        value = evaluate(gm, mask, example_inputs)
        # a model with sliding windows builds its window mask over the local rows; the span-restricted
        # attention (attention pass) applies each layer's window over the global sequence instead
        if not any(is_causal_mask(value, ctx.local_len, w) for w in (None, *sorted(ctx.windows))):
            fail(f"unsupported attention mask: only causal masks work with sequence parallelism (this one "
                 f"is not lower-triangular over the {ctx.local_len} local tokens: a sliding window, document "
                 f"mask or arbitrary mask is not supported with SP)", node)
        if mask.op == "placeholder":
            ctx.stats.mask_inputs_verified += 1
        else:
            ctx.stats.masks_removed += 1
        set_named_args(node, SDPA_ARGS, attn_mask=None, is_causal=True)
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()


__all__ = ["is_causal_mask", "mask_pass"]
