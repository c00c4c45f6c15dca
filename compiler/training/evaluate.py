"""Held-out loss under the run's own sequence-parallel plan (``autosp-train --eval-data --eval-every``).

Each evaluation batch goes through the same :class:`~autosp.compiler.runtime.SPEngine` as training: every
rank holds its shard of the sequence, the logits of its tokens only, and the loss pass all-reduces the
token-weighted sum -- no rank ever holds full-length logits. The batch losses (each the exact global mean
over its targets) are combined weighted by their target counts, so the result is the token-weighted mean
over every target of the evaluated sequences: one process's loss on the same data.

What evaluation must not change:

- autograd: the forward runs under ``torch.no_grad()`` (no graph, no saved activations); Dynamo
  guards on grad mode and compiles an inference graph beside the training one, once;
- the model's mode: ``eval()`` for the forward (dropout off), the previous mode restored after;
- the random streams: the CPU and CUDA generator states are saved and restored, so the training
  steps after an evaluation draw what they would have drawn without it;
- DeepSpeed's state: forward alone never counts a micro-step nor touches gradients or the optimizer.
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def preserved_rng():
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def evaluate(engine, source, rows: int, steps: int | None = None) -> dict:
    """The token-weighted mean loss of ``source``'s evaluation batches (all of them, or the first
    ``steps``): ``{"eval_loss", "eval_tokens", "eval_targets", "eval_batches"}``."""
    from autosp.compiler.data.sources import batch_counts

    count = source.eval_batches(rows)
    if steps is not None:
        count = min(count, steps)
    module = engine.module
    was_training = module.training
    total, targets, tokens = 0.0, 0, 0
    with preserved_rng(), torch.no_grad():
        engine.train(False)
        try:
            for index in range(count):
                batch = source.eval_batch(index, rows)
                real, n = batch_counts(batch)
                loss = engine(**batch)
                total += float(loss.detach().double().item()) * n
                targets += n
                tokens += real
        finally:
            engine.train(was_training)
    return {"eval_loss": total / targets if targets else float("nan"), "eval_tokens": tokens,
            "eval_targets": targets, "eval_batches": count}


__all__ = ["evaluate", "preserved_rng"]
