"""``autosp-train --nnodes K --node-rank R --master-addr HOST --master-port P``: the nodes of one run find each
other through torchrun's static rendezvous (``torch.distributed.elastic``'s ``static`` handler: node 0 hosts a
TCPStore at HOST:P, the others connect to it), agree that they were started alike, and the store then serves
as the training ranks' process-group store, as it does under ``torchrun --node-rank R --master-addr HOST
--master-port P`` (``TORCHELASTIC_USE_AGENT_STORE``).

Why not torchrun's agent itself: after a SIGTERM it gives the ranks ``shutdown_timeout`` seconds (30 by default,
``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``) and then kills them, and its failures come as a table of tracebacks; autosp-train's launcher waits for a rank that is
saving a checkpoint and says one line. The rendezvous, the store and the ranks' environment are torch's.

What the nodes check before any rank starts (each a one-line :class:`~autosp.errors.UsageError` on every
node, exit 2): node 0 is reachable within ``--rdzv-timeout`` seconds (and the others join node 0 in that
time), no two nodes share a ``--node-rank``, and every node has the same ``--nnodes``, ``--nproc-per-node``
and plan. While the ranks run, a node whose rank fails says so in the store and the other nodes stop theirs,
instead of leaving them waiting in a collective until the process group times out.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import dataclass

from autosp.compiler.exit_status import signal_name
from autosp.errors import AutospError, UsageError

__all__ = ["DEFAULT_PORT", "DEFAULT_TIMEOUT_S", "NodeGroup", "NodeLink", "PeerFailure", "join"]

DEFAULT_PORT = 29500  # torchrun's --master-port default
DEFAULT_TIMEOUT_S = 600  # torch's static rendezvous default
RUN_ID = "autosp-train"
ACK_WAIT_S = 30.0  # node 0 keeps the store up this long for the others to read a refusal
DONE_WAIT_S = 60.0  # ... and at the end for them to see a failure and stop their ranks
POLL_S = 0.05


@dataclass(frozen=True)
class NodeGroup:
    """This node's place in a run over ``nnodes`` machines (the flags torchrun users know)."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int = DEFAULT_PORT
    timeout_s: int = DEFAULT_TIMEOUT_S

    @property
    def endpoint(self) -> str:
        return f"{self.master_addr}:{self.master_port}"

    def flags(self) -> str:
        return f"--nnodes {self.nnodes} --master-addr {self.master_addr} --master-port {self.master_port}"


@contextlib.contextmanager
def _quiet_stderr():
    """Hide what torch's C++ store logs on file descriptor 2 while it connects (a warning per retry, a stack
    trace on a timeout): the user reads autosp's one line instead."""
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all
        yield
        return
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__


def _rendezvous_error(err: BaseException, group: NodeGroup) -> UsageError:
    text = str(err)
    where, wait = group.endpoint, f"{group.timeout_s} s (--rdzv-timeout)"
    if group.node_rank == 0:
        joined = re.search(r"(\d+)/(\d+) clients joined", text)
        if joined:
            came = int(joined.group(1)) - 1
            return UsageError(f"node 0 waited {wait} at {where} for the other {group.nnodes - 1} node(s) and {came} "
                              f"joined: start each of them with {group.flags()} and its own --node-rank "
                              f"1..{group.nnodes - 1}")
        if "address already in use" in text.lower() or "eaddrinuse" in text.lower():
            return UsageError(f"node 0 cannot listen on port {group.master_port}: it is in use (by another program or "
                              "an earlier run); pick a free --master-port on every node")
    elif "timed out" in text.lower() or "connect" in text.lower():
        return UsageError(f"cannot reach node 0 at {where} within {wait}: start node 0 (--node-rank 0) on "
                          f"{group.master_addr}, or check --master-addr, --master-port and that the port is open "
                          "between the nodes")
    return UsageError(f"the rendezvous of the nodes at {where} failed: {_first_line(err)}")


def _mismatch(facts: dict, mine: dict, rank: int) -> str | None:
    """Why node ``rank``'s launch (``facts``) cannot train with node 0's (``mine``), or None."""
    if (facts["nnodes"], facts["nproc_per_node"]) != (mine["nnodes"], mine["nproc_per_node"]):
        return (f"node {rank} was started with --nnodes {facts['nnodes']} --nproc-per-node {facts['nproc_per_node']} "
                f"(world {facts['nnodes'] * facts['nproc_per_node']}) and node 0 with --nnodes {mine['nnodes']} "
                f"--nproc-per-node {mine['nproc_per_node']} (world {mine['nnodes'] * mine['nproc_per_node']}): start "
                "every node with the same --nnodes and --nproc-per-node")
    if facts["plan"] != mine["plan"]:
        return (f"node {rank} trains {facts['plan']} and node 0 {mine['plan']}: give every node the same --plan (or "
                "--sp, --ring, --zero, --micro-batch, --grad-accum) and --ctx")
    return None


