"""What ``autosp-train`` reports per optimizer step (rank 0): a console line with an ETA, ``--log-json``
(one JSON object per step) and ``--tensorboard DIR`` (event files, ``torch.utils.tensorboard``).

Fields of a step record, and what they mean:

- ``loss``: the exact global token-weighted mean loss of the step: the sum of the cross-entropy over every
  target of every micro-batch of every DP rank, over their number. It is also the objective trained: the
  loop (:mod:`autosp.compiler.training.loop`) weights each micro-step's loss by its share of the step's
  targets before DeepSpeed averages the gradient-accumulation micro-steps, so uneven padding or document
  cuts across micro-steps and DP ranks never weight a token more than another;
- ``tokens``, ``tokens_per_s``: the real (not padding) tokens of the step's full batches, each counted
  once -- every rank holds the same full batch, so the figure is the same formula at any SP and DP degree
  -- over the step's wall time;
- ``lr`` (the rate this step trained with), ``grad_norm`` (the global gradient norm before clipping;
  None when DeepSpeed computed none), ``step_time_s``, ``peak_memory_gib`` (device memory, or the host
  RSS on CPU) and ``memory`` (which);
- ``mfu``: model FLOPs per token (the cost model's :func:`autosp.cost_models.flops.model_flops` for the
  model this run trains -- the plan's, or what ``--layers``/``--hidden``/... made of it -- at this run's
  sequence length and candidate: 6 x dense parameters + causal attention) x tokens/s over the plan's
  hardware peak x the processes; ``predicted_step_time_s`` and ``predicted_mfu`` are the plan's estimate,
  given only when this run trains the plan's model at the plan's sequence length (a plan priced for 16
  layers says nothing about a 2-layer step). Without a plan there is no hardware peak to divide by: all
  three are None ("n/a" on the console) rather than a figure made up for this machine;
- ``eta_s``: the remaining steps at the mean step time so far (the first step, which compiles, left out
  once there are others);
- ``eval_loss`` (+ ``eval_tokens``) on the steps that evaluated.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

from autosp.errors import UsageError
from autosp.messages import install_hint

SCALARS = ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "step_time_s", "peak_memory_gib", "eval_loss")
"""The record fields written to TensorBoard (as ``train/<field>``; ``eval/loss``), when they have a value."""


def flops_per_token(plan, seq: int, candidate, model=None) -> float | None:
    """Model FLOPs per real token (forward + backward, no recompute) of ``model`` (default: the plan's) at
    ``seq`` tokens per sequence under ``candidate``, from the cost model; None without a plan."""
    if plan is None:
        return None
    from autosp.cost_models.flops import model_flops
    from autosp.cost_models.shapes import Shapes

    workload = dataclasses.replace(plan.workload, seq_len=seq)
    try:
        per_gpu = model_flops(Shapes(model or plan.model, workload, candidate))
    except ValueError:  # heads that do not divide (the run refused it already)
        return None
    return per_gpu * candidate.sp / (seq * candidate.micro_batch)


def _shape(spec) -> dict:
    """A model's fields that its cost depends on (not its name or where its figures came from)."""
    return {k: v for k, v in dataclasses.asdict(spec).items() if k not in ("name", "source")}


def plan_difference(plan, seq: int, model=None) -> str | None:
    """Why the plan's predicted step does not apply to this run (another model shape or sequence length), or
    None when it does (or there is no plan)."""
    if plan is None:
        return None
    trained, planned = (_shape(model), _shape(plan.model)) if model is not None else (None, None)
    if trained != planned:
        changed = [k for k, v in trained.items() if planned.get(k) != v]
        return (f"the plan was priced for {plan.model.name} as planned; this run trains it with "
                f"{', '.join(f'{k}={getattr(model, k)}' for k in changed)}")
    if seq != plan.workload.seq_len:
        return f"the plan was priced for {plan.workload.seq_len} tokens per sequence; this run trains {seq}"
    return None


def check_tensorboard(directory: str | None) -> None:
    """Before any work: the package is there and the directory can be written."""
    if directory is None:
        return
    try:
        import tensorboard  # noqa: F401  - torch.utils.tensorboard needs it
    except ImportError:
        raise UsageError(f"--tensorboard needs the tensorboard package: {install_hint('train')}") from None
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise UsageError(f"--tensorboard {directory} is not a directory")
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".autosp-probe-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as err:
        raise UsageError(f"cannot write --tensorboard {directory}: {err.strerror or err}") from None


def _fmt_time(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class StepLogger:
    """Rank 0's step reports. ``plan``: the loaded plan or None; ``world``: the processes."""

    def __init__(self, *, steps: int, seq: int, candidate, plan=None, world: int = 1, log_json: str | None = None,
                 tensorboard: str | None = None, rank: int = 0, print_fn=print, model=None):
        """``model``: the ModelSpec this run trains, when it may differ from the plan's (``--layers`` etc.)."""
        self.steps, self.rank, self.print = steps, rank, print_fn
        self.log_json, self.records, self.times = log_json, [], []
        self.flops_per_token = flops_per_token(plan, seq, candidate, model)
        self.peak_flops = plan.hardware.accelerator.peak_flops * world if plan is not None else None
        self.plan_difference = plan_difference(plan, seq, model)
        estimate = getattr(plan, "estimate", None) if self.plan_difference is None else None
        self.predicted_step = estimate.time.step if estimate is not None and estimate.time.step > 0 else None
        self.predicted_mfu = estimate.mfu if estimate is not None and estimate.mfu > 0 else None
        self.writer = None
        if tensorboard and rank == 0:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=tensorboard)

    def mfu(self, tokens_per_s: float) -> float | None:
        if self.flops_per_token is None or not self.peak_flops:
            return None
        return self.flops_per_token * tokens_per_s / self.peak_flops

    def eta(self, step: int, seconds: float) -> float:
        self.times.append(seconds)
        timed = self.times[1:] if len(self.times) > 1 else self.times
        return sum(timed) / len(timed) * (self.steps - step)

    def record(self, step: int, *, loss: float, lr: float, grad_norm, tokens: int, seconds: float, peak: float,
               memory: str, extra: dict | None = None) -> dict:
        """The step's record (every rank computes it; rank 0 prints and writes it)."""
        tps = tokens / seconds if seconds > 0 else 0.0
        rec = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens": tokens,
               "tokens_per_s": tps, "step_time_s": seconds, "mfu": self.mfu(tps),
               "predicted_step_time_s": self.predicted_step, "predicted_mfu": self.predicted_mfu,
               "peak_memory_gib": peak, "memory": memory, "eta_s": self.eta(step, seconds)}
        rec.update(extra or {})
        if self.rank == 0:
            self.print(self.line(rec), flush=True)
            self._write(rec)
        return rec

    def line(self, r: dict) -> str:
        def pct(x):
            return "n/a" if x is None else f"{100 * x:.1f}%"

        plan = "" if self.predicted_step is None else f" (plan {pct(self.predicted_mfu)}, {self.predicted_step:.3g} s)"
        norm = "n/a" if r["grad_norm"] is None else f"{r['grad_norm']:.3g}"
        text = (f"step {r['step']:>{len(str(self.steps))}}/{self.steps}  loss {r['loss']:.4f}  lr {r['lr']:.3g}  "
                f"grad norm {norm}  {r['step_time_s']:.3f} s  {r['tokens_per_s']:,.0f} tokens/s  "
                f"MFU {pct(r['mfu'])}{plan}  peak {r['peak_memory_gib']:.2f} {r['memory']}  ETA {_fmt_time(r['eta_s'])}")
        if "eval_loss" in r:
            text += f"  eval loss {r['eval_loss']:.4f}"
        return text

    def _write(self, rec: dict) -> None:
        if self.log_json:
            from autosp.files import write_text

            self.records.append(rec)
            # the whole log, replaced atomically: a reader never sees half a line
            write_text(self.log_json, "".join(json.dumps(r) + "\n" for r in self.records), "--log-json")
        if self.writer is not None:
            for name in SCALARS:
                value = rec.get(name)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    tag = "eval/loss" if name == "eval_loss" else f"train/{name}"
                    self.writer.add_scalar(tag, value, rec["step"])
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


__all__ = ["SCALARS", "StepLogger", "check_tensorboard", "flops_per_token", "plan_difference"]
