"""autosp-train over several machines (issue 34 item 2), two "nodes" on loopback, each its own autosp-train:
``--nnodes 2 --node-rank 0/1 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port P`` trains exactly as one
node with ``--nproc-per-node 2``; a SIGTERM to every process of one node (its launcher and its ranks, as
Slurm's ``--signal`` reaches a job step's processes) stops both nodes after the same step with a checkpoint; and each bad launch (node rank out of range, node 0 unreachable, nodes started
differently, the plan's world against the launch's) is one line and exit 2 on every node, before any model is
built, with the checkpoints already in --save-dir untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autosp.compiler.exit_status import oom_kills
from autosp.compiler.train_launch import free_port

SCRIPT = str(Path(sys.executable).with_name("autosp-train"))
TINY = ["--model", "llama-3.2-1b", "--layers", "1", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
        "--vocab", "97", "--ctx", "64", "--backend", "aot_eager", "--dtype", "fp32"]
COMPARED_STEPS = 3
TIMEOUT_S = 900


def _env():
    return {**{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                   "LOCAL_WORLD_SIZE")}, "OMP_NUM_THREADS": "1"}


def _node(rank: int, port: int, *args, nproc: int = 1, timeout: int = 120) -> list[str]:
    return [SCRIPT, *TINY, "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(port), "--rdzv-timeout", str(timeout), *args]


def _start(argv):  # in a session of its own: its process group is that node's launcher and ranks
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)


def _steps(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _snapshot(directory: Path) -> dict:
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One node of 2 processes for 3 steps; then two nodes of 1 process with --save-dir, stopped once they have
    logged 3 steps by a SIGTERM to node 1's launcher and rank (each gets it twice: directly and forwarded by the
    launcher) and not to node 0's."""
    out = tmp_path_factory.mktemp("multinode")
    one = subprocess.run([SCRIPT, *TINY, "--sp", "2", "--nproc-per-node", "2", "--steps", str(COMPARED_STEPS),
                          "--log-json", str(out / "one.jsonl")], capture_output=True, text=True, env=_env(),
                         timeout=TIMEOUT_S)
    assert one.returncode == 0, one.stderr[-3000:]
    port, log, ckpt = free_port(), out / "two.jsonl", out / "ckpt"
    common = ("--sp", "2", "--steps", "100000", "--save-dir", str(ckpt))
    nodes = [_start(_node(0, port, *common, "--log-json", str(log))), _start(_node(1, port, *common))]
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while len(_steps(log)) < COMPARED_STEPS and time.monotonic() < deadline:
            if any(n.poll() is not None for n in nodes):
                break
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(nodes[1].pid, signal.SIGTERM)  # one node only: the ranks of both must agree to stop
        results = [n.communicate(timeout=TIMEOUT_S) for n in nodes]
    finally:
        for n in nodes:  # a hung run must not outlive the test
            if n.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(n.pid, signal.SIGKILL)
                n.wait()
    return {"one": _steps(out / "one.jsonl"), "two": _steps(log), "codes": [n.returncode for n in nodes],
            "outputs": results, "ckpt": ckpt, "dir": out}


@pytest.mark.slow
def test_two_nodes_give_the_losses_of_one_node_of_two_processes(runs):
    assert runs["codes"] == [0, 0], [err[-2000:] for _, err in runs["outputs"]]
    one, two = runs["one"], runs["two"][:COMPARED_STEPS]
    assert [s["step"] for s in two] == [1, 2, 3]
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 * abs(a["loss"]), (a["loss"], b["loss"])
    assert "world 2" in runs["outputs"][0][0]


@pytest.mark.slow
def test_sigterm_to_one_node_stops_every_node_after_the_same_step_with_a_checkpoint(runs):
    """Exit 0 on both nodes, one checkpoint of the step both stopped after, and the line saying how to resume."""
    (out0, err0), (out1, err1) = runs["outputs"]
    assert runs["codes"] == [0, 0], (err0[-2000:], err1[-2000:])
    last = runs["two"][-1]["step"]
    stopped = [line for line in out0.splitlines() if line.startswith("autosp-train: stopped by SIGTERM")]
    assert len(stopped) == 1 and f"after step {last};" in stopped[0] and "--resume" in stopped[0], out0[-2000:]
    saved = stopped[0].split("; saved ")[1].split(";")[0]
    assert os.path.isdir(saved) and Path(saved).parent == runs["ckpt"]
    assert "Traceback" not in err0 + err1


