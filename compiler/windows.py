"""Sliding-window and mixed local/global attention layers, read from a Hugging Face config.

A sliding window of W tokens lets query i see keys i-W+1 .. i (transformers' ``sliding_window_overlay``:
``kv_idx > q_idx - W``). Where the config says it:

- ``layer_types``: ``"sliding_attention"`` layers use ``sliding_window``, every other type is global
  (Qwen2 and newer models write this list; it wins when present);
- Qwen2 without ``layer_types``: ``use_sliding_window`` switches windows on, for layers ``i >=
  max_window_layers``;
- otherwise (Mistral v0.1): ``sliding_window`` applies to every layer; None means no window.

A window at least as long as the sequence changes nothing (the layer is simply global). Gemma 2's attention
logit soft-capping is not a window: compiler/softcapping.py.
"""

from __future__ import annotations

from autosp.errors import UsageError


def layer_windows(config) -> tuple | None:
    """Per decoder layer: its sliding window in tokens, or None (global). None when no layer has one."""
    if config is None:
        return None
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    window = int(window)
    if window < 1:
        raise UsageError(f"the model config's sliding_window must be a positive number of tokens, got {window}")
    n_layers = getattr(config, "num_hidden_layers", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        windows = tuple(window if t == "sliding_attention" else None for t in layer_types)
    elif getattr(config, "use_sliding_window", None) is not None and n_layers:  # Qwen2 before layer_types
        first = getattr(config, "max_window_layers", 0) or 0
        windows = tuple(window if i >= first else None for i in range(n_layers))
    elif n_layers:
        windows = (window,) * n_layers
    else:
        raise UsageError("the model config has a sliding_window but no num_hidden_layers")
    return windows if any(w is not None for w in windows) else None


__all__ = ["layer_windows"]
