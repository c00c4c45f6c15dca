"""studies/linear_attention_memory.py at one length: the planner's saved bytes and backward peak of a Gated DeltaNet
mixer (cost_models/linear_attention.py) against the tiny Qwen3-Next measured compiled on the CPU."""

import json

import pytest


@pytest.mark.slow
def test_the_linear_attention_memory_prediction_holds_on_the_tiny_model(tmp_path, capsys):
    from studies import linear_attention_memory

    out = str(tmp_path / "memory")
    assert linear_attention_memory.main(["--tokens", "8192", "--no-fit", "--out", out]) == 0
    (row,) = json.loads((tmp_path / "memory.json").read_text())["rows"]
    predicted, measured = row["predicted"], row["compiled"]
    assert abs(predicted["saved"] / measured["saved"] - 1) < 0.01            # 1.000 in the committed table
    assert 0.9 < predicted["bwd_peak"] / measured["bwd_peak"] < 1.1          # 0.936 in the committed table
    assert predicted["states"] == 4 * 64 * 64 * 4 and "bwd peak pred" in capsys.readouterr().out
