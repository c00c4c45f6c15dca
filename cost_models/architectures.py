"""Which model architectures autosp plans and trains, and which it refuses: the one list both sides read.

``autosp-plan`` (cost_models/catalog/models.py, reading a config.json) and ``autosp.compile`` (reading the model's
``config``) call :func:`check_config` before they build or trace anything, so they accept and refuse the same
models with the same one-line :class:`~autosp.errors.UsageError` naming the architecture.

Supported: decoder-only causal LMs whose every layer is softmax attention (full or sliding-window) followed by an
MLP: dense (Llama, Mistral, Qwen2/3, Gemma 1/2/3 text, OLMo, Phi-3, ...) and mixture-of-experts MLPs (Mixtral,
Qwen2/3-MoE, OLMoE, DeepSeek-V2-style routed + shared experts, gpt-oss's biased experts with its attention sinks,
:data:`ATTENTION_SINK_TYPES`; :data:`MOE_FAMILIES`); and the Gated DeltaNet
hybrids Qwen3-Next and Qwen3.5 (:data:`~autosp.cost_models.catalog.linear.HYBRID_FAMILIES`: the compiler runs their
linear-attention layers under Ulysses, compiler/linear_attention.py; Qwen3.5's vision-language config is planned as
the language model ``AutoModelForCausalLM`` builds from it, without the vision tower). Refused, each by name:

- other hybrids with linear-attention / state-space layers (Mamba hybrids: Jamba, Falcon-H1, Zamba, Bamba, ...;
  MiniMax, LFM2, Kimi-Linear, ...): their recurrent layers are not the Gated DeltaNet layout autosp shards;
- chunked attention (Llama-4's ``attention_chunk_size``: each query sees only its own chunk's keys on most
  layers): a block-diagonal mask autosp does not shard;
- encoder-decoder models (T5, BART, Whisper, ...): cross-attention and two stacks;
- multi-head latent attention (DeepSeek-V2/V3, ``kv_lora_rank``): compressed K/V projections the cost model
  does not describe (their routed + shared experts, first dense layers included, are read: DeepSeek-V2-style MoE
  with ordinary attention plans);
- vision-language models (LLaVA, Qwen2-VL, Gemma 3 4B-27B with its vision tower, ...): image tokens and a
  vision encoder. The refusal says how to plan the language model alone: its ``text_config`` saved as its own
  config.json, or, where the text fields sit at the top level (Qwen2-VL, Qwen2.5-VL), a copy of the config as the
  plain decoder it contains.

Pure functions of a dict (or any object with ``to_dict()``, e.g. a transformers ``PretrainedConfig``): no torch.
"""

from __future__ import annotations

from autosp.cost_models.catalog.linear import HYBRID_FAMILIES
from autosp.errors import UsageError

__all__ = ["ATTENTION_SINK_TYPES", "ENCODER_DECODER_TYPES", "HYBRID_FAMILIES", "HYBRID_LINEAR_TYPES", "MOE_FAMILIES",
           "TEXT_LOADABLE_VLM_TYPES", "TOP_LEVEL_TEXT_VLM", "VISION_LANGUAGE_TYPES", "architecture_refusal",
           "check_config", "config_dict"]

HYBRID_LINEAR_TYPES = frozenset({
    "jamba", "mamba", "mamba2", "falcon_h1", "falcon_mamba", "zamba", "zamba2", "bamba", "granitemoehybrid", "lfm2",
    "lfm2_moe", "minimax", "recurrent_gemma", "rwkv", "nemotron_h", "kimi_linear"})
"""model_type values of models with linear-attention / state-space layers autosp does not run (transformers 5.x
model names); the Gated DeltaNet hybrids it runs are :data:`HYBRID_FAMILIES`."""

LINEAR_LAYER_TYPES = frozenset({"linear_attention", "mamba", "gated_deltanet", "conv", "recurrent"})
"""``layer_types`` entries of a layer that is not softmax attention (Qwen3-Next lists "linear_attention")."""

TEXT_LOADABLE_VLM_TYPES = frozenset({"qwen3_5", "qwen3_5_moe"})
"""Vision-language model_types whose ``text_config`` ``AutoModelForCausalLM`` builds alone (transformers 5's
causal-LM mapping, "VLM compatibility": Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM load the language model's weights
without the vision tower), so autosp plans and trains that language model."""

TOP_LEVEL_TEXT_VLM = {"qwen2_vl": "qwen2", "qwen2_5_vl": "qwen2"}
"""Vision-language model_types whose released config.json keeps the language model's fields at the top level (no
``text_config``), with the decoder's own model_type: Qwen2-VL and Qwen2.5-VL decode with Qwen2 layers (M-RoPE
costs what RoPE does)."""

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

ATTENTION_SINK_TYPES = frozenset({"gpt_oss"})
"""model_type values whose attention has a learned sink logit per head (transformers runs them with eager attention
only; autosp runs them through its own sink attention, compiler/sinks.py)."""


