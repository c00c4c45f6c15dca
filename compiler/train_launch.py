"""``autosp-train --nproc-per-node N``: start the N training processes of one machine without a launcher.

Every check that does not need the processes (plan against the launch, heads, data, paths, memory) has
already run once in the parent, so bad input is one line before anything starts. The children are
``multiprocessing`` spawns of the same ``autosp-train`` (without ``--nproc-per-node``) with the
environment torchrun would give them (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT`` on a free loopback port). When one exits with an error, the others are
stopped (they would wait for it in a collective until the process group times out) and its exit code is
returned; its one-line message is already on stderr.

Several machines (``--nnodes K --node-rank R --master-addr HOST --master-port P``): each node runs this
launcher for its ``--nproc-per-node`` ranks; the nodes first meet through torch's static rendezvous
(:mod:`autosp.compiler.multinode`), which also checks that they were launched alike, and rank ``i`` of node
``R`` becomes global rank ``R * nproc_per_node + i`` with the environment torchrun would give it. A rank that
fails on one node stops the ranks of every node (told through the rendezvous store).

Signals. SIGTERM or SIGINT to the launcher is forwarded to every rank (they finish the step, save a checkpoint
when ``--save-dir`` is given, and exit: :mod:`autosp.compiler.training.signals`), and the launcher waits for
them, however long the save takes. The ranks of all nodes agree after every step whether any of them was
signalled, so a signal that reaches one node's launcher (or Slurm's, which reaches every process of the job's
steps) stops every node after the same step.

A rank that fails ends the others (they would wait for it in a collective until the process group times out),
and the launcher says which one and how: a rank killed by SIGKILL is told apart as the kernel's out-of-memory
killer's or another process's by the cgroup's count of that killer's kills (:mod:`autosp.compiler.exit_status`).

Each rank dies with the launcher when the launcher is killed outright (SIGKILL, the OOM killer): on Linux the
kernel sends it SIGKILL (``prctl(PR_SET_PDEATHSIG)``), elsewhere a watchdog thread polls the parent pid.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
from multiprocessing.connection import wait

from autosp.errors import AutospError

__all__ = ["LAUNCH_FLAGS", "free_port", "run_processes", "without_launch_flags"]

STOP_GRACE_S = 10.0
POLL_S = 1.0  # how often a node of a multi-node run asks whether another node failed


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


LAUNCH_FLAGS = ("--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--rdzv-timeout")


def without_launch_flags(argv: list[str]) -> list[str]:
    """``argv`` minus the launch's flags (``--nproc-per-node N``, ``--nnodes K=...``): the children are started
    ranks, which must not start processes again."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in LAUNCH_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in LAUNCH_FLAGS)):
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


def _child(env: dict, threads: int, main, argv: list[str], parent: int) -> None:
    _die_with_parent(parent)
    os.environ.update(env)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    from autosp.guard import run_command

    sys.exit(run_command("autosp-train", main, argv))


def _quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (the ranks share this launcher's) without its warning about the
    semaphores of a rank that was killed: a killed rank cannot release them, and the launcher says it was killed."""
    from multiprocessing import resource_tracker

    quiet = "ignore:resource_tracker:UserWarning"
    if quiet not in sys.warnoptions:
        sys.warnoptions.append(quiet)  # the tracker is started with this interpreter's -W options
    resource_tracker.ensure_running()


def _loopback_env(rank: int, world: int, port: int) -> dict:
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)}


def run_processes(world: int, main, argv: list[str], nodes=None, node_facts: dict | None = None) -> int:
    """Run ``main(argv)`` (autosp-train's, a module-level function: spawn pickles it by name) on ``world``
    local processes, each under :mod:`autosp.guard`; 0 when all succeed, else the first failure's code.
    ``nodes``: this node's :class:`~autosp.compiler.multinode.NodeGroup` when the run spans several
    machines (``node_facts`` is what the nodes compare before any rank starts)."""
    from autosp.compiler import exit_status

    link = None
    if nodes is not None:
        from autosp.compiler.multinode import join

        link = join(nodes, node_facts or {})  # one line on every node when they cannot meet or disagree
        envs = [link.worker_env(local, world) for local in range(world)]
    else:
        port = free_port()
        envs = [_loopback_env(rank, world, port) for rank in range(world)]
    context = multiprocessing.get_context("spawn")
    _quiet_resource_tracker()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // world)
    procs = [context.Process(target=_child, args=(envs[local], threads, main, argv, os.getpid()),
                             name=f"autosp-train-{envs[local]['RANK']}") for local in range(world)]
    oom_before = exit_status.oom_kills()  # to tell the out-of-memory killer's SIGKILL from anyone else's
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
    failed, peer = None, None
    try:
        for proc in procs:
            proc.start()
        running = list(procs)
        while running and peer is None:
            for sentinel in wait([p.sentinel for p in running], timeout=POLL_S if link else None):
                proc = next(p for p in running if p.sentinel == sentinel)
                proc.join()
                running.remove(proc)
                if proc.exitcode and failed is None:
                    failed = proc
                    if link is not None:  # the other nodes' ranks would wait for this one: they stop too
                        link.report_failure(int(envs[procs.index(proc)]["RANK"]), proc.exitcode)
                    if not received or proc.exitcode not in (-received[0], 128 + received[0]):
                        _stop(running)  # a rank failed on its own: the others would wait for it forever
            if link is not None and running and failed is None:
                peer = link.peer_failure()
                if peer is not None:
                    _stop(running)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if link is not None:
            link.finish()
    if peer is not None:
        raise peer
    if failed is None:
        return 0
    if received and failed.exitcode in (-received[0], 128 + received[0]):  # stopped by the forwarded signal
        if received[0] == signal.SIGINT:
            raise KeyboardInterrupt
        print(f"autosp-train: stopped by {exit_status.signal_name(received[0])}", file=sys.stderr, flush=True)
        return 128 + received[0]
    rank = envs[procs.index(failed)]["RANK"]
    if failed.exitcode < 0:  # killed by a signal: nobody printed anything
        how = exit_status.killed_how(failed.exitcode, oom_before, exit_status.oom_kills())
        raise AutospError(f"training process {rank} {how}")
    return failed.exitcode  # the process printed its one line (rank 0 does, for bad input)


def _stop(procs) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(STOP_GRACE_S)
        if proc.is_alive():
            proc.kill()
            proc.join()
