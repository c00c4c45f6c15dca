"""Model catalog: turn ``--model ARG`` into a :class:`~autosp.contract.specs.ModelSpec`.

``ARG`` is one of

- a preset name or alias, case-insensitive (``llama`` is Llama-3.1-8B; ``autosp-plan --list-models``
  or :func:`list_models` shows them all). Presets live in ``cost_models/catalog/models.toml``, each with the
  public source of its numbers;
- a path to a Hugging Face ``config.json`` on disk (or a directory holding one). It is read as plain
  JSON: no ``transformers`` import, no download. Llama, Mistral and Qwen2 style keys are understood.

Every failure is a :class:`~autosp.errors.UsageError` whose message is one line saying what is wrong
and what to do. Nothing here imports torch.
"""

from __future__ import annotations

import difflib
import os
from functools import lru_cache
from pathlib import Path

from autosp.cost_models.architectures import ATTENTION_SINK_TYPES, check_config
from autosp.cost_models.catalog.aliases import alias_table
from autosp.cost_models.catalog.experts import moe_fields
from autosp.cost_models.catalog.linear import linear_fields
from autosp.cost_models.catalog.windows import sliding_layout
from autosp.contract.specs import ModelSpec
from autosp.errors import UsageError
from autosp.files import read_json

DATA_FILE = Path(__file__).with_name("models.toml")

_SPEC_KEYS = ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn_hidden", "vocab", "gated_mlp",
              "tied_embeddings", "qkv_bias", "norm", "max_position", "rope_theta", "source", "sliding_window",
              "sliding_layers", "n_experts", "experts_per_token", "expert_ffn_hidden", "shared_ffn_hidden",
              "dense_layers", "attn_logit_softcap", "final_logit_softcap", "attn_output_gate", "linear_layers",
              "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
              "linear_conv_kernel_dim", "expert_bias", "clamped_swiglu", "attention_sinks")

# Hugging Face model_type values whose MLP is gated (SwiGLU / GeGLU: gate, up and down projections).
GATED_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "olmo", "olmo2", "granite",
                            "cohere", "internlm2", "yi", "deepseek", "phi3", "smollm3"})
# model_type values whose q/k/v projections carry a bias regardless of the config's attention_bias.
QKV_BIAS_FAMILIES = frozenset({"qwen2"})
# model_type values whose configuration class ties the output head to the input embedding unless the config
# says otherwise (tie_word_embeddings defaults to True in transformers 5.24's configuration_<type>.py; the
# Llama, Mistral, Qwen2/3, Phi-3, OLMo and Granite classes default to False). A Gemma-2 config.json omits
# the key: counting the head twice would add 0.92B parameters to Gemma-2-9B's 9.24B.
TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "cohere", "cohere2", "smollm3", "starcoder2",
                             "falcon"})


@lru_cache(maxsize=1)
def _catalog() -> dict:
    from autosp.cost_models.catalog.parsed import load_toml

    return load_toml(DATA_FILE)["models"]


def _spec_from_entry(name: str, entry: dict) -> ModelSpec:
    fields = {k: entry[k] for k in _SPEC_KEYS if k in entry}
    if fields.get("sliding_layers") == "all":  # the catalog's shorthand for a window on every layer
        fields["sliding_layers"] = tuple(range(entry["n_layers"]))
    if "full_attention_interval" in entry:  # the catalog's shorthand for a hybrid's linear layers (catalog/linear.py)
        interval = entry["full_attention_interval"]
        fields["linear_layers"] = tuple(i for i in range(entry["n_layers"]) if (i + 1) % interval)
    return ModelSpec(name=name, **fields)


@lru_cache(maxsize=None)
def _alias_table() -> dict[str, str]:
    return alias_table(_catalog())


def preset_names() -> list[str]:
    """Canonical preset names, in catalog order."""
    return list(_catalog())


def preset_info(name: str) -> dict:
    """The raw catalog entry of a preset (published parameter count, sources, aliases)."""
    return dict(_catalog()[_alias_table()[name.lower()]])


def list_models() -> list[ModelSpec]:
    """Every preset as a ModelSpec, in catalog order."""
    return [_spec_from_entry(name, entry) for name, entry in _catalog().items()]


def _looks_like_path(arg: str) -> bool:
    return arg.lower().endswith(".json") or os.path.exists(arg)


def resolve_model(arg: str) -> ModelSpec:
    """A preset name/alias (case-insensitive) or a path to a Hugging Face config.json."""
    if not isinstance(arg, str) or not arg.strip():
        raise UsageError("no model given; pass a preset name such as 'llama' or a path to a config.json")
    arg = arg.strip()
    key = arg.lower()
    table = _alias_table()
    if key in table:
        name = table[key]
        return _spec_from_entry(name, _catalog()[name])
    if _looks_like_path(arg):
        return model_from_hf_config(arg)
    close = difflib.get_close_matches(key, list(table), n=6, cutoff=0.5)
    names = list(dict.fromkeys(table[c] for c in close))[:3]  # aliases of one preset suggest it once
    hint = f"did you mean {' or '.join(repr(n) for n in names)}? " if names else ""
    raise UsageError(f"unknown model {arg!r}; {hint}presets: {', '.join(['llama'] + preset_names())} "
                     "(autosp-plan --list-models describes them), or pass a path to a Hugging Face config.json")


def _positive_int(config: dict, key: str, where: str, default=None) -> int:
    value = config.get(key, default)
    if value is None:
        raise UsageError(f"model config {where} has no {key!r}; is it the config.json of a decoder-only "
                         "Hugging Face causal LM (Llama, Mistral, Qwen2)?")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"model config {where}: {key} must be a positive integer, got {value!r}")
    return value


