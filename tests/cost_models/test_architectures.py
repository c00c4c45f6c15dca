"""The one list of refused architectures (cost_models/architectures.py)."""

from __future__ import annotations

import pytest

from autosp.cost_models.architectures import architecture_refusal, check_config
from autosp.errors import UsageError


@pytest.mark.parametrize("model_type, words", [("qwen3_next", "hybrid"), ("qwen3_5_text", "hybrid"),
                                               ("bart", "encoder-decoder"), ("llava", "vision-language"),
                                               ("gemma3", "vision-language")])
def test_refused_by_type(model_type, words):
    assert words in architecture_refusal({"model_type": model_type})
    with pytest.raises(UsageError, match=words):
        check_config({"model_type": model_type}, "cfg.json")


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "qwen3_moe", "mixtral", "olmoe", "gemma2", "gemma3_text",
                                        "llama4_text"])
def test_accepted(model_type):
    assert architecture_refusal({"model_type": model_type}) is None


def test_config_flags_refuse_whatever_the_type():
    assert "encoder-decoder" in architecture_refusal({"model_type": "custom", "is_encoder_decoder": True})
    assert "vision-language" in architecture_refusal({"model_type": "custom", "vision_config": {"hidden_size": 8}})
    assert architecture_refusal(None) is None
