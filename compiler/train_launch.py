"""``autosp-train --nproc-per-node N``: start the N training processes of one machine without a launcher.

Every check that does not need the processes (plan against the launch, heads, data, paths, memory) has
already run once in the parent, so bad input is one line before anything starts. The children are
``multiprocessing`` spawns of the same ``autosp-train`` (without ``--nproc-per-node``) with the
environment torchrun would give them (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT`` on a free loopback port). When one exits with an error, the others are
stopped (they would wait for it in a collective until the process group times out) and its exit code is
returned; its one-line message is already on stderr. Several machines: use torchrun.

Signals. SIGTERM or SIGINT to the launcher is forwarded to every rank (they finish the step, save a checkpoint
when ``--save-dir`` is given, and exit: :mod:`autosp.compiler.training.signals`), and the launcher waits for
them. Each rank dies with the launcher when the launcher is killed outright (SIGKILL, the OOM killer): on Linux
the kernel sends it SIGKILL (``prctl(PR_SET_PDEATHSIG)``), elsewhere a watchdog thread polls the parent pid.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
from multiprocessing.connection import wait

from autosp.errors import AutospError

__all__ = ["free_port", "run_processes", "without_nproc_flag"]

STOP_GRACE_S = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def without_nproc_flag(argv: list[str]) -> list[str]:
    """``argv`` minus ``--nproc-per-node N`` / ``--nproc-per-node=N`` (the children must not spawn again)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc-per-node":
            skip = True
        elif not arg.startswith("--nproc-per-node="):
            out.append(arg)
    return out


def _die_with_parent(parent: int) -> None:
    """Make this process end when ``parent`` (the launcher) does, however it ends."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    else:
        import threading
        import time

        def watch():
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="autosp-parent-watchdog", daemon=True).start()
    if os.getppid() != parent:  # the launcher died before the request took effect
        os._exit(1)


def _child(rank: int, world: int, port: int, threads: int, main, argv: list[str], parent: int) -> None:
    _die_with_parent(parent)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    from autosp.guard import run_command

    sys.exit(run_command("autosp-train", main, argv))


def run_processes(world: int, main, argv: list[str]) -> int:
    """Run ``main(argv)`` (autosp-train's, a module-level function: spawn pickles it by name) on ``world``
    local processes, each under :mod:`autosp.guard`; 0 when all succeed, else the first failure's code."""
    context = multiprocessing.get_context("spawn")
    port = free_port()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // world)
    procs = [context.Process(target=_child, args=(rank, world, port, threads, main, argv, os.getpid()),
                             name=f"autosp-train-{rank}") for rank in range(world)]
    received = []

    def forward(signum, frame):  # the ranks decide what a signal means (finish the step, save, exit)
        received.append(signum)
        for proc in procs:
            if proc.pid is not None and proc.exitcode is None:
                try:
                    os.kill(proc.pid, signum)
                except ProcessLookupError:
                    pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    failed = None
    try:
        for proc in procs:
            proc.start()
        running = list(procs)
        while running:
            for sentinel in wait([p.sentinel for p in running]):
                proc = next(p for p in running if p.sentinel == sentinel)
                proc.join()
                running.remove(proc)
                if proc.exitcode and failed is None:
                    failed = proc
                    if not received or proc.exitcode not in (-received[0], 128 + received[0]):
                        _stop(running)  # a rank failed on its own: the others would wait for it forever
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed is None:
        return 0
    if received and failed.exitcode in (-received[0], 128 + received[0]):  # stopped by the forwarded signal
        if received[0] == signal.SIGINT:
            raise KeyboardInterrupt
        print(f"autosp-train: stopped by {signal.Signals(received[0]).name}", file=sys.stderr, flush=True)
        return 128 + received[0]
    if failed.exitcode < 0:  # killed by a signal: nobody printed anything
        name = signal.Signals(-failed.exitcode).name if -failed.exitcode in signal.valid_signals() else "?"
        raise AutospError(f"training process {procs.index(failed)} was killed by {name}"
                          + (" (the kernel does this when host memory runs out)" if name == "SIGKILL" else ""))
    return failed.exitcode  # the process printed its one line


def _stop(procs) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(STOP_GRACE_S)
        if proc.is_alive():
            proc.kill()
            proc.join()
