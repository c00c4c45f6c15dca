"""The mixture-of-experts fields of a ModelSpec, read from a Hugging Face config.json alone.

The keys are transformers' own (5.x ``configuration_<type>.py``):

- experts: ``num_local_experts`` (Mixtral), ``num_experts`` (Qwen2/3-MoE, OLMoE), ``n_routed_experts``
  (DeepSeek-V2/V3); top-k: ``num_experts_per_tok``;
- expert width: ``moe_intermediate_size`` (Qwen2/3-MoE, DeepSeek), else ``intermediate_size`` (Mixtral and OLMoE
  build their experts with it);
- shared experts: ``shared_expert_intermediate_size`` (Qwen2-MoE, one shared expert) or ``n_shared_experts`` x
  ``moe_intermediate_size`` (DeepSeek);
- dense layers: ``mlp_only_layers`` and ``decoder_sparse_step`` (Qwen: layer i is sparse when
  (i + 1) % step == 0 and i is not listed), ``first_k_dense_replace`` and ``moe_layer_freq`` (DeepSeek: layer i is
  sparse when i >= k and i % freq == 0). Dense layers use ``intermediate_size``;
- gpt-oss (``model_type`` gpt_oss): biases on the router and on every expert's projections (transformers'
  ``GptOssExperts``: ``gate_up_proj_bias``, ``down_proj_bias``; no config key says so) and, with ``swiglu_limit``,
  the clamped SwiGLU gate.

A config without any experts key gives no fields (a dense model). Errors are one-line UsageErrors.
"""

from __future__ import annotations

from autosp.errors import UsageError

__all__ = ["BIASED_EXPERT_TYPES", "EXPERT_KEYS", "moe_fields"]

EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
BIASED_EXPERT_TYPES = frozenset({"gpt_oss"})
"""model_type values whose router and experts carry biases (transformers 5.24's modeling_<type>.py)."""


def _int(config: dict, key: str, where: str, default=None, minimum: int = 1) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(f"model config {where} describes a mixture-of-experts model but {key} is {value!r}; "
                         f"expected an integer >= {minimum}")
    return value


def moe_fields(config: dict, n_layers: int, ffn: int, where: str) -> dict:
    """The ModelSpec MoE fields (n_experts, experts_per_token, expert_ffn_hidden, shared_ffn_hidden, dense_layers)
    of a config dict; {} for a dense model."""
    key = next((k for k in EXPERT_KEYS if config.get(k)), None)
    if key is None:
        return {}
    experts = _int(config, key, where)
    top_k = _int(config, "num_experts_per_tok", where)
    if top_k > experts:
        raise UsageError(f"model config {where}: num_experts_per_tok {top_k} exceeds the {experts} experts ({key})")
    width = _int(config, "moe_intermediate_size", where) if "moe_intermediate_size" in config else ffn
    shared = 0
    if config.get("shared_expert_intermediate_size"):
        shared = _int(config, "shared_expert_intermediate_size", where)
    elif config.get("n_shared_experts"):
        shared = _int(config, "n_shared_experts", where) * width
    if "first_k_dense_replace" in config or "moe_layer_freq" in config:  # DeepSeek
        first = _int(config, "first_k_dense_replace", where, default=0, minimum=0)
        freq = _int(config, "moe_layer_freq", where, default=1)
        sparse = [i >= first and i % freq == 0 for i in range(n_layers)]
    else:  # Qwen2/3-MoE (Mixtral and OLMoE: every layer)
        step = _int(config, "decoder_sparse_step", where, default=1)
        only = config.get("mlp_only_layers") or []
        if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
            raise UsageError(f"model config {where}: mlp_only_layers must be a list of layer indices, got {only!r:.60}")
        sparse = [(i + 1) % step == 0 and i not in only for i in range(n_layers)]
    if not any(sparse):
        return {}  # every layer dense: nothing to route
    gpt_oss = {}
    if str(config.get("model_type", "")).lower() in BIASED_EXPERT_TYPES:
        gpt_oss = {"expert_bias": True, "clamped_swiglu": config.get("swiglu_limit") is not None}
    return {"n_experts": experts, "experts_per_token": top_k, "expert_ffn_hidden": width, "shared_ffn_hidden": shared,
            "dense_layers": tuple(i for i, s in enumerate(sparse) if not s), **gpt_oss}