class PeerFailure(AutospError):
    """Another node's rank failed (or node 0 went away): this node's ranks were stopped."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class NodeLink:
    """This node's connection to the run's store (node 0 hosts it): the ranks' environment, and failures and
    the end of the run, told between the nodes' launchers."""

    def __init__(self, group: NodeGroup, store, handler):
        self.group, self.store, self._handler = group, store, handler  # the handler keeps node 0's store alive

    def worker_env(self, local_rank: int, nproc: int) -> dict:
        """What torchrun gives rank ``local_rank`` of this node, with the process group's store this one."""
        g = self.group
        return {"RANK": str(g.node_rank * nproc + local_rank), "WORLD_SIZE": str(g.nnodes * nproc),
                "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(g.node_rank),
                "GROUP_WORLD_SIZE": str(g.nnodes), "MASTER_ADDR": g.master_addr, "MASTER_PORT": str(g.master_port),
                "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
                "TORCHELASTIC_RUN_ID": RUN_ID}

    def report_failure(self, rank: int, exitcode: int) -> None:
        """Rank ``rank`` of this node ended with ``exitcode`` (negative: killed by that signal)."""
        with contextlib.suppress(Exception):  # the store may be gone with node 0: nothing left to tell
            self.store.set("failed", json.dumps({"node": self.group.node_rank, "rank": rank, "code": exitcode}))

    def peer_failure(self) -> PeerFailure | None:
        """Another node's failed rank, or node 0 gone, as the error this node ends with; None while all is well."""
        try:
            if not self.store.check(["failed"]):
                return None
            report = json.loads(self.store.get("failed"))
        except Exception:  # noqa: BLE001 - any store error here means node 0's launcher (and its store) is gone
            return PeerFailure(f"lost node 0 at {self.group.endpoint} (its autosp-train stopped); stopped this "
                               "node's training processes", 1)
        code = report["code"]
        how = f"was killed by {signal_name(-code)}" if code < 0 else f"exited with code {code}"
        return PeerFailure(f"training process {report['rank']} on node {report['node']} {how} (that node's output says "
                           "why); stopped this node's training processes", code if 0 < code < 128 else 1)

    def finish(self) -> None:
        """The end of this node's ranks: the others are told; node 0 keeps the store up until they know."""
        if self.group.node_rank:
            with contextlib.suppress(Exception):
                self.store.add("done", 1)
            return
        deadline = time.monotonic() + DONE_WAIT_S
        while self.store.add("done", 0) < self.group.nnodes - 1 and time.monotonic() < deadline:
            time.sleep(POLL_S * 4)


def _agree(store, group: NodeGroup, facts: dict) -> str | None:
    """Every node publishes its launch; node 0 compares them and publishes the verdict, which every node reads
    (node 0 keeps its store up until they have). Returns the refusal, or None."""
    from datetime import timedelta

    rank, nnodes = group.node_rank, group.nnodes
    duplicate = store.add(f"joined/{rank}", 1) > 1
    if not duplicate:
        store.set(f"node/{rank}", json.dumps(facts))
    if rank == 0:
        others = [f"node/{r}" for r in range(1, nnodes)]
        try:
            store.wait(others, timedelta(seconds=group.timeout_s))
            verdict = next((why for r in range(1, nnodes)
                            if (why := _mismatch(json.loads(store.get(f"node/{r}")), facts, r))), None)
        except Exception:  # noqa: BLE001 - a rank never reported: torch raises its store timeout
            missing = [str(r) for r in range(1, nnodes) if not store.check([f"node/{r}"])]
            verdict = (f"no node joined {group.endpoint} as --node-rank {', '.join(missing)} within "
                       f"{group.timeout_s} s (--rdzv-timeout): give every node its own --node-rank 0..{nnodes - 1}")
        store.set("verdict", verdict or "")
        deadline = time.monotonic() + min(ACK_WAIT_S, group.timeout_s)
        while store.add("acks", 0) < nnodes - 1 and time.monotonic() < deadline:
            time.sleep(POLL_S)
    else:
        try:  # node 0 may itself wait --rdzv-timeout for a late node before it answers
            store.wait(["verdict"], timedelta(seconds=2 * group.timeout_s + ACK_WAIT_S))
        except Exception:  # noqa: BLE001 - torch's store timeout
            return (f"node 0 at {group.endpoint} accepted this node but never said whether the nodes agree; is "
                    "its autosp-train still running?")
        verdict = store.get("verdict").decode() or None
        store.add("acks", 1)
    if duplicate:
        return (f"another node already joined {group.endpoint} as --node-rank {rank}: give every node its own "
                f"--node-rank 0..{nnodes - 1}")
    return verdict


def join(group: NodeGroup, facts: dict) -> NodeLink:
    """Meet the other nodes (torch's static rendezvous) and check that they launched the same run; one line
    (UsageError) on every node otherwise. ``facts``: this node's ``nnodes``, ``nproc_per_node`` and ``plan``."""
    from torch.distributed import DistError
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import create_rdzv_handler

    params = RendezvousParameters(backend="static", endpoint=group.endpoint, run_id=RUN_ID, min_nodes=group.nnodes,
                                  max_nodes=group.nnodes, rank=group.node_rank, timeout=group.timeout_s)
    handler = create_rdzv_handler(params)
    with _quiet_stderr():
        try:
            store = handler.next_rendezvous().store
            refusal = _agree(store, group, facts)
        except DistError as err:
            raise _rendezvous_error(err, group) from None
    if refusal:
        raise UsageError(refusal)
    return NodeLink(group, store, handler)
