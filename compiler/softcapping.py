"""Gemma 2's attention logit soft-capping as ONE graph node the attention pass recognises.

Hugging Face runs Gemma 2 with eager attention (its SDPA path refuses ``softcap``): a matmul of q and k, the cap
``cap * tanh(s / cap)``, the mask, a softmax and a matmul with v -- an S x S score tensor the passes could not
shard. :func:`use_capped_attention` registers a transformers attention implementation, ``autosp_capped``, and
switches the model to it: the same arguments as eager attention (``scaling`` = Gemma's query pre-attention
scale, ``softcap``, the mask transformers builds for SDPA), answered by one call of

``autosp_ops::capped_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, softcap)``

SDPA's signature plus ``softcap``, so every pass that handles SDPA (:data:`autosp.compiler.passes.common.SDPA`)
handles it: the mask pass proves its mask causal (or a layer's sliding window), the attention pass wraps it in
the Ulysses all-to-alls and then puts span or ring attention with the cap in its place
(:mod:`autosp.compiler.attention.capped`: the capped kernel, exact under log-sum-exp merging). The op's own
implementation is the eager computation (CompositeImplicitAutograd: a graph that keeps it unrewritten decomposes
it into the eager ops), used by nothing the passes leave alone.
"""

from __future__ import annotations

import torch

IMPLEMENTATION = "autosp_capped"

_LIB = torch.library.Library("autosp_ops", "FRAGMENT")
_LIB.define("capped_sdpa(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0.0, "
            "bool is_causal=False, float? scale=None, bool enable_gqa=False, float softcap=0.0) -> Tensor")


def eager_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
                    softcap=0.0, sinks=None):
    """Eager attention with SDPA's arguments, as transformers' eager functions compute it: Gemma 2's soft-capped
    scores (``softcap``), gpt-oss's per-head sink logits joining each row's softmax as one more column, dropped
    after it (``sinks``, compiler/sinks.py)."""
    if enable_gqa and key.shape[1] != query.shape[1]:
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if is_causal:
        n, m = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(n, m, dtype=torch.bool, device=scores.device).triu(1), float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    if sinks is not None:
        column = sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, column], dim=-1)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if sinks is not None:
        weights = weights[..., :-1]
    if dropout_p:
        weights = torch.nn.functional.dropout(weights, p=dropout_p)
    return torch.matmul(weights, value)


def _capped_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
                 softcap=0.0):
    """The eager computation (transformers' Gemma 2 ``eager_attention_forward``) with SDPA's arguments."""
    return eager_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, softcap)


_LIB.impl("capped_sdpa", _capped_sdpa, "CompositeImplicitAutograd")
CAPPED_SDPA = torch.ops.autosp_ops.capped_sdpa.default
CAPPED_ARG = 8  # position of ``softcap`` in the op's arguments


def softcap_of(node) -> float:
    """The cap of a ``capped_sdpa`` graph node (0.0 for any other attention node)."""
    if getattr(node, "target", None) is not CAPPED_SDPA:
        return 0.0
    return float(node.kwargs.get("softcap", node.args[CAPPED_ARG] if len(node.args) > CAPPED_ARG else 0.0))


def capped_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None,
                             **kwargs):
    """transformers attention implementation ``autosp_capped``: eager attention's arguments and result, as one
    ``capped_sdpa`` call shaped like transformers' own SDPA call (k/v repeated to the query heads, which the
    attention pass traces back; causal when no mask was built)."""
    key, value, attention_mask, is_causal = sdpa_call_inputs(module, query, key, value, attention_mask)
    out = CAPPED_SDPA(query, key, value, attention_mask, float(dropout), bool(is_causal), scaling, False,
                      float(softcap or 0.0))
    return out.transpose(1, 2).contiguous(), None


def sdpa_call_inputs(module, query, key, value, attention_mask):
    """(key, value, mask, is_causal) as transformers' own SDPA call passes them: k/v repeated to the query heads
    (the attention pass traces the repeat back), causal when no mask was built, a boolean mask cut to the keys."""
    from transformers.integrations.sdpa_attention import repeat_kv

    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    is_causal = attention_mask is None and query.shape[2] > 1 and getattr(module, "is_causal", True)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    return key, value, attention_mask, is_causal


def use_capped_attention(model) -> bool:
    """Switch a model with ``attn_logit_softcapping`` to ``autosp_capped`` attention (True), else leave it (False).
    The masks are transformers' SDPA ones (boolean, or none when causal alone)."""
    config = getattr(model, "config", None)
    if not getattr(config, "attn_logit_softcapping", None):
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, capped_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    config._attn_implementation = IMPLEMENTATION
    return True


__all__ = ["CAPPED_SDPA", "IMPLEMENTATION", "capped_attention_forward", "eager_attention", "sdpa_call_inputs",
           "softcap_of", "use_capped_attention"]
