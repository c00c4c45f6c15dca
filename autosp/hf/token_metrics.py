"""TRL's per-token training metrics (``entropy``, ``mean_token_accuracy``, ``num_tokens``, ``aux_loss``) under SP.

What ``trl.SFTTrainer`` (1.16) logs, from its fused LM head, for each micro-batch: over every valid next-token
target (shifted label != -100) of every process, the summed entropy of the next-token distribution
(``logsumexp(z) - sum_v softmax(z)_v z_v`` of the fp32 logits ``z``) and the number of targets that are the
first argmax of ``z``, each divided by the number of valid targets: ``entropy`` and ``mean_token_accuracy``.
``log`` then averages the micro-batches' values since the last log. ``num_tokens`` is the running count of
training input tokens: the batch's ``attention_mask`` sum, else the width of its ``position_ids`` (a
padding-free row), summed over the processes. ``aux_loss`` is a MoE model's load-balancing loss.

Under SP a rank holds the logits of its shard of the sequence only, so each rank sums over its own valid
targets and one all-reduce of [entropy sum, correct, count] over all dp x sp ranks gives the micro-batch's
global sums: token-weighted over the whole micro-batch, as one process computes them, not a mean of per-rank
means. The logits are read where they exist, a slice of tokens at a time (no full-vocabulary copy of the
shard): untiled, the model's output logits for the rank's shard; with the loss tiled (``loss_chunks > 1``)
each chunk's logits inside the tiled loss, while the chunk exists (compiler/passes/tiling_loss.py
``LOGIT_OBSERVERS``), so the full logits still never exist. ``num_tokens`` comes from the whole batch every
rank loads; ``aux_loss`` is the model's, which autosp already makes the global one (compiler/router_loss.py).
"""

from __future__ import annotations

import contextlib

import torch

from autosp.errors import AutospError, UsageError

# logits elements read at once (64 MiB in fp32): bounds what the metrics add at a long context and a large vocabulary
_SLICE_ELEMENTS = 1 << 24


def token_sums(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """[entropy sum, number of targets that are the first argmax, number of valid targets] (float64) over the
    positions whose target is not ``ignore_index``; ``logits`` is [..., vocab], ``targets`` [...]."""
    vocab = logits.shape[-1]
    flat, flat_targets = logits.reshape(-1, vocab), targets.reshape(-1).to(logits.device)
    valid = (flat_targets != ignore_index).nonzero().squeeze(1)
    sums = torch.zeros(3, dtype=torch.float64, device=logits.device)
    with torch.no_grad():
        for rows in valid.split(max(1, _SLICE_ELEMENTS // max(vocab, 1))):
            z = flat.index_select(0, rows).float()
            top = z.amax(-1, keepdim=True)
            e = (z - top).exp()
            total = e.sum(-1)
            entropy = top.squeeze(-1) + total.log() - (e * z).sum(-1) / total  # log Z - E_p[z], as TRL's kernel
            correct = z.argmax(-1) == flat_targets.index_select(0, rows)  # argmax: the first maximum, as TRL's
            sums += torch.stack([entropy.double().sum(), correct.double().sum(),
                                 torch.tensor(float(rows.numel()), dtype=torch.float64, device=sums.device)])
    return sums


class TokenSums:
    """One engine call's token sums on this rank: from the tiled loss's chunks when it ran, else from the model's
    output logits; and the output's ``aux_loss``."""

    def __init__(self, ignore_index: int):
        self.ignore_index = ignore_index
        self.sums = None
        self.aux_loss = None
        self._from_chunks = False

    def _add(self, sums):
        self.sums = sums if self.sums is None else self.sums + sums

    def observe_chunk(self, logits, target, ignore_index):
        self._from_chunks = True
        self._add(token_sums(logits, target, ignore_index))

    def observe_output(self, out, inputs: dict):
        """The model's output of this rank's shard (``inputs['labels']``: its targets, shifted by the runtime)."""
        labels = inputs["labels"]
        logits = out.get("logits") if isinstance(out, dict) else getattr(out, "logits", None)
        if not self._from_chunks:
            if logits is None or logits.shape[:-1] != labels.shape:
                shape = None if logits is None else tuple(logits.shape)
                raise AutospError(f"autosp.hf cannot read the shard's logits ({shape}) for TRL's token metrics; "
                                  f"labels {tuple(labels.shape)} (a bug: please report it)")
            self._add(token_sums(logits, labels, self.ignore_index))
        expected = int((labels != self.ignore_index).sum())
        if self.sums is None or int(self.sums[2]) != expected:
            raise AutospError(f"autosp.hf's token metrics saw {0 if self.sums is None else int(self.sums[2])} of the "
                              f"shard's {expected} targets (a bug: please report it)")
        aux = out.get("aux_loss") if isinstance(out, dict) else getattr(out, "aux_loss", None)
        self.aux_loss = aux.detach() if isinstance(aux, torch.Tensor) else aux

    @contextlib.contextmanager
    def observing(self, target):
        """While the engine calls the model through ``target`` (the mixin's ``_Target``)."""
        from autosp.compiler.passes.tiling_loss import LOGIT_OBSERVERS

        LOGIT_OBSERVERS.append(self.observe_chunk)
        target.observe = self.observe_output
        try:
            yield self
        finally:
            target.observe = None
            LOGIT_OBSERVERS.remove(self.observe_chunk)


def global_ratios(sums: torch.Tensor) -> tuple[float, float]:
    """(entropy, mean_token_accuracy) of the micro-batch from this rank's sums, added over every rank."""
    import torch.distributed as dist

    total = sums.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    entropy, correct, count = total.tolist()
    return (entropy / count, correct / count) if count > 0 else (0.0, 0.0)


def record(trainer, mode: str, seen: TokenSums, inputs: dict) -> None:
    """Append the micro-batch's metrics to the SFTTrainer's ``_metrics[mode]`` as TRL's ``compute_loss`` does (its
    ``log`` averages and logs them)."""
    metrics = trainer._metrics[mode]
    entropy, accuracy = global_ratios(seen.sums)
    metrics["entropy"].append(entropy)
    metrics["mean_token_accuracy"].append(accuracy)
    if mode == "train":
        trainer._total_train_tokens += input_tokens(inputs) // trainer._tp_size
    metrics["num_tokens"] = [trainer._total_train_tokens]
    if trainer.aux_loss_enabled and seen.aux_loss is not None:
        metrics["aux_loss"].append(float(seen.aux_loss))


def input_tokens(inputs: dict) -> int:
    """The batch's input tokens as TRL counts them: its attention_mask's sum, else its position_ids' width (a
    padding-free row). Every rank holds the whole batch of all data-parallel replicas, so nothing is gathered."""
    if "attention_mask" in inputs:
        return int(inputs["attention_mask"].sum())
    if "position_ids" in inputs:
        return int(inputs["position_ids"].size(1))
    raise UsageError("TRL counts num_tokens from the batch's attention_mask or position_ids: the collator must "
                     "return one of them")


__all__ = ["TokenSums", "global_ratios", "input_tokens", "record", "token_sums"]
