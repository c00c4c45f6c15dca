"""studies/host_offload_probe.py on this CPU."""

import json


def test_the_host_offload_probe_measures_the_host_passes_against_the_triad(tmp_path, capsys):
    """studies/host_offload_probe.py on this CPU without CPU Adam (its JIT build is a minute): the triad and the host
    passes ZeRO-Offload makes, each a positive rate written to its JSON and printed against the triad."""
    from studies import host_offload_probe

    assert host_offload_probe.main(["--no-adam", "--params", "2e6", "--repeats", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "host_offload_probe.json").read_text())
    assert result["triad"]["bandwidth"] > 0 and "cpu_adam" not in result
    assert set(result["host_passes"]) == {"fp32_to_bf16_cast", "fp32_scale_in_place", "fp32_zero"}
    assert all(rate > 0 for rate in result["host_passes"].values())
    assert "x triad" in capsys.readouterr().out
