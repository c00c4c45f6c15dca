"""The training loop of ``autosp-train``: optimizer steps over an :class:`~autosp.compiler.runtime.SPEngine`.

:class:`Trainer` runs steps ``start_step + 1 ... steps``; each trains the next G micro-steps of the data
source (G = gradient accumulation), from ``start_micro`` (default ``start_step x G``: a resumed run passes
the index its checkpoint recorded, which differs when the saved plan had another G), each batch a pure
function of the seed and its index, so a resumed run sees the batches the uninterrupted run saw. After
every step it calls each ``hooks`` entry as ``hook(trainer, record)`` (checkpoints, signals) and stops
early when a hook returns True or sets ``trainer.stop``.

The objective of a step is the global token-weighted mean over all its micro-batches: DeepSpeed divides
each micro-step's loss by G, so the loop scales micro-step ``m``'s loss (already the exact global mean
over its ``n_m`` targets) by ``G n_m / N`` (``N`` = the step's targets) before backward. With equal
counts the factor is exactly 1 (the plain DeepSpeed average); with padding or packed documents it keeps
every target's weight equal, as one process summing the step's cross-entropy over N would.
"""

from __future__ import annotations

import time

import torch

from autosp.compiler.data.sources import batch_counts


def as_inputs(batch) -> dict:
    """A source's batch as the engine's keyword arguments (a tensor of ids is its own labels)."""
    return batch if isinstance(batch, dict) else {"input_ids": batch, "labels": batch}


def current_lr(engine) -> float:
    return float(engine.optimizer.param_groups[0]["lr"]) if hasattr(engine.optimizer, "param_groups") \
        else float(engine.ds_engine.get_lr()[0])


def peak_memory() -> tuple[float, str]:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30, "GiB device"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "GiB host RSS"


class Trainer:
    def __init__(self, engine, source, logger, *, steps: int, rows: int, start_step: int = 0, eval_source=None,
                 eval_every: int = 0, eval_steps: int | None = None, hooks=(), start_micro: int | None = None):
        self.engine, self.source, self.logger = engine, source, logger
        self.steps, self.rows, self.step_index = steps, rows, start_step
        self.micro_index = start_step * engine.candidate.grad_accum if start_micro is None else start_micro
        self.eval_source, self.eval_every, self.eval_steps = eval_source, eval_every, eval_steps
        self.hooks = list(hooks)
        self.stop = False
        self.records = []

    @property
    def micro_steps(self) -> int:
        """Micro-steps trained so far (the data position a checkpoint records)."""
        return self.micro_index

    def train_step(self) -> dict:
        engine = self.engine
        accum = engine.candidate.grad_accum
        cuda = torch.cuda.is_available()
        start = time.perf_counter()
        first = self.micro_index
        batches = [as_inputs(self.source.batch(first + m, self.rows)) for m in range(accum)]
        counts = [batch_counts(b) for b in batches]
        targets = sum(n for _, n in counts)
        lr = current_lr(engine)
        total = 0.0
        for batch, (_, n) in zip(batches, counts):
            loss = engine(**batch)
            weight = accum * n / targets if targets else 1.0
            engine.backward(loss * weight if weight != 1.0 else loss)
            engine.step()
            total += float(loss.detach().double().item()) * n
        norm = engine.grad_norm  # the global norm before clipping, experts included (compiler/runtime.py)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        self.step_index += 1
        self.micro_index += accum
        extra = {}
        if self.eval_source is not None and self.eval_every and (
                self.step_index % self.eval_every == 0 or self.step_index == self.steps):
            from autosp.compiler.training.evaluate import evaluate

            result = evaluate(engine, self.eval_source, self.rows, self.eval_steps)
            extra = {"eval_loss": result["eval_loss"], "eval_tokens": result["eval_tokens"]}
        peak, unit = peak_memory()
        return self.logger.record(self.step_index, loss=total / targets if targets else float("nan"), lr=lr,
                                  grad_norm=norm, tokens=sum(t for t, _ in counts), seconds=seconds, peak=peak,
                                  memory=unit, extra=extra)

    def run(self) -> list:
        try:
            while self.step_index < self.steps and not self.stop:
                record = self.train_step()
                self.records.append(record)
                for hook in self.hooks:
                    if hook(self, record):
                        self.stop = True
        finally:
            self.logger.close()
        return self.records


__all__ = ["Trainer", "as_inputs", "current_lr", "peak_memory"]
