"""A local cache of plans, so that asking the same question twice costs no search.

Where: ``$AUTOSP_CACHE`` if set, else ``$XDG_CACHE_HOME/autosp/plans.sqlite``, else
``~/.cache/autosp/plans.sqlite``; ``autosp-plan --cache PATH`` picks a file, ``--no-cache`` turns it off.

What: the key is a SHA-256 of everything the answer depends on (:func:`request_key`): the model and
hardware fingerprints, the workload, the objective, the search settings, the search-space version, the
autosp version and a hash of the planner's and cost model's source files (so a changed formula never
returns a stale plan, even between releases). The value is the plan JSON.

Robustness: a file that is not a SQLite database, or one with a foreign schema, is moved aside to
``<path>.corrupt-<UTC timestamp>`` with one warning on stderr and rebuilt. A row whose plan no longer
parses is dropped and treated as a miss. Writers use short transactions with a busy timeout, so
concurrent ``autosp-plan`` processes are safe. A cache that cannot be opened at all (read-only
directory, ...) turns itself off with one warning: caching never makes planning fail.

Storage sits behind :class:`PlanStore` (``get``/``put``/``close``); :func:`open_store` picks the
backend from the location, so a SQLAlchemy/PostgreSQL store can slot in for ``postgresql://`` URLs.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

SCHEMA = 1
_TABLE_SQL = ("CREATE TABLE IF NOT EXISTS plans (key TEXT PRIMARY KEY, created_at TEXT NOT NULL, "
              "autosp_version TEXT NOT NULL, request TEXT NOT NULL, plan TEXT NOT NULL)")
_COLUMNS = ["key", "created_at", "autosp_version", "request", "plan"]
BUSY_TIMEOUT_S = 30.0

_warned: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        print(f"autosp-plan: warning: {message}", file=sys.stderr)


def default_cache_path() -> Path:
    override = os.environ.get("AUTOSP_CACHE")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autosp" / "plans.sqlite"


def _source_hash() -> str:
    """Hash of the planner and cost-model sources the answer depends on."""
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for folder in (here, here.parent / "cost_models"):
        for path in sorted(folder.glob("*.py")):
            if path.name in ("cli.py", "report.py", "cache.py", "ds_config.py"):
                continue  # presentation only
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def request_key(request: dict) -> str:
    """The cache key of a request description (a JSON-able dict), with code versions mixed in."""
    from autosp.version import __version__

    payload = {"request": request, "autosp_version": __version__, "code": _source_hash(), "cache_schema": SCHEMA}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


class PlanStore:
    """Where cached plans live. Implementations must never raise for storage trouble on ``get``."""

    location: str = ""

    def get(self, key: str) -> str | None:  # pragma: no cover - interface
        raise NotImplementedError

    def put(self, key: str, plan_json: str, request: dict) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def delete(self, key: str) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Corrupt(Exception):
    pass


class SQLitePlanStore(PlanStore):
    """One SQLite file; one connection per store, short transactions, busy timeout for concurrency."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()
        self.location = str(self.path)
        self._conn: sqlite3.Connection | None = None
        self.disabled = False
        self._open()

    # -- opening, validating, recovering -------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        return conn

    def _validate(self, conn: sqlite3.Connection) -> None:
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as err:
            raise _Corrupt(str(err)) from None
        if not tables:
            with _transaction(conn):
                # Re-check inside the write lock: another process may have created it meanwhile.
                if not conn.execute("SELECT 1 FROM sqlite_master WHERE type='table'").fetchone():
                    conn.execute(_TABLE_SQL)
                    conn.execute(f"PRAGMA user_version = {SCHEMA}")
            return self._validate(conn)
        if version != SCHEMA or "plans" not in tables:
            raise _Corrupt(f"unexpected schema (user_version {version}, tables {sorted(tables)})")
        columns = [row[1] for row in conn.execute("PRAGMA table_info(plans)")]
        if columns != _COLUMNS:
            raise _Corrupt(f"unexpected columns {columns}")

    def _move_aside(self, why: str) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        try:
            os.replace(self.path, target)
            for suffix in ("-journal", "-wal", "-shm"):
                side = Path(str(self.path) + suffix)
                if side.exists():
                    os.replace(side, Path(str(target) + suffix))
        except FileNotFoundError:
            pass  # another process already moved it
        warn_once(f"plan cache {self.path} was unreadable ({why}); moved it to {target.name} and started afresh")

    def _open(self) -> None:
        for attempt in range(2):
            conn = None
            try:
                conn = self._connect()
                self._validate(conn)
                self._conn = conn
                return
            except _Corrupt as err:
                if conn is not None:
                    conn.close()
                if attempt == 0:
                    self._move_aside(str(err))
                    continue
                self._disable(str(err))
                return
            except (sqlite3.Error, OSError) as err:
                if conn is not None:
                    conn.close()
                if attempt == 0 and isinstance(err, sqlite3.DatabaseError) and not isinstance(
                        err, sqlite3.OperationalError):
                    self._move_aside(str(err))
                    continue
                self._disable(str(err))
                return

    def _disable(self, why: str) -> None:
        self.disabled = True
        self._conn = None
        warn_once(f"plan cache {self.path} is unusable ({why}); planning without a cache")

    # -- the interface ---------------------------------------------------------------------------
    def get(self, key: str) -> str | None:
        if self._conn is None:
            return None
        try:
            row = self._conn.execute("SELECT plan FROM plans WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as err:
            self._disable(str(err))
            return None
        return row[0] if row else None

    def put(self, key: str, plan_json: str, request: dict) -> None:
        if self._conn is None:
            return
        from autosp.version import __version__

        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        try:
            with _transaction(self._conn):
                self._conn.execute("INSERT OR REPLACE INTO plans VALUES (?, ?, ?, ?, ?)",
                                   (key, created, __version__, json.dumps(request, sort_keys=True), plan_json))
        except sqlite3.Error as err:
            self._disable(str(err))

    def delete(self, key: str) -> None:
        if self._conn is None:
            return
        try:
            with _transaction(self._conn):
                self._conn.execute("DELETE FROM plans WHERE key = ?", (key,))
        except sqlite3.Error as err:
            self._disable(str(err))

    def count(self) -> int:
        if self._conn is None:
            return 0
        return self._conn.execute("SELECT COUNT(*) FROM plans").fetchone()[0]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT, retried while another writer holds the lock past the busy timeout."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self):
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                return self
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def __exit__(self, exc_type, exc, tb):
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")
        return False


def open_store(location: str | os.PathLike | None = None) -> PlanStore:
    """The store at ``location`` (a path, or a URL once other backends exist); the default path if None."""
    if location is None:
        location = default_cache_path()
    text = os.fspath(location)
    if "://" in text and not text.startswith("sqlite:///"):
        from autosp.errors import UsageError

        raise UsageError(f"--cache {text}: only SQLite files are supported so far (give a path)")
    if text.startswith("sqlite:///"):
        text = text[len("sqlite:///"):]
    return SQLitePlanStore(text)
