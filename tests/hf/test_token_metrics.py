"""autosp.hf's per-token metrics == TRL's fused-head kernel on the same logits: the entropy sum and the number of
targets that are the first argmax (ties with an earlier token do not count), over the targets that are not
ignored, read a slice of tokens at a time."""

from __future__ import annotations

import torch

from autosp.hf import token_metrics


def _trl_sums(logits, targets):
    """What trl.SFTTrainer sums per micro-batch: its chunked log-prob kernel's entropy and is_top1 over the
    valid targets (the logits as hidden states through an identity head)."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    valid = targets != -100
    vocab = logits.shape[-1]
    _, entropy, _, _, is_top1 = ChunkedLogProbFunction.apply(
        logits[valid], torch.eye(vocab), None, targets[valid], 1.0, 16, None, 1.0, ("log_probs", "entropy", "is_top1"))
    return entropy.double().sum().item(), is_top1.sum().item(), int(valid.sum())


def test_token_sums_equal_trl_kernel(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 11, 40, generator=gen) * 3
    targets = torch.randint(0, 40, (3, 11), generator=gen)
    targets[0, :4] = -100
    targets[2, -1] = -100
    # targets that are the argmax, alone and tied with an earlier / a later token
    logits[1, 0, 7], targets[1, 0] = 50.0, 7
    logits[1, 1, [3, 9]], targets[1, 1] = 50.0, 9   # tie with an earlier token: not top-1
    logits[1, 2, [12, 30]], targets[1, 2] = 50.0, 12  # tie with a later token: top-1
    monkeypatch.setattr(token_metrics, "_SLICE_ELEMENTS", 5 * 40)  # several slices of 5 tokens
    got = token_metrics.token_sums(logits, targets, -100).tolist()
    want = _trl_sums(logits.reshape(-1, 40), targets.reshape(-1))
    assert got[1:] == [want[1], want[2]] and want[1] >= 2, (got, want)
    assert abs(got[0] - want[0]) <= 1e-6 * abs(want[0]), (got, want)
    for position, top1 in ((1, 0.0), (2, 1.0)):  # each tie alone (together a wrong rule could balance out)
        assert token_metrics.token_sums(logits[1, position], targets[1, position], -100)[1].item() == top1
