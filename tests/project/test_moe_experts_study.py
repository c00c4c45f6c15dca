"""studies/moe_experts_speed.py at a tiny size: every implementation that runs here agrees with transformers' eager
experts to fp32 precision, and the table names each."""

import json


def test_the_experts_speed_study_compares_exact_implementations(tmp_path, capsys):
    from studies import moe_experts_speed

    out = str(tmp_path / "speed")
    assert moe_experts_speed.main(["--experts", "8", "--hidden", "16", "--inner", "32", "--tokens", "64",
                                   "--rounds", "1", "--out", out]) == 0
    result = json.loads((tmp_path / "speed.json").read_text())
    assert set(result["rows"]) == set(moe_experts_speed.IMPLEMENTATIONS)
    ours = result["rows"]["autosp_ep"]
    assert ours["max_rel_error"] <= 1e-5 and ours["median"] > 0
    for row in result["rows"].values():
        assert "error" in row or row["max_rel_error"] <= 1e-5
    text = capsys.readouterr().out
    assert all(impl in text for impl in moe_experts_speed.IMPLEMENTATIONS)
