"""Model catalog: presets reproduce published parameter counts; HF config.json parsing; errors."""

import json
import subprocess
import sys

import pytest

from autosp.contract.specs import ModelSpec
from autosp.errors import UsageError
from autosp.cost_models.catalog.models import list_models, model_from_hf_config, preset_info, preset_names, resolve_model

REQUIRED = ["llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "mistral-7b",
            "qwen2.5-7b", "qwen2.5-72b"]


def test_required_presets_exist_and_llama_is_llama_3_1_8b():
    names = preset_names()
    for name in REQUIRED:
        assert name in names
    assert resolve_model("llama") == resolve_model("llama-3.1-8b")
    assert resolve_model("LLaMA-3.1-8B").name == "llama-3.1-8b"


@pytest.mark.parametrize("spec", list_models(), ids=lambda m: m.name)
def test_parameter_count_matches_published_within_one_percent(spec):
    published = preset_info(spec.name)["published_params"]
    assert abs(spec.n_params() / published - 1) < 0.01, (spec.n_params(), published)


def test_exact_counts_of_reference_models():
    # Llama-3.1-8B: 32 x (2*4096*4096 + 2*4096*1024 + 3*4096*14336 + 2*4096) + 2*128256*4096 + 4096
    assert resolve_model("llama-3.1-8b").n_params() == 8_030_261_248
    # Llama-3.2-1B ties its embeddings: the head is not counted twice.
    assert resolve_model("llama-3.2-1b").n_params() == 1_235_814_400
    # Qwen2.5-7B has q/k/v biases: 7,615,616,512 (HF safetensors reports 7.62B).
    assert resolve_model("qwen2.5-7b").n_params() == 7_615_616_512


@pytest.mark.parametrize("spec", list_models(), ids=lambda m: m.name)
def test_every_preset_cites_public_sources(spec):
    info = preset_info(spec.name)
    assert spec.source.startswith("https://")
    assert info["params_source"] and info["verified"]


def _write(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


LLAMA_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256,
}


def test_hf_config_of_llama_matches_the_preset(tmp_path):
    spec = resolve_model(_write(tmp_path, LLAMA_8B_CONFIG))
    preset = resolve_model("llama-3.1-8b")
    for field in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn_hidden", "vocab", "gated_mlp",
                  "tied_embeddings", "qkv_bias", "max_position", "rope_theta"):
        assert getattr(spec, field) == getattr(preset, field), field
    assert spec.n_params() == preset.n_params()


def test_hf_config_defaults_and_qwen2_bias(tmp_path):
    config = {"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
              "num_hidden_layers": 28, "intermediate_size": 18944, "vocab_size": 152064, "hidden_act": "silu"}
    spec = model_from_hf_config(_write(tmp_path, config))
    assert spec.qkv_bias and spec.gated_mlp and not spec.tied_embeddings
    assert spec.head_dim == 128
    assert spec.n_params() == resolve_model("qwen2.5-7b").n_params()
    # num_key_value_heads defaults to the number of heads (plain multi-head attention)
    mha = dict(LLAMA_8B_CONFIG)
    del mha["num_key_value_heads"]
    assert model_from_hf_config(_write(tmp_path, mha, "mha.json")).n_kv_heads == 32


def test_hf_config_directory_and_explicit_head_dim(tmp_path):
    config = dict(LLAMA_8B_CONFIG, hidden_size=3072, num_attention_heads=24, head_dim=128, num_hidden_layers=28,
                  intermediate_size=8192, tie_word_embeddings=True)
    (tmp_path / "model").mkdir()
    _write(tmp_path / "model", config)
    spec = resolve_model(str(tmp_path / "model"))
    preset = resolve_model("llama-3.2-3b")
    assert (spec.hidden, spec.head_dim, spec.n_heads, spec.tied_embeddings) == (3072, 128, 24, True)
    assert spec.n_params() == preset.n_params()


@pytest.mark.parametrize("mutate, expected", [
    (lambda c: c.pop("hidden_size"), "has no 'hidden_size'"),
    (lambda c: c.update(num_hidden_layers=0), "num_hidden_layers must be a positive integer"),
    (lambda c: c.update(num_key_value_heads=5), "not a multiple of num_key_value_heads"),
    (lambda c: c.update(num_local_experts=8), "mixture-of-experts"),
])
def test_bad_hf_configs_are_one_line_usage_errors(tmp_path, mutate, expected):
    config = dict(LLAMA_8B_CONFIG)
    mutate(config)
    with pytest.raises(UsageError) as err:
        resolve_model(_write(tmp_path, config))
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        resolve_model(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        resolve_model(str(bad))
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    with pytest.raises(UsageError, match="JSON object"):
        resolve_model(str(arr))


def test_unknown_preset_suggests_close_matches():
    with pytest.raises(UsageError) as err:
        resolve_model("llama-3.1-7b")
    message = str(err.value)
    assert "llama-3.1-8b" in message and "--list-models" in message and "\n" not in message
    with pytest.raises(UsageError, match="unknown model"):
        resolve_model("gpt-17")


def test_list_models_returns_model_specs():
    models = list_models()
    assert all(isinstance(m, ModelSpec) for m in models)
    assert len({m.name for m in models}) == len(models) >= len(REQUIRED)


def test_planning_imports_never_pull_in_torch():
    code = ("import sys, autosp.cost_models, autosp.cost_models.catalog.models, autosp.cost_models.catalog.hardware; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_model_suggests_each_preset_once():
    with pytest.raises(UsageError) as err:
        resolve_model("lama")
    message = str(err.value)
    assert "did you mean" in message
    suggested = message.split("did you mean ")[1].split("?")[0].split(" or ")
    assert len(suggested) == len(set(suggested)) >= 2
