"""Issue 19, item 11: the throwaway PostgreSQL server of a test session dies with the session, even when the
session is killed (``timeout`` sends SIGTERM, then SIGKILL) before its fixture can stop the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PG_SERVER = Path(__file__).resolve().parents[2] / ".ci" / "pg-server"


@pytest.mark.slow  # initdb and a server start: a few seconds
def test_server_stops_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        out = subprocess.run(["bash", str(PG_SERVER), "start", str(parent.pid)], capture_output=True, text=True,
                             timeout=120)
        if out.returncode != 0 and "no PostgreSQL binaries" in out.stderr and os.environ.get("AUTOSP_CI") != "1":
            pytest.skip("no PostgreSQL binaries (.ci/pg-server install)")
        assert out.returncode == 0, out.stderr
        url, directory = out.stdout.split()[:2]
        pid_file = os.path.join(directory, "data", "postmaster.pid")
        assert os.path.exists(pid_file)
        postmaster = int(open(pid_file).read().split()[0])
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (os.path.isdir(directory) or _alive(postmaster)):
            time.sleep(0.5)
        assert not os.path.isdir(directory) and not _alive(postmaster), "the server outlived its parent"
    finally:
        parent.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
