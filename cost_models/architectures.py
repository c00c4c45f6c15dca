"""The architectures autosp refuses, by Hugging Face ``model_type``: one list for the planner and the compiler.

autosp trains decoder-only causal language models whose token mixing is softmax attention (what the SP
all-to-alls, ring attention and the cost model are built on). Refused, each with the reason it gives:

- hybrid linear-attention / state-space models: their recurrent layers (Gated DeltaNet, Mamba, RWKV,
  lightning attention) carry a state along the sequence, which sequence sharding would cut;
- encoder-decoder models: a bidirectional encoder and cross-attention, neither causal;
- vision-language models: an image tower and image tokens spliced into the text, which autosp neither
  shards nor prices.

The keys are the ``model_type`` strings of transformers 5.x (``transformers/models/<name>/configuration_<name>.py``,
the ``model_type`` class attribute of each config); a text-only variant of a multimodal family has a type of its
own (``gemma3_text``, ``llama4_text``) and is not refused unless it is hybrid (``qwen3_5_text``).
"""

from __future__ import annotations

HYBRID = "a hybrid linear-attention / state-space model (its recurrent layers carry state along the sequence, " \
         "which sequence parallelism would cut)"
ENCODER_DECODER = "an encoder-decoder model (autosp trains decoder-only causal language models)"
VISION_LANGUAGE = "a vision-language model (autosp trains text-only causal language models; load the text model " \
                  "alone)"

REFUSED: dict[str, str] = {
    **{t: HYBRID for t in ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "falcon_h1",
                           "jamba", "mamba", "mamba2", "zamba", "zamba2", "bamba", "nemotron_h", "lfm2", "minimax",
                           "recurrent_gemma", "rwkv", "granitemoehybrid", "olmo_hybrid", "kimi_linear")},
    **{t: ENCODER_DECODER for t in ("t5", "mt5", "umt5", "bart", "mbart", "pegasus", "marian", "led", "whisper",
                                    "longt5", "switch_transformers", "t5gemma", "prophetnet", "blenderbot",
                                    "bigbird_pegasus", "m2m_100", "nllb_moe", "plbart")},
    **{t: VISION_LANGUAGE for t in ("llava", "llava_next", "llava_onevision", "qwen2_vl", "qwen2_5_vl", "qwen3_vl",
                                    "qwen3_vl_moe", "gemma3", "gemma3n", "idefics2", "idefics3", "paligemma",
                                    "mllama", "mistral3", "aya_vision", "glm4v", "internvl", "smolvlm", "llama4")},
}


def config_dict(config) -> dict:
    """A plain dict of a config.json dict or a transformers config object (None: empty)."""
    if isinstance(config, dict):
        return config
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return dict(getattr(config, "__dict__", {}))


def architecture_refusal(config) -> str | None:
    """Why autosp refuses the architecture of ``config`` (a config.json dict or a transformers config), as the end
    of a sentence, or None when it is accepted. A config that says ``is_encoder_decoder`` or holds a
    ``vision_config`` is refused whatever its type."""
    data = config_dict(config)
    model_type = str(data.get("model_type", "") or "")
    reason = REFUSED.get(model_type)
    if reason is None and data.get("is_encoder_decoder") is True:
        reason = ENCODER_DECODER
    if reason is None and isinstance(data.get("vision_config"), dict):
        reason = VISION_LANGUAGE
    return None if reason is None else f"{model_type or 'this model'} is {reason}"


def check_config(config, where: str = "model config") -> None:
    """One-line UsageError naming the architecture when autosp refuses it; ``where`` names the source."""
    from autosp.errors import UsageError

    reason = architecture_refusal(config)
    if reason:
        raise UsageError(f"{where}: {reason}; autosp does not support it")


__all__ = ["REFUSED", "architecture_refusal", "check_config", "config_dict"]
