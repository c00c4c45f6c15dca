"""The optimizer and its learning-rate schedule (``autosp-train --lr --min-lr --warmup --lr-schedule
--weight-decay --grad-clip``; ``autosp.CompileOptions(optim=OptimizerOptions(...))``).

The optimizer is torch's AdamW (no CUDA extension to build), or DeepSpeed's AdamW when ZeRO-Offload runs
the step on the host (:mod:`autosp.compiler.api`). The schedule is a torch ``LambdaLR`` whose factor is
the :class:`LRFactor` object below; it is handed to ``deepspeed.initialize(lr_scheduler=...)`` as a
callable of the optimizer, so DeepSpeed steps it at every gradient-accumulation boundary (never on a
skipped step) and saves its state in its checkpoints (``LambdaLR.state_dict`` keeps a callable object's
fields, unlike a plain function's).

Optimizer step ``s`` (0-based: the first step trains with factor(0)) of ``total`` steps, ``warmup`` W:

- warmup (``s < W``): ``lr * (s + 1) / W`` -- the first step trains at ``lr / W``, never at 0, and step
  ``W - 1`` reaches ``lr``;
- then ``p = (s - W) / max(1, total - W - 1)`` runs from 0 at step W to 1 at the last step:
  ``constant``: ``lr``; ``linear``: ``min_lr + (lr - min_lr) * (1 - p)``; ``cosine``:
  ``min_lr + (lr - min_lr) * (1 + cos(pi p)) / 2``. The last step trains at ``min_lr``.

Weight decay: AdamW's decoupled decay on every parameter (torch's default 0.01 unless given).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autosp.errors import UsageError

SCHEDULES = ("constant", "linear", "cosine")
DEFAULT_WEIGHT_DECAY = 0.01
"""torch.optim.AdamW's own default, kept so runs made before the flag existed train the same."""


@dataclass(frozen=True)
class OptimizerOptions:
    """What ``CompileOptions(optim=...)`` builds: AdamW(lr, weight_decay) and the schedule over
    ``total_steps`` optimizer steps (needed by linear and cosine; constant ignores it)."""

    lr: float = 1e-4
    min_lr: float = 0.0
    warmup: int = 0
    schedule: str = "constant"
    total_steps: int | None = None
    weight_decay: float = DEFAULT_WEIGHT_DECAY

    def __post_init__(self):
        for name in ("lr", "min_lr", "weight_decay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise UsageError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.lr <= 0:
            raise UsageError(f"lr must be positive, got {self.lr!r}")
        if self.min_lr > self.lr:
            raise UsageError(f"min_lr {self.min_lr:g} is above lr {self.lr:g}")
        if self.schedule not in SCHEDULES:
            raise UsageError(f"the learning-rate schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise UsageError(f"warmup must be a whole number of steps >= 0, got {self.warmup!r}")
        if self.total_steps is not None and (not isinstance(self.total_steps, int) or self.total_steps < 1):
            raise UsageError(f"total_steps must be a positive integer, got {self.total_steps!r}")
        if self.schedule != "constant" and self.total_steps is None:
            raise UsageError(f"the {self.schedule} schedule decays over total_steps: give total_steps=")
        if self.total_steps is not None and self.warmup > self.total_steps:
            raise UsageError(f"warmup {self.warmup} is longer than the {self.total_steps} steps of the run")

    def factor(self) -> "LRFactor":
        return LRFactor(self.schedule, self.warmup, self.total_steps or 1, self.min_lr / self.lr)


@dataclass
class LRFactor:
    """The multiplier of ``lr`` at optimizer step ``s`` (LambdaLR calls it with its step count). A callable
    object, not a lambda, so ``LambdaLR.state_dict()`` (and with it DeepSpeed's checkpoint) records it."""

    schedule: str
    warmup: int
    total: int
    min_ratio: float

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if self.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup - 1))
        shape = 1.0 - progress if self.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_ratio + (1.0 - self.min_ratio) * shape


def learning_rate(options: OptimizerOptions, step: int) -> float:
    """The learning rate optimizer step ``step`` (0-based) trains with."""
    return options.lr * options.factor()(step)


def make_optimizer(options: OptimizerOptions, params):
    import torch

    return torch.optim.AdamW(params, lr=options.lr, weight_decay=options.weight_decay)


def scheduler_factory(options: OptimizerOptions):
    """``optimizer -> LambdaLR``: what ``deepspeed.initialize(lr_scheduler=...)`` takes (DeepSpeed calls
    it with the optimizer it actually steps, its own when it built one)."""

    def make(optimizer):
        import torch

        return torch.optim.lr_scheduler.LambdaLR(optimizer, options.factor())

    return make


__all__ = ["DEFAULT_WEIGHT_DECAY", "LRFactor", "OptimizerOptions", "SCHEDULES", "learning_rate", "make_optimizer",
           "scheduler_factory"]
