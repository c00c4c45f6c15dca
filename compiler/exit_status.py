"""How a training process ended, in words, for the launcher's one line: the signal that killed it, and whether
the kernel's out-of-memory killer did.

A process killed by SIGKILL says nothing, and SIGKILL comes from the out-of-memory killer as well as from a person
or a scheduler. The kernel counts the processes its out-of-memory killer ends in each memory cgroup (``oom_kill``
in cgroup v2's ``memory.events`` and, since Linux 4.13, in v1's ``memory.oom_control``; the training processes
share their launcher's cgroup), so the launcher reads the count when it starts the ranks and again when one was
killed: a higher count means the out-of-memory killer ran meanwhile.
"""

from __future__ import annotations

import os
import signal

__all__ = ["killed_how", "oom_kills", "signal_name"]

CGROUP_ROOT = "/sys/fs/cgroup"


def signal_name(number: int) -> str:
    return signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"


def _counter_files() -> list[str]:
    """This process's cgroup files that hold the ``oom_kill`` count, most specific first."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    files = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        path = path.lstrip("/")
        if controllers == "":  # cgroup v2
            files += [os.path.join(CGROUP_ROOT, path, "memory.events"), os.path.join(CGROUP_ROOT, "memory.events")]
        elif "memory" in controllers.split(","):  # cgroup v1
            files += [os.path.join(CGROUP_ROOT, "memory", path, "memory.oom_control"),
                      os.path.join(CGROUP_ROOT, "memory", "memory.oom_control")]
    return files


def oom_kills() -> int | None:
    """How many processes of this cgroup the out-of-memory killer has ended (None: the kernel does not say)."""
    for path in _counter_files():
        try:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def killed_how(exitcode: int, oom_before: int | None, oom_after: int | None) -> str:
    """'was killed by SIGKILL (...)' for a process whose exit code is ``exitcode`` (negative: the signal)."""
    name = signal_name(-exitcode)
    if name != "SIGKILL":
        return f"was killed by {name}"
    if oom_before is None or oom_after is None:
        return "was killed by SIGKILL (the kernel does this when host memory runs out)"
    if oom_after > oom_before:
        return ("was killed by SIGKILL from the kernel's out-of-memory killer (host memory ran out: a smaller plan, "
                "or fewer processes per machine)")
    return "was killed by SIGKILL from another process (the kernel's out-of-memory killer did not run)"
