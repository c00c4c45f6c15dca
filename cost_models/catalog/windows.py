"""Which layers of a Hugging Face model use sliding-window attention, read from its config.json alone.

The rules are transformers' own (5.x ``configuration_<type>.py``), in this order:

1. ``layer_types`` (newer configs list every layer): the ``"sliding_attention"`` ones;
2. ``use_sliding_window: false`` (Qwen2/Qwen3 ship the window fields switched off): none;
   ``use_sliding_window: true``: the layers from ``max_window_layers`` (default 28) on;
3. Gemma-2: every other layer from layer 0 (``(i + 1) % 2``); Gemma-3 and Cohere-2 style
   ``sliding_window_pattern`` N: all but every N-th (Gemma-3's default N is 6, Cohere-2's 4);
4. any other config with an integer ``sliding_window`` (Mistral v0.1, Phi-3, Starcoder2): every layer.

``sliding_window`` null or absent: no window (Mistral v0.3, Llama). Pure functions of the config dict.
"""

from __future__ import annotations

__all__ = ["PATTERN_DEFAULTS", "sliding_layout"]

PATTERN_DEFAULTS = {"gemma3": 6, "gemma3_text": 6, "cohere2": 4}
"""Families whose layer pattern comes from ``sliding_window_pattern`` when the config omits it."""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def sliding_layout(config: dict, n_layers: int) -> tuple[int, tuple[int, ...]]:
    """(window, windowed layer indices) of a config dict; (0, ()) when every layer is global.

    Raises ValueError (with the key) for a malformed window description."""
    window = config.get("sliding_window")
    if window is None:
        return 0, ()
    if not _is_int(window) or window < 1:
        raise ValueError(f"sliding_window must be a positive integer or null, got {window!r}")
    model_type = str(config.get("model_type", "")).lower()
    types = config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers:
            raise ValueError(f"layer_types must list all {n_layers} layers, got {types!r:.80}")
        layers = tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")
    elif "use_sliding_window" in config or model_type in ("qwen2", "qwen3"):
        if not config.get("use_sliding_window", False):
            return 0, ()
        first = config.get("max_window_layers", 28)
        if not _is_int(first) or first < 0:
            raise ValueError(f"max_window_layers must be a non-negative integer, got {first!r}")
        layers = tuple(range(min(first, n_layers), n_layers))
    elif model_type == "gemma2":
        layers = tuple(i for i in range(n_layers) if (i + 1) % 2)
    elif "sliding_window_pattern" in config or model_type in PATTERN_DEFAULTS:
        pattern = config.get("sliding_window_pattern", PATTERN_DEFAULTS.get(model_type))
        if not _is_int(pattern) or pattern < 1:
            raise ValueError(f"sliding_window_pattern must be a positive integer, got {pattern!r}")
        layers = tuple(i for i in range(n_layers) if (i + 1) % pattern)
    else:
        layers = tuple(range(n_layers))
    return (window, layers) if layers else (0, ())