def config_dict(config) -> dict:
    """A plain dict of a config.json dict or a transformers config object."""
    if isinstance(config, dict):
        return config
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return dict(getattr(config, "__dict__", {}))


def _chunked_layers(data: dict) -> tuple[int, int]:
    """(chunk size, layers with chunked attention) of a config: transformers' Llama-4 rule (``layer_types``
    "chunked_attention", else the layers ``no_rope_layers`` marks 1, i.e. those with RoPE, when
    ``attention_chunk_size`` is set; default: all but every ``no_rope_layer_interval``-th); (0, 0) for none."""
    size = data.get("attention_chunk_size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return 0, 0
    types = data.get("layer_types")
    if isinstance(types, list):
        return size, sum(1 for t in types if t == "chunked_attention")
    flags = data.get("no_rope_layers")
    if not isinstance(flags, list) or not flags:
        interval = data.get("no_rope_layer_interval", 4)
        n_layers = data.get("num_hidden_layers", 0)
        if not isinstance(interval, int) or interval < 1 or not isinstance(n_layers, int):
            return size, 0
        flags = [int((i + 1) % interval != 0) for i in range(n_layers)]
    return size, sum(1 for flag in flags if flag)


def _vision_language_refusal(arch: str, model_type: str, data: dict, text: dict) -> str:
    """What a vision-language config's refusal says to do: plan its language model, where that model's fields are."""
    head = f"{arch} is a vision-language model: autosp trains text decoders without a vision tower"
    if text:
        return f"{head}; plan its text_config (save that object as its own config.json)"
    if model_type in TOP_LEVEL_TEXT_VLM and "hidden_size" in data:
        return (f"{head}; its language model's fields are this config's top-level ones: plan a copy of this "
                f"config.json with \"model_type\": \"{TOP_LEVEL_TEXT_VLM[model_type]}\" and without vision_config "
                "(the same decoder)")
    return f"{head}; plan the config.json of its language model"


def architecture_refusal(config) -> str | None:
    """Why autosp does not support the architecture of ``config``, as the end of a sentence naming it ("... is a
    hybrid model with state-space layers (jamba)"), or None when it is supported."""
    data = config_dict(config)
    model_type = str(data.get("model_type", "")).lower()
    arch = ", ".join(str(a) for a in data.get("architectures") or ()) or model_type or "this model"
    layer_types = data.get("layer_types")
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else {}
    text_type = str(text.get("model_type", "")).lower()
    if model_type in TEXT_LOADABLE_VLM_TYPES and text:  # planned and trained as its language model alone
        return architecture_refusal({"architectures": data.get("architectures"), **text})
    linear = [t for t in (layer_types or text.get("layer_types") or ()) if str(t).lower() in LINEAR_LAYER_TYPES]
    supported_hybrid = (model_type in HYBRID_FAMILIES or text_type in HYBRID_FAMILIES) and all(
        str(t).lower() == "linear_attention" for t in linear)
    if model_type in HYBRID_LINEAR_TYPES or text_type in HYBRID_LINEAR_TYPES or (linear and not supported_hybrid):
        kind = f" ({len(linear)} of its layers are {sorted({str(t) for t in linear})[0]})" if linear else ""
        return (f"{arch} is a hybrid model with linear-attention or state-space layers{kind}, which autosp does not "
                "shard: of the hybrids, autosp trains the Gated DeltaNet ones (Qwen3-Next, Qwen3.5)")
    size, chunked = _chunked_layers(data)
    if chunked:
        return (f"{arch} uses chunked attention on {chunked} of its layers (attention_chunk_size {size}: a query sees "
                f"only the keys of its own {size}-token chunk), a block-diagonal mask autosp's sequence parallelism "
                "does not shard")
    if data.get("kv_lora_rank") or text.get("kv_lora_rank"):
        return (f"{arch} uses multi-head latent attention (kv_lora_rank={data.get('kv_lora_rank') or text.get('kv_lora_rank')}, "
                "DeepSeek-V2/V3 style), which autosp does not price or shard yet (its mixture-of-experts MLP alone would "
                "be supported)")
    if model_type in ENCODER_DECODER_TYPES or data.get("is_encoder_decoder") is True:
        return (f"{arch} is an encoder-decoder model: autosp trains decoder-only causal LMs (no cross-attention, "
                "no encoder stack)")
    if model_type in VISION_LANGUAGE_TYPES or isinstance(data.get("vision_config"), dict):
        text_refusal = architecture_refusal(text) if text else None
        if text_refusal:  # its language model is refused too: say that, not "plan its text_config"
            return f"{arch}'s language model: {text_refusal}"
        return _vision_language_refusal(arch, model_type, data, text)
    return None


def check_config(config, where: str = "model config") -> None:
    """Raise a one-line UsageError naming the architecture when autosp does not support it (module docstring);
    ``where`` names the source (a path, a model name)."""
    reason = architecture_refusal(config)
    if reason:
        raise UsageError(f"{where}: {reason}; autosp does not support it")
