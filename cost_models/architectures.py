"""Which model architectures autosp plans and trains, and which it refuses: the one list both sides read.

``autosp-plan`` (cost_models/catalog/models.py, reading a config.json) and ``autosp.compile`` (reading the model's
``config``) call :func:`check_config` before they build or trace anything, so they accept and refuse the same
models with the same one-line :class:`~autosp.errors.UsageError` naming the architecture.

Supported: decoder-only causal LMs whose every layer is softmax attention (full or sliding-window) followed by an
MLP: dense (Llama, Mistral, Qwen2/3, Gemma 1/2/3 text, OLMo, Phi-3, ...) and mixture-of-experts MLPs (Mixtral,
Qwen2/3-MoE, OLMoE, DeepSeek-V2-style routed + shared experts; :data:`MOE_FAMILIES`). Refused, each by name:

- hybrid linear-attention models (Qwen3-Next and Qwen3.5's Gated DeltaNet, Mamba hybrids, ...): their linear
  layers carry a recurrent state along the sequence, which Ulysses' head sharding does not split;
- encoder-decoder models (T5, BART, Whisper, ...): cross-attention and two stacks;
- multi-head latent attention (DeepSeek-V2/V3, ``kv_lora_rank``): compressed K/V projections the cost model
  does not describe (their routed + shared experts, first dense layers included, are read: DeepSeek-V2-style MoE
  with ordinary attention plans);
- vision-language models (LLaVA, Qwen2-VL, Gemma 3 4B-27B with its vision tower, ...): image tokens and a
  vision encoder. Their language model alone can be planned from its ``text_config`` (or a preset such as
  ``gemma-3-12b``).

Pure functions of a dict (or any object with ``to_dict()``, e.g. a transformers ``PretrainedConfig``): no torch.
"""

from __future__ import annotations

from autosp.errors import UsageError

__all__ = ["ENCODER_DECODER_TYPES", "HYBRID_LINEAR_TYPES", "MOE_FAMILIES", "VISION_LANGUAGE_TYPES",
           "architecture_refusal", "check_config", "config_dict"]

HYBRID_LINEAR_TYPES = frozenset({
    "qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text", "jamba", "mamba", "mamba2",
    "falcon_h1", "falcon_mamba", "zamba", "zamba2", "bamba", "granitemoehybrid", "lfm2", "lfm2_moe", "minimax",
    "recurrent_gemma", "rwkv", "nemotron_h", "kimi_linear"})
"""model_type values of models with linear-attention / state-space layers (transformers 5.x model names)."""

LINEAR_LAYER_TYPES = frozenset({"linear_attention", "mamba", "gated_deltanet", "conv", "recurrent"})
"""``layer_types`` entries of a layer that is not softmax attention (Qwen3-Next lists "linear_attention")."""

ENCODER_DECODER_TYPES = frozenset({
    "t5", "mt5", "umt5", "longt5", "bart", "mbart", "pegasus", "pegasus_x", "marian", "blenderbot",
    "blenderbot-small", "led", "prophetnet", "switch_transformers", "whisper", "fsmt", "plbart", "bigbird_pegasus",
    "m2m_100", "nllb_moe", "seamless_m4t", "t5gemma", "encoder-decoder"})

VISION_LANGUAGE_TYPES = frozenset({
    "llava", "llava_next", "llava_onevision", "llava_next_video", "qwen2_vl", "qwen2_5_vl", "qwen3_vl",
    "qwen3_vl_moe", "idefics", "idefics2", "idefics3", "mllama", "paligemma", "gemma3", "gemma3n", "smolvlm",
    "internvl", "pixtral", "mistral3", "llama4", "aya_vision", "chameleon", "blip-2", "instructblip", "kosmos-2",
    "fuyu", "phi4_multimodal", "glm4v", "molmo", "janus", "emu3", "got_ocr2", "florence2"})
"""model_type values of vision-language wrappers; a config with a ``vision_config`` is one too. ``gemma3`` is the
multimodal Gemma 3 (4B-27B); its text model is ``gemma3_text``."""

MOE_FAMILIES = frozenset({"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "phimoe",
                          "granitemoe", "dbrx", "jetmoe", "minimax_m1", "gpt_oss", "hunyuan_v1_moe", "ernie4_5_moe",
                          "glm4_moe", "dots1", "bailing_moe"})
"""model_type values of mixture-of-experts decoders (experts counted by the catalog's config reader)."""


def config_dict(config) -> dict:
    """A plain dict of a config.json dict or a transformers config object."""
    if isinstance(config, dict):
        return config
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return dict(getattr(config, "__dict__", {}))


def architecture_refusal(config) -> str | None:
    """Why autosp does not support the architecture of ``config``, as the end of a sentence naming it ("... is a
    hybrid linear-attention model (qwen3_next)"), or None when it is supported."""
    data = config_dict(config)
    model_type = str(data.get("model_type", "")).lower()
    arch = ", ".join(str(a) for a in data.get("architectures") or ()) or model_type or "this model"
    layer_types = data.get("layer_types")
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else {}
    linear = [t for t in (layer_types or text.get("layer_types") or ()) if str(t).lower() in LINEAR_LAYER_TYPES]
    if model_type in HYBRID_LINEAR_TYPES or str(text.get("model_type", "")).lower() in HYBRID_LINEAR_TYPES or linear:
        kind = f" ({len(linear)} linear-attention layers)" if linear else ""
        return (f"{arch} is a hybrid linear-attention model{kind} (Qwen3-Next / Qwen3.5 Gated DeltaNet style): its "
                "linear layers carry a recurrent state along the sequence that sequence parallelism cannot split")
    if data.get("kv_lora_rank") or text.get("kv_lora_rank"):
        return (f"{arch} uses multi-head latent attention (kv_lora_rank={data.get('kv_lora_rank') or text.get('kv_lora_rank')}, "
                "DeepSeek-V2/V3 style), which autosp does not price or shard yet (its mixture-of-experts MLP alone would "
                "be supported)")
    if model_type in ENCODER_DECODER_TYPES or data.get("is_encoder_decoder") is True:
        return (f"{arch} is an encoder-decoder model: autosp trains decoder-only causal LMs (no cross-attention, "
                "no encoder stack)")
    if model_type in VISION_LANGUAGE_TYPES or isinstance(data.get("vision_config"), dict):
        return (f"{arch} is a vision-language model: autosp trains its text decoder only; plan the language model "
                "from the config's text_config (saved as its own config.json) or a preset such as gemma-3-12b")
    return None


def check_config(config, where: str = "model config") -> None:
    """Raise a one-line UsageError naming the architecture when autosp does not support it (module docstring);
    ``where`` names the source (a path, a model name)."""
    reason = architecture_refusal(config)
    if reason:
        raise UsageError(f"{where}: {reason}; autosp does not support it")
