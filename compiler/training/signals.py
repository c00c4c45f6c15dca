"""Preemption: SIGTERM or SIGINT during training finishes the current step, saves a checkpoint and exits 0.

A scheduler (Slurm, Kubernetes, ``timeout``) sends SIGTERM and waits a grace period; Ctrl-C sends SIGINT. The
handler only records the signal; the training loop asks :meth:`StopRequest.agreed` after every optimizer step,
which all ranks answer together (one all-reduce of a flag), because the ranks do not receive the signal at the
same moment and must all stop after the same step. A second signal while stopping (the user insists) restores
the default action and re-raises it: the partially written checkpoint is never published (the save is atomic),
so the previous one stays loadable. A repeat within ``DUPLICATE_S`` of the first is the same request arriving
twice (Ctrl-C reaches the ranks from the terminal and again from ``autosp-train --nproc-per-node``'s launcher,
a scheduler signals every process and the launcher forwards) and is ignored.
"""

from __future__ import annotations

import os
import signal
import time

__all__ = ["StopRequest"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)
DUPLICATE_S = 2.0


class StopRequest:
    def __init__(self):
        self.signal: int | None = None
        self._at = 0.0
        self._previous = {}

    def install(self) -> "StopRequest":
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if self.signal is not None and time.monotonic() - self._at < DUPLICATE_S:
            return
        if self.signal is not None:  # the second one: stop now
            self.uninstall()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signal, self._at = signum, time.monotonic()

    @property
    def name(self) -> str:
        from autosp.compiler.exit_status import signal_name

        return signal_name(self.signal) if self.signal is not None else ""

    def agreed(self) -> bool:
        """Whether any rank was asked to stop (the same answer on every rank)."""
        import torch
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size() == 1:
            return self.signal is not None
        flag = torch.tensor([0.0 if self.signal is None else float(self.signal)])
        if dist.get_backend() == "nccl":
            flag = flag.cuda()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and self.signal is None:  # another rank's signal; this rank's own may still come
            self.signal, self._at = int(flag.item()), time.monotonic()
        return bool(flag.item())
