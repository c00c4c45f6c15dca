"""studies/cpu_attention_rows.py: the row-blocked backward it times is the causal attention's backward (so its
timings compare equal work), for blocks that divide the sequence and a last block that does not."""

import pytest
import torch


@pytest.mark.parametrize("n,rows", [(96, 32), (100, 32), (64, 64)])
def test_the_row_blocked_backward_gives_the_single_calls_gradients(n, rows):
    from studies import cpu_attention_rows as study

    gen = torch.Generator().manual_seed(n)
    q, dout = (torch.randn(1, 4, n, 16, generator=gen) for _ in range(2))
    k, v = (torch.randn(1, 2, n, 16, generator=gen) for _ in range(2))
    out, lse = study.FORWARD(q, k, v, 0.0, True)[:2]
    single = study.BACKWARD(dout, q, k, v, out, lse, 0.0, True)
    blocked = study.backward_in_rows(dout, q, k, v, out, lse, rows)
    for a, b in zip(blocked, single):
        assert a.shape == b.shape and study.rel_err(a, b) < 1e-5


def test_the_study_prints_a_ratio_per_shape(capsys, monkeypatch):
    from studies import cpu_attention_rows as study

    monkeypatch.setattr(study, "SHAPES", ((128, 2, 1, 16, torch.float32),))
    assert study.main(["--rounds", "1", "--rows", "32", "--threads", "1"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert "128 tokens" in line and "rows 32" in line and "x" in line