def model_from_hf_config(path: str | os.PathLike) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (Llama / Mistral / Qwen2 keys) into a ModelSpec.

    ``num_key_value_heads`` defaults to the number of heads, ``head_dim`` to hidden / heads,
    ``tie_word_embeddings`` to the family's default (true for Gemma, see TIED_BY_DEFAULT); Qwen2 always has q/k/v biases, Llama-style configs say so in
    ``attention_bias``. Sliding-window layers follow transformers' rules (:mod:`~autosp.cost_models.catalog.windows`);
    mixture-of-experts keys (Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2, gpt-oss's biased experts and clamped SwiGLU)
    :mod:`~autosp.cost_models.catalog.experts`; gpt-oss's attention sinks (``ATTENTION_SINK_TYPES``);
    Gemma 2's ``attn_logit_softcapping`` / ``final_logit_softcapping`` are kept; a Qwen3-Next / Qwen3.5 hybrid's
    linear-attention layers :mod:`~autosp.cost_models.catalog.linear` (Qwen3.5's vision-language config: its
    ``text_config``, the model ``AutoModelForCausalLM`` builds). Architectures autosp does not support are refused
    first, by name (:mod:`autosp.cost_models.architectures`).
    """
    path = os.fspath(path)
    where = path
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
        where = path
    # transformers reads the same file after us (tracing, autosp-train) and cannot skip a byte-order mark
    config = read_json(path, "model config ", allow_bom=False,
                       missing_hint="; pass a preset name (e.g. 'llama') or the path of a Hugging Face config.json")
    if not isinstance(config, dict):
        raise UsageError(f"model config {where} must hold a JSON object (a Hugging Face config.json)")
    check_config(config, f"model config {where}")  # the architectures autosp refuses (cost_models/architectures.py)
    if "hidden_size" not in config and isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], "_name_or_path": config.get("_name_or_path")}  # text-only wrappers

    model_type = str(config.get("model_type", "")).lower()
    n_layers = _positive_int(config, "num_hidden_layers", where)
    hidden = _positive_int(config, "hidden_size", where)
    n_heads = _positive_int(config, "num_attention_heads", where)
    n_kv = _positive_int(config, "num_key_value_heads", where, default=n_heads)
    head_dim = config.get("head_dim")
    if head_dim is None:
        if hidden % n_heads:
            raise UsageError(f"model config {where}: hidden_size {hidden} is not a multiple of num_attention_heads "
                             f"{n_heads} and no head_dim is given; add head_dim to the config")
        head_dim = hidden // n_heads
    else:
        head_dim = _positive_int(config, "head_dim", where)
    # a mixture of experts without dense layers may have no dense width (Qwen3.5-MoE): its experts' stands in
    ffn = _positive_int(config, "intermediate_size", where, default=config.get("moe_intermediate_size"))
    vocab = _positive_int(config, "vocab_size", where)
    if n_heads % n_kv:
        raise UsageError(f"model config {where}: num_attention_heads {n_heads} is not a multiple of "
                         f"num_key_value_heads {n_kv}")

    act = str(config.get("hidden_act", config.get("hidden_activation", "silu"))).lower()
    gated = model_type in GATED_FAMILIES or act in ("silu", "swish", "swiglu")
    qkv_bias = model_type in QKV_BIAS_FAMILIES or bool(config.get("attention_bias", False))
    rope_theta = config.get("rope_theta", 10000.0)
    if not isinstance(rope_theta, (int, float)) or isinstance(rope_theta, bool):
        rope_theta = 10000.0
    max_position = config.get("max_position_embeddings", 0)
    if not isinstance(max_position, int) or isinstance(max_position, bool) or max_position < 0:
        max_position = 0
    name = config.get("_name_or_path") or os.path.basename(os.path.dirname(os.path.abspath(path))) or "custom"
    try:
        window, windowed = sliding_layout(config, n_layers)
    except ValueError as err:
        raise UsageError(f"model config {where}: {err}") from None
    experts = moe_fields(config, n_layers, ffn, where)
    try:
        linear = linear_fields(config, n_layers)  # Gated DeltaNet layers of a hybrid (catalog/linear.py)
    except ValueError as err:
        raise UsageError(f"model config {where}: {err}") from None
    caps = {key: float(config.get(hf) or 0.0) for key, hf in (("attn_logit_softcap", "attn_logit_softcapping"),
                                                              ("final_logit_softcap", "final_logit_softcapping"))
            if isinstance(config.get(hf), (int, float)) and not isinstance(config.get(hf), bool)}
    try:
        return ModelSpec(
            name=str(name), n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
            ffn_hidden=ffn, vocab=vocab, gated_mlp=gated,
            tied_embeddings=bool(config.get("tie_word_embeddings", model_type in TIED_BY_DEFAULT)),
            qkv_bias=qkv_bias, norm="rmsnorm" if "rms_norm_eps" in config or model_type in GATED_FAMILIES else "layernorm",
            max_position=max_position, rope_theta=float(rope_theta), source=os.path.abspath(path),
            sliding_window=window, sliding_layers=windowed, attention_sinks=model_type in ATTENTION_SINK_TYPES,
            **experts, **caps, **linear)
    except ValueError as err:
        raise UsageError(f"invalid model config {where}: {err}") from None


__all__ = ["DATA_FILE", "GATED_FAMILIES", "QKV_BIAS_FAMILIES", "list_models", "model_from_hf_config", "preset_info",
           "preset_names", "resolve_model"]
