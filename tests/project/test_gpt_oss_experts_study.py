"""studies/gpt_oss_experts.py: the clamped SwiGLU's extra tensors in the experts op's backward are what the cost model
prices (moe.CLAMPED_SWIGLU_EXTRA_PER_WIDTH), the other terms unchanged, and the presets count transformers' parameters
but the o_proj biases."""

import json


def test_the_gpt_oss_experts_study_measures_what_the_cost_model_prices(tmp_path, capsys):
    from studies import gpt_oss_experts

    from autosp.cost_models import moe

    assert gpt_oss_experts.main(["--out", str(tmp_path / "oss")]) == 0
    result = json.loads((tmp_path / "oss.json").read_text())
    silu, oss = (result["op_backward_fit"][k]["fit"] for k in ("silu", "gpt_oss"))
    assert abs(oss["k_fe"] - silu["k_fe"] - moe.CLAMPED_SWIGLU_EXTRA_PER_WIDTH) < 0.25
    assert abs(oss["k_h"] - silu["k_h"]) < 0.25
    for row in result["parameters"]:
        layers = 24 if row["model"] == "gpt-oss-20b" else 36
        assert row["transformers"] - row["spec"] == layers * 2880
        assert abs(row["spec_active_less_embedding"] / row["published_active"] - 1) < 0.001
    assert "CLAMPED_SWIGLU_EXTRA_PER_WIDTH" in capsys.readouterr().out
