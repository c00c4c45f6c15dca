"""Which layers of a hybrid model are linear attention, and their widths, read from its config.json alone.

The rules are transformers' own (5.x ``configuration_qwen3_next.py``, ``configuration_qwen3_5.py``,
``configuration_qwen3_5_moe.py``), for the families autosp trains (:data:`HYBRID_FAMILIES`):

- ``layer_types`` lists every layer: the ``"linear_attention"`` ones are Gated DeltaNet layers, the
  ``"full_attention"`` ones softmax attention;
- without it, every ``full_attention_interval``-th layer (default 4) is full attention: layer i is linear when
  (i + 1) % interval != 0;
- ``linear_num_key_heads``, ``linear_num_value_heads``, ``linear_key_head_dim``, ``linear_value_head_dim`` and
  ``linear_conv_kernel_dim`` default to 16, 32, 128, 128 and 4 (Qwen3-Next-80B-A3B's values);
- their softmax-attention layers always gate their output (q_proj is hidden x 2 q_dim; Qwen3.5's config says
  ``attn_output_gate: true``).

Qwen3.5's released configs nest these keys in ``text_config`` (a vision-language wrapper whose language model
``AutoModelForCausalLM`` builds alone); :func:`autosp.cost_models.catalog.models.model_from_hf_config` reads
that nested object. Pure functions of the config dict; errors are ValueErrors naming the key.
"""

from __future__ import annotations

__all__ = ["HYBRID_FAMILIES", "LINEAR_DEFAULTS", "linear_fields"]

HYBRID_FAMILIES = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_moe"})
"""model_type values of the Gated DeltaNet hybrids autosp plans and trains (compiler/linear_attention.py)."""

LINEAR_DEFAULTS = {"linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                   "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}
"""transformers' defaults of the linear-attention widths (the same in the three configuration classes)."""

INTERVAL_DEFAULT = 4
"""transformers' default ``full_attention_interval``."""


def _positive(config: dict, key: str, default: int) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return value


def linear_fields(config: dict, n_layers: int) -> dict:
    """The ModelSpec fields of a hybrid config's linear-attention layers (``linear_layers`` and the five widths,
    ``attn_output_gate``); {} for a config of another family."""
    model_type = str(config.get("model_type", "")).lower()
    if model_type not in HYBRID_FAMILIES:
        return {}
    types = config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers:
            raise ValueError(f"layer_types must list all {n_layers} layers, got {types!r:.80}")
        unknown = sorted({str(t) for t in types} - {"linear_attention", "full_attention"})
        if unknown:
            raise ValueError(f"layer_types holds {unknown[0]!r}; a {model_type} layer is 'linear_attention' or "
                             "'full_attention'")
        layers = tuple(i for i, kind in enumerate(types) if kind == "linear_attention")
    else:
        interval = _positive(config, "full_attention_interval", INTERVAL_DEFAULT)
        layers = tuple(i for i in range(n_layers) if (i + 1) % interval)
    fields = {key: _positive(config, key, default) for key, default in LINEAR_DEFAULTS.items()}
    if fields["linear_num_value_heads"] % fields["linear_num_key_heads"]:
        raise ValueError(f"linear_num_value_heads {fields['linear_num_value_heads']} is not a multiple of "
                         f"linear_num_key_heads {fields['linear_num_key_heads']}")
    if not layers:  # every layer softmax attention: no linear widths to carry
        return {"attn_output_gate": True}
    return {"linear_layers": layers, "attn_output_gate": True, **fields}