def _bad(argvs, timeout=300):
    """Start the nodes' commands together; their (exit code, stderr lines)."""
    procs = [_start(argv) for argv in argvs]
    try:
        errors = [p.communicate(timeout=timeout)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [(p.returncode, err.strip().splitlines()) for p, err in zip(procs, errors)]


def _one_line(code_and_lines, needle):
    code, lines = code_and_lines
    errors = [line for line in lines if line.startswith("autosp-train")]
    assert code == 2 and len(errors) == 1 and needle in errors[0], (code, lines[-20:])
    assert not any("Traceback" in line or "[c10d]" in line for line in lines), lines[-20:]
    return errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["node rank", "no node 0", "node 0 alone", "nodes differ", "plan world"])
def test_a_bad_launch_is_one_line_exit_2_on_every_node_and_keeps_the_checkpoints(runs, case):
    ckpt = runs["ckpt"]
    before = _snapshot(ckpt)
    assert before, "the stopped run saved nothing"
    keep = ("--sp", "2", "--steps", "5", "--save-dir", str(ckpt))
    port = free_port()
    if case == "node rank":
        [result] = _bad([_node(2, port, *keep)])
        _one_line(result, "--node-rank 2 is out of range for --nnodes 2")
    elif case == "no node 0":
        [result] = _bad([_node(1, port, *keep, timeout=2)])
        _one_line(result, f"cannot reach node 0 at 127.0.0.1:{port} within 2 s")
    elif case == "node 0 alone":
        [result] = _bad([_node(0, port, *keep, timeout=2)])
        _one_line(result, "node 0 waited 2 s (--rdzv-timeout)")
    elif case == "nodes differ":  # each launch is consistent on its own; together they are not
        lines = [_one_line(r, "start every node with the same --nnodes and --nproc-per-node") for r in
                 _bad([_node(0, port, *keep, nproc=1), _node(1, port, *keep, nproc=2)])]
        assert lines[0] == lines[1] and "node 1 was started with --nnodes 2 --nproc-per-node 2" in lines[0]
    else:  # a plan of 2 processes launched as 2 nodes of 2: refused on each node before the rendezvous
        from test_compiler_train_cli import write_plan

        from autosp.contract.specs import Candidate

        plan = write_plan(runs["dir"] / "plan.json", Candidate(sp=2, dp=1), seq_len=64)
        argv = [SCRIPT, "--plan", str(plan), "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(port), "--save-dir", str(ckpt), "--steps", "5"]
        [result] = _bad([argv])
        _one_line(result, "needs 2 processes (sp 2 x dp 1) and this launch has 4 (--nnodes 2 x --nproc-per-node 2)")
    assert _snapshot(ckpt) == before


def _rank_of(launcher: subprocess.Popen, timeout: float = 300.0) -> int:
    """The pid of the training process a launcher spawned (multiprocessing's spawn_main), once it exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and launcher.poll() is None:
        for entry in os.listdir("/proc"):
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == launcher.pid and b"spawn_main" in cmdline:
                return int(entry)
        time.sleep(0.1)
    raise AssertionError(f"the launcher started no rank: {launcher.communicate()}")


@pytest.mark.slow
def test_a_rank_that_dies_on_one_node_stops_the_other_node(tmp_path):
    """Node 1's rank is killed: node 1 says so, and node 0 stops its rank instead of leaving it waiting for the
    dead one until the process group times out (30 minutes)."""
    port = free_port()
    nodes = [_start(_node(rank, port, "--sp", "2", "--steps", "100000", timeout=120)) for rank in (0, 1)]
    try:
        os.kill(_rank_of(nodes[1]), signal.SIGKILL)
        errors = [n.communicate(timeout=300)[1] for n in nodes]
    finally:
        for n in nodes:
            if n.poll() is None:
                os.killpg(n.pid, signal.SIGKILL)
                n.wait()
    lines = [[line for line in err.splitlines() if line.startswith("autosp-train")] for err in errors]
    assert [n.returncode for n in nodes] == [1, 1], errors
    # this test's kill is not the out-of-memory killer's, which the node tells when the kernel counts its kills
    how = ("from another process (the kernel's out-of-memory killer did not run)" if oom_kills() is not None
           else "(the kernel does this when host memory runs out)")
    assert lines[1] == [f"autosp-train: error: training process 1 was killed by SIGKILL {how}"], errors[1][-2000:]
    assert "leaked semaphore" not in errors[1], errors[1][-2000:]  # the killed rank's, which it cannot release
    assert lines[0] == ["autosp-train: error: training process 1 on node 1 was killed by SIGKILL (that node's "
                        "output says why); stopped this node's training processes"], errors[0][-2000:]
