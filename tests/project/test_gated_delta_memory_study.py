"""studies/gated_delta_memory.py at a tiny size: autosp's Gated DeltaNet op agrees with transformers' code to fp32
precision, keeps less than transformers' fallback traced whole, and the table says so."""

import json


def test_the_gated_delta_memory_study_measures_an_exact_op(tmp_path, capsys):
    from studies import gated_delta_memory

    out = str(tmp_path / "memory")
    assert gated_delta_memory.main(["--tokens", "256", "--heads-k", "2", "--heads-v", "4", "--dk", "16", "--dv", "16",
                                    "--sp", "2", "--piece", "64", "--out", out]) == 0
    result = json.loads((tmp_path / "memory.json").read_text())
    assert (result["local_heads_k"], result["local_heads_v"]) == (1, 2)
    (row,) = result["rows"]
    assert row["max_rel_error"] <= 1e-5
    per = row["per_token"]
    assert per["op_saved"] < per["hf_saved"] and per["op_saved"] + per["op_bwd_peak"] < per["hf_saved"] + per["hf_bwd_peak"]
    assert "op held" in capsys.readouterr().out
