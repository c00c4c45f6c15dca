"""Shared fixtures.

``pg_url``: a fresh, empty PostgreSQL database for one test (an SQLAlchemy URL, psycopg 3), dropped
afterwards. The server comes from ``$AUTOSP_TEST_PG_URL`` (``.ci/run`` starts a throwaway one and sets
it; its user must be allowed to create databases), else this session starts its own throwaway server
with ``.ci/pg-server`` when PostgreSQL's binaries are installed. Without either the test is skipped,
except under ``AUTOSP_CI=1`` (what ``.ci/run`` sets), where a missing server is a failure: CI never
skips the PostgreSQL tests silently.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

PG_SERVER = Path(__file__).resolve().parent.parent / ".ci" / "pg-server"


def _unavailable(why: str):
    if os.environ.get("AUTOSP_CI") == "1":
        pytest.fail(f"PostgreSQL tests cannot run in CI: {why}", pytrace=False)
    pytest.skip(f"no PostgreSQL: {why} (set AUTOSP_TEST_PG_URL, or install PostgreSQL; see README)")


@pytest.fixture(scope="session")
def pg_server():
    """The server URL (an admin database on it), or a skip / failure as the module doc says."""
    url = os.environ.get("AUTOSP_TEST_PG_URL")
    if url:
        yield url
        return
    if os.environ.get("AUTOSP_CI") == "1":
        _unavailable("AUTOSP_CI=1 but AUTOSP_TEST_PG_URL is unset (.ci/run sets it)")
    try:
        # with our pid: the server stops itself if this session is killed before its finally runs
        out = subprocess.run(["bash", str(PG_SERVER), "start", str(os.getpid())], capture_output=True, text=True,
                             timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        _unavailable(f"could not start one with .ci/pg-server ({err})")
    if out.returncode != 0:
        _unavailable(f"could not start one with .ci/pg-server ({out.stderr.strip().splitlines()[-1:]})")
    url, directory = out.stdout.split()[:2]
    try:
        yield url
    finally:
        subprocess.run(["bash", str(PG_SERVER), "stop", directory], capture_output=True, timeout=120)


@pytest.fixture
def pg_url(pg_server):
    """A fresh database on the test server, dropped after the test."""
    import sqlalchemy as sa

    admin = sa.create_engine(pg_server, isolation_level="AUTOCOMMIT")
    name = f"autosp_t_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(pg_server).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# The longest test files, longest first (seconds of their slowest tests in a run of the whole suite on 2 workers
# on a shared 2-core machine, Dec 2026). pytest-xdist hands whole files to its two workers in collection order
# (pyproject's --no-loadscope-reorder), so these start first and the files still running when the other worker
# runs dry are short ones; xdist's own order (files with the most tests first) left single-test files of
# minutes, like the checkpoint CLI's, and tests/project's (alphabetically last) to the end.
# A file missing from the list only runs later; tests/project/test_test_order.py checks every path exists.
LONGEST_FIRST = (
    "tests/compiler/test_checkpoint_cli.py",         # 199-356 s, one test (five autosp-train launches)
    "tests/compiler/test_compiler_ring.py",          # 300 s (one world-4 job, the autosp-train/--measure runs)
    "tests/compiler/test_compiler_packed.py",        # 287 s (one world-4 job)
    "tests/compiler/test_compiler_exact.py",         # 275 s (world-2 and world-4 jobs)
    "tests/planner/test_pins_every_strategy.py",     # 262 s
    "tests/compiler/test_compiler_families.py",      # 222 s (MoE, world-2 and world-4 jobs)
    "tests/hf/test_hf_trainers.py",                  # 218 s, one test
    "tests/planner/test_search.py",                  # 188 s
    "tests/compiler/test_chunked_layers.py",         # 160 s
    "tests/compiler/test_compiler_knobs_tiling.py",  # 145 s
    "tests/project/test_gpu_check.py",               # 144 s
    "tests/compiler/test_compiler_knobs_ckpt.py",    # 137 s
    "tests/examples/test_examples.py",               # 101 s, one test
    "tests/project/test_bad_inputs.py",              # 57 s its slowest case, many cases
    "tests/compiler/test_checkpoint_api.py",         # 67 s
    "tests/planner/test_ring_planner.py",            # 61 s
    "tests/planner/test_sweep.py",                   # 49 s
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}

    def place(item):
        try:
            return rank.get(item.path.relative_to(config.rootpath).as_posix(), len(rank))
        except ValueError:  # a test outside the repository (never in CI)
            return len(rank)

    items.sort(key=place)  # stable: the tests of a file, and the other files, keep their order
