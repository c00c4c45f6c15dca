"""gpt-oss's attention sinks as ONE graph node the attention pass recognises.

transformers runs gpt-oss with eager attention (``GptOssPreTrainedModel._supports_sdpa = False``: SDPA has no
sink): q k^T, the mask, each head's learned sink logit (``module.sinks``, passed as ``s_aux``) appended to every
row, a softmax, the sink's column dropped, a matmul with v -- an S x S score tensor the passes could not shard.
:func:`use_sink_attention` registers a transformers attention implementation, ``autosp_sinks``, and switches the
model to it: eager attention's arguments, answered by one call of

``autosp_ops::sink_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, sinks)``

SDPA's signature plus the heads' sink logits, so every pass that handles SDPA
(:data:`autosp.compiler.passes.common.SDPA`) handles it: the mask pass proves its mask causal or the layer's
sliding window (gpt-oss alternates 128-token windows with global layers), the attention pass wraps it in the
Ulysses all-to-alls, gives it this rank's heads' slice of ``sinks`` and puts span or ring attention with the
sinks in its place (:mod:`autosp.compiler.attention.sinks`: merged once after every piece, exact). The op's own
implementation is the eager computation (CompositeImplicitAutograd), used by nothing the passes leave alone.
"""

from __future__ import annotations

import torch

from autosp.compiler.softcapping import eager_attention, sdpa_call_inputs

IMPLEMENTATION = "autosp_sinks"

_LIB = torch.library.Library("autosp_ops", "FRAGMENT")
_LIB.define("sink_sdpa(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0.0, "
            "bool is_causal=False, float? scale=None, bool enable_gqa=False, Tensor? sinks=None) -> Tensor")


def _sink_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
               sinks=None):
    """transformers' gpt-oss ``eager_attention_forward`` with SDPA's arguments."""
    return eager_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, sinks=sinks)


_LIB.impl("sink_sdpa", _sink_sdpa, "CompositeImplicitAutograd")
SINK_SDPA = torch.ops.autosp_ops.sink_sdpa.default
SINKS_ARG = 8  # position of ``sinks`` in the op's arguments


def sinks_of(node):
    """The ``sinks`` argument (a graph node) of a ``sink_sdpa`` graph node; None for any other attention node."""
    if getattr(node, "target", None) is not SINK_SDPA:
        return None
    return node.kwargs.get("sinks", node.args[SINKS_ARG] if len(node.args) > SINKS_ARG else None)


def sink_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, s_aux=None,
                           **kwargs):
    """transformers attention implementation ``autosp_sinks``: eager attention's arguments and result (the sinks
    come as ``s_aux``, as gpt-oss passes them), as one ``sink_sdpa`` call shaped like transformers' own SDPA
    call."""
    sinks = s_aux if s_aux is not None else getattr(module, "sinks", None)
    key, value, attention_mask, is_causal = sdpa_call_inputs(module, query, key, value, attention_mask)
    out = SINK_SDPA(query, key, value, attention_mask, float(dropout), bool(is_causal), scaling, False, sinks)
    return out.transpose(1, 2).contiguous(), None


def has_sinks(model) -> bool:
    """Does an attention module of ``model`` hold per-head sink logits (a 1-D ``sinks`` parameter)?"""
    return any(isinstance(getattr(m, "sinks", None), torch.nn.Parameter) and m.sinks.dim() == 1
               for m in model.modules())


def use_sink_attention(model) -> bool:
    """Switch a model whose attention has sinks (gpt-oss) to ``autosp_sinks`` attention (True), else leave it
    (False). The masks are transformers' SDPA ones (boolean, or none when causal alone)."""
    if not has_sinks(model) or getattr(model, "config", None) is None:
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, sink_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    model.config._attn_implementation = IMPLEMENTATION
    return True


__all__ = ["IMPLEMENTATION", "SINK_SDPA", "has_sinks", "sink_attention_forward", "sinks_of", "use_sink_attention"]
