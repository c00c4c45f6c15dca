"""The one list of refused architectures (cost_models/architectures.py)."""

from __future__ import annotations

import pytest

from autosp.cost_models.architectures import architecture_refusal, check_config
from autosp.errors import UsageError


@pytest.mark.parametrize("model_type, words", [("jamba", "hybrid"), ("falcon_h1", "hybrid"),
                                               ("bart", "encoder-decoder"), ("llava", "vision-language"),
                                               ("gemma3", "vision-language")])
def test_refused_by_type(model_type, words):
    assert words in architecture_refusal({"model_type": model_type})
    with pytest.raises(UsageError, match=words):
        check_config({"model_type": model_type}, "cfg.json")


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "qwen3_moe", "mixtral", "olmoe", "gemma2", "gemma3_text",
                                        "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "llama4_text"])
def test_accepted(model_type):
    assert architecture_refusal({"model_type": model_type}) is None


def test_config_flags_refuse_whatever_the_type():
    assert "encoder-decoder" in architecture_refusal({"model_type": "custom", "is_encoder_decoder": True})
    assert "vision-language" in architecture_refusal({"model_type": "custom", "vision_config": {"hidden_size": 8}})
    assert architecture_refusal(None) is None


# The released configs' shapes (Hugging Face config.json, trimmed to the keys the readers look at).
QWEN2_5_VL_7B = {  # Qwen/Qwen2.5-VL-7B-Instruct: the language model's fields at the top level, no text_config
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "hidden_size": 3584,
    "intermediate_size": 18944, "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "vocab_size": 152064, "max_position_embeddings": 128000, "rope_theta": 1000000.0, "hidden_act": "silu",
    "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "sliding_window": 32768, "use_sliding_window": False,
    "max_window_layers": 28, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vision_config": {"depth": 32, "hidden_size": 1280, "out_hidden_size": 3584}}
LLAVA_TEXT = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
              "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32064, "rms_norm_eps": 1e-5}
LLAVA = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "text_config": LLAVA_TEXT,
         "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024}}
LLAMA4_TEXT = {  # meta-llama/Llama-4-Scout-17B-16E's text_config: 3 of every 4 layers attend within 8,192-token chunks
    "model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 48,
    "vocab_size": 202048, "num_local_experts": 16, "num_experts_per_tok": 1, "attention_chunk_size": 8192,
    "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(48)]}
LLAMA4 = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "text_config": LLAMA4_TEXT,
          "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 1408}}


def _write(tmp_path, config, name="config.json"):
    import json

    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def test_vision_language_refusals_say_how_to_plan_the_language_model_and_doing_so_plans_it(tmp_path):
    from autosp.cost_models.catalog.models import resolve_model

    # text fields at the top level (Qwen2.5-VL): the message names the decoder's model_type; following it plans
    with pytest.raises(UsageError) as err:
        resolve_model(_write(tmp_path, QWEN2_5_VL_7B))
    message = str(err.value)
    assert '"model_type": "qwen2" and without vision_config' in message and "text_config" not in message
    assert "gemma" not in message and "\n" not in message
    copy = {k: v for k, v in QWEN2_5_VL_7B.items() if k != "vision_config"}
    spec = resolve_model(_write(tmp_path, {**copy, "model_type": "qwen2"}, "lm.json"))
    assert spec.qkv_bias and abs(spec.n_params() / 7.6e9 - 1) < 0.01  # Qwen2-7B's decoder (+ the VL's 0.67B vision)
    # a text_config (LLaVA): plan that object as its own config.json
    with pytest.raises(UsageError, match="plan its text_config \\(save that object as its own config.json\\)"):
        resolve_model(_write(tmp_path, LLAVA))
    assert resolve_model(_write(tmp_path, LLAVA_TEXT, "text.json")).n_layers == 32
    # a vision config of an unknown family without a text_config: no preset and no field it does not have
    assert architecture_refusal({"model_type": "my_vlm", "vision_config": {}}).endswith(
        "plan the config.json of its language model")


def test_llama4_chunked_attention_is_refused_by_the_planner_as_by_the_compiler(tmp_path):
    """Before, a Llama-4 text config was planned as full attention with no note, then the compiler refused its
    chunk mask (a message about sliding windows); now both refuse it with the one sentence of check_config."""
    import transformers

    from autosp.compiler.linear_attention import check_architecture
    from autosp.cost_models.catalog.models import resolve_model

    with pytest.raises(UsageError) as planned:
        resolve_model(_write(tmp_path, LLAMA4_TEXT))
    assert "uses chunked attention on 36 of its layers (attention_chunk_size 8192" in str(planned.value)
    with pytest.raises(UsageError, match="s language model: llama4_text uses chunked attention"):
        resolve_model(_write(tmp_path, LLAMA4, "vlm.json"))
    config = transformers.Llama4TextConfig(hidden_size=32, intermediate_size=32, intermediate_size_mlp=32,
                                           num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                                           head_dim=16, vocab_size=64, num_local_experts=2, attention_chunk_size=8)
    with pytest.raises(UsageError) as compiled:
        check_architecture(transformers.Llama4ForCausalLM(config))
    reason = "uses chunked attention on 3 of its layers (attention_chunk_size 8: a query sees only the keys"
    assert reason in str(compiled.value) and str(compiled.value).startswith("autosp.compile: llama4_text uses")
    assert architecture_refusal({"model_type": "llama4_text", "attention_chunk_size": None}) is None


def test_gated_deltanet_hybrids_are_planned_other_hybrids_refused_naming_what_runs():
    assert architecture_refusal({"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"]}) \
        is None
    qwen3_5 = {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
               "vision_config": {"depth": 27}, "text_config": {"model_type": "qwen3_5_moe_text",
                                                               "layer_types": ["linear_attention", "full_attention"]}}
    assert architecture_refusal(qwen3_5) is None  # AutoModelForCausalLM builds its language model alone
    for config in ({"model_type": "jamba", "architectures": ["JambaForCausalLM"]},
                   {"model_type": "falcon_h1"}, {"model_type": "qwen3_next", "layer_types": ["mamba", "full_attention"]}):
        reason = architecture_refusal(config)
        assert "does not shard: of the hybrids, autosp trains the Gated DeltaNet ones (Qwen3-Next, Qwen3.5)" in reason
