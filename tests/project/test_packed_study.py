"""``python -m studies.packed_costs``: its packed inputs follow the Hugging Face convention, its rows are the
workloads the cost model prices, and its predicted table runs without torch work."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # studies/ is a plain folder of scripts, run from the repository root
    sys.path.insert(0, str(ROOT))

from studies import packed_costs  # noqa: E402
from studies.measure import RunConfig  # noqa: E402


def test_packed_inputs_restart_positions_and_ignore_each_first_label():
    torch = pytest.importorskip("torch")
    cfg = RunConfig(model=packed_costs.MODEL, seq_len=8, sp=1, doc_lens=(3, 1, 4))
    ids = torch.arange(16).view(2, 8)
    labels, positions = cfg.packed_inputs(ids)
    assert positions.tolist() == [[0, 1, 2, 0, 0, 1, 2, 3]] * 2
    assert labels.tolist() == [[-100, 1, 2, -100, -100, 5, 6, 7], [-100, 9, 10, -100, -100, 13, 14, 15]]
    assert cfg.workload().doc_lens == ((1, 1), (3, 1), (4, 1))
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="sum to 7"):
        RunConfig(model=packed_costs.MODEL, seq_len=8, sp=1, doc_lens=(3, 4)).packed_inputs(ids)


def test_the_rows_price_k_documents_as_one_kth_of_the_triangle():
    cfgs = packed_costs.configs(4096, 1, "aot_eager")
    shares = {c.label: packed_costs.attention_share(c) for c in cfgs}
    assert shares["ulysses unpacked"] == shares["ulysses 1 x 4096"] == 1.0
    assert shares["ulysses 16 x 256"] == pytest.approx(1 / 16)
    assert shares["ring 2 64 x 64"] == pytest.approx(1 / 64)


def test_the_predicted_table_prints(capsys):
    assert packed_costs.main(["--predict-only"]) == 0
    out = capsys.readouterr().out
    assert "ring 2 16 x 256" in out and "6.25%" in out and "predicted rows only" in out
