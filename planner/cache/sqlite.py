"""The plan cache in one SQLite file through Python's ``sqlite3`` (no extra dependency): short
``BEGIN IMMEDIATE`` transactions with a busy timeout for concurrent planners, schema migration, and a
damaged file moved aside and rebuilt."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from datetime import datetime, timezone
from pathlib import Path

from autosp.files import make_cache_dirs
from autosp.planner.cache.schema import (BUSY_TIMEOUT_S, COLUMNS, COLUMNS_V1, SCHEMA, PlanStore, _Corrupt, _Newer,
                                         _legacy_fields, _NEW_COLUMNS, row_fields, warn_once)

_SQLITE_TABLE = ("CREATE TABLE IF NOT EXISTS plans (key TEXT PRIMARY KEY, created_at TEXT NOT NULL, "
                 "autosp_version TEXT NOT NULL, code_version TEXT NOT NULL DEFAULT '', "
                 "space_version TEXT NOT NULL DEFAULT '', model_fingerprint TEXT NOT NULL DEFAULT '', "
                 "hardware_fingerprint TEXT NOT NULL DEFAULT '', objective TEXT NOT NULL DEFAULT '', "
                 "seq_len INTEGER, request TEXT NOT NULL, plan TEXT NOT NULL)")
_SQLITE_META = "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)"
_SQLITE_ADD = {"code_version": "TEXT NOT NULL DEFAULT ''", "space_version": "TEXT NOT NULL DEFAULT ''",
               "model_fingerprint": "TEXT NOT NULL DEFAULT ''", "hardware_fingerprint": "TEXT NOT NULL DEFAULT ''",
               "objective": "TEXT NOT NULL DEFAULT ''", "seq_len": "INTEGER"}

class SQLitePlanStore(PlanStore):
    """One SQLite file; one connection per store, short transactions, busy timeout for concurrency."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()
        self.location = str(self.path)
        self._conn: sqlite3.Connection | None = None
        self.disabled = False
        self._open()

    # -- opening, validating, migrating, recovering ------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        make_cache_dirs(self.path.parent)
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        return conn

    @staticmethod
    def _state(conn) -> tuple[int, set, list]:
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            columns = [row[1] for row in conn.execute("PRAGMA table_info(plans)")] if "plans" in tables else []
        except sqlite3.DatabaseError as err:
            raise _Corrupt(str(err)) from None
        return version, tables, columns

    def _validate(self, conn: sqlite3.Connection) -> None:
        version, tables, columns = self._state(conn)
        if version == SCHEMA and tables == {"plans", "meta"} and sorted(columns) == sorted(COLUMNS):
            return
        with _transaction(conn):  # re-read under the write lock: another process may be doing the same
            version, tables, columns = self._state(conn)
            if not tables:
                conn.execute(_SQLITE_TABLE)
                conn.execute(_SQLITE_META)
                conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA),))
                conn.execute(f"PRAGMA user_version = {SCHEMA}")
                return
            if version == SCHEMA and tables == {"plans", "meta"} and sorted(columns) == sorted(COLUMNS):
                return
            if version > SCHEMA and "plans" in tables:
                raise _Newer(f"schema {version}, this autosp knows {SCHEMA}")
            if version == 1 and tables == {"plans"} and columns == COLUMNS_V1:
                self._migrate_v1(conn)
                return
        raise _Corrupt(f"unexpected schema (user_version {version}, tables {sorted(tables)}, columns {columns})")

    def _migrate_v1(self, conn) -> None:
        for name in _NEW_COLUMNS:
            conn.execute(f"ALTER TABLE plans ADD COLUMN {name} {_SQLITE_ADD[name]}")
        rows = conn.execute("SELECT key, request FROM plans").fetchall()
        for key, request_text in rows:
            fields = _legacy_fields(request_text)
            conn.execute(f"UPDATE plans SET {', '.join(f'{c} = ?' for c in fields)} WHERE key = ?",
                         (*fields.values(), key))
        conn.execute(_SQLITE_META)
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA),))
        conn.execute(f"PRAGMA user_version = {SCHEMA}")
        warn_once(f"plan cache {self.path}: migrated {len(rows)} cached plan(s) from schema 1 to {SCHEMA}")

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
            except _Newer as err:
                if conn is not None:
                    conn.close()
                self._disable(f"written by a newer autosp ({err}); left as it is")
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
        fields = row_fields(request)
        names = ["key", *fields, "request", "plan"]
        values = (key, *fields.values(), json.dumps(request, sort_keys=True, default=str), plan_json)
        updates = ", ".join(f"{n} = excluded.{n}" for n in names[1:])
        try:
            with _transaction(self._conn):
                self._conn.execute(f"INSERT INTO plans ({', '.join(names)}) VALUES ({', '.join('?' * len(names))}) "
                                   f"ON CONFLICT(key) DO UPDATE SET {updates}", values)
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


__all__ = ["SQLitePlanStore"]
