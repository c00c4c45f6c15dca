"""The one list of refused architectures (cost_models/architectures.py)."""

from __future__ import annotations

import pytest

from autosp.cost_models.architectures import config_refusal, refusal


@pytest.mark.parametrize("model_type, words", [("qwen3_next", "hybrid"), ("qwen3_5_text", "hybrid"),
                                               ("bart", "encoder-decoder"), ("llava", "vision-language"),
                                               ("gemma3", "vision-language")])
def test_refused_by_type(model_type, words):
    assert words in refusal(model_type) and model_type in refusal(model_type)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "qwen3_moe", "mixtral", "olmoe", "gemma2", "gemma3_text",
                                        "llama4_text"])
def test_accepted(model_type):
    assert refusal(model_type) is None


def test_config_flags_refuse_whatever_the_type():
    assert "encoder-decoder" in config_refusal({"model_type": "custom", "is_encoder_decoder": True})
    assert "vision-language" in config_refusal({"model_type": "custom", "vision_config": {"hidden_size": 8}})
    assert config_refusal({"model_type": "llama"}) is None and config_refusal(None) is None
