"""Bounding a search: an absurd trial count is refused at once, a time budget stops the trials, and a
progress bar shows on a terminal (stderr) and nowhere else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autosp.errors import UsageError
from autosp.planner.api import plan_for
from autosp.planner.request import PlanRequest
from autosp.planner.search.optuna_search import MAX_TRIALS

SCRIPT = Path(sys.executable).with_name("autosp-plan")
REQUEST = ("--model", "llama", "--ctx", "200k", "--hw", "h100x8", "--no-cache")


def test_an_absurd_trial_count_is_a_usage_error_not_a_search_that_never_ends():
    """Regression: --trials 1000000000 started a search that would run for ever."""
    out = subprocess.run([str(SCRIPT), *REQUEST, "--trials", "1000000000"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "--time-budget" in out.stderr and f"{MAX_TRIALS:,}" in out.stderr
    with pytest.raises(UsageError, match="at most"):
        plan_for(PlanRequest(model="llama", ctx="200k", hw="h100x8", trials=MAX_TRIALS + 1))


def test_a_time_budget_stops_the_trials_and_says_so():
    plan = plan_for(PlanRequest(model="llama", ctx="200k", hw="h100x8", time_budget="1s"))
    search = plan.search
    assert search["time_budget_s"] == 1.0
    assert search["stopped_by"].startswith("time budget after")
    assert 0 < search["trials"] < MAX_TRIALS  # without --trials the budget alone decides how many run
    assert plan.estimate.fits
    with pytest.raises(UsageError, match="--time-budget"):
        plan_for(PlanRequest(model="llama", ctx="200k", hw="h100x8", time_budget="soon"))
    with pytest.raises(UsageError, match="exhaustive"):
        plan_for(PlanRequest(model="llama", ctx="200k", hw="h100x8", time_budget=5, search="exhaustive"))


def _stderr_on_a_terminal(args) -> str:
    """Run autosp-plan with stderr on a pseudo-terminal of 100 columns; what it wrote there."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen([str(SCRIPT), *args], stdout=subprocess.DEVNULL, stderr=slave,
                            stdin=subprocess.DEVNULL)
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    proc.wait(timeout=120)
    os.close(master)
    return out.decode(errors="replace")


def test_progress_bar_on_a_terminal_and_only_there():
    args = (*REQUEST, "--trials", "300")
    shown = _stderr_on_a_terminal(args)
    assert "optuna:" in shown and "it/s" in shown, shown[-500:]
    piped = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == ""
