"""The plan cache: asking the same question twice costs no search, on one machine or across a team.

Where (``--cache LOCATION``, else ``$AUTOSP_CACHE``, else ``$XDG_CACHE_HOME/autosp/plans.sqlite``, else
``~/.cache/autosp/plans.sqlite``; ``--no-cache`` turns it off):

- a file path, or ``sqlite:///PATH``: a SQLite file through Python's ``sqlite3`` (no extra dependency);
- any other SQLAlchemy database URL, e.g. ``postgresql+psycopg://user@host/db`` for a cache shared by
  a team and its CI: :class:`SQLAlchemyPlanStore`, tables ``autosp_plans`` and ``autosp_cache_meta``
  (the ``[db]`` extra; SQLAlchemy is imported only when such a URL is used).

What: the key is a SHA-256 of everything the answer depends on (:func:`request_key`): the model
fingerprint (and its graph profile's, when it has one), the hardware fingerprint, the workload, the
objective, the search settings, the search-space version, the autosp version and
:func:`autosp.planner.versions.code_version` (a hash of the planner's and cost model's sources, so a
changed formula never returns a stale plan, even between releases). The value is the plan JSON; the
row also keeps those parts in their own columns (model/hardware fingerprints, space, code and autosp
versions, objective, context) so a shared cache can be inspected with SQL.

Robustness (never a crash, never a wrong plan):

- Both backends keep a schema version (SQLite: ``PRAGMA user_version`` and a ``meta`` table; SQL:
  table ``autosp_cache_meta``). An older schema is migrated in place with one warning (rows keep their
  keys); a SQLite file that is not a database, or has a foreign schema, is moved aside to
  ``<path>.corrupt-<UTC timestamp>`` and rebuilt; a foreign ``autosp_plans`` table in a SQL database is
  renamed aside (``autosp_plans_corrupt_<stamp>``) and rebuilt. A cache written by a *newer* autosp is
  left untouched and turned off for this run, with a warning.
- Readers validate what they get (:func:`autosp.planner.api` re-parses the plan and checks it answers
  the request): a row that fails is a miss, is deleted, and says so once on stderr.
- Writers upsert in short transactions (SQLite: ``BEGIN IMMEDIATE`` with a busy timeout; PostgreSQL:
  ``INSERT ... ON CONFLICT DO UPDATE``; schema set-up under an advisory lock), retried on transient
  errors, so concurrent planners on one cache lose nothing (tests/test_cache.py, test_cache_db.py).
- A cache that cannot be used at all (read-only directory, database down, ...) turns itself off with
  one warning: caching never makes planning fail. A malformed URL, or one whose driver is not
  installed, is a usage error (exit 2): the user asked for that cache by name.
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

from autosp.messages import install_hint

SCHEMA = 2
"""Storage schema of both backends. 1: (key, created_at, autosp_version, request, plan); 2: + the key's
parts in their own columns and a meta table."""

KEY_VERSION = 1
"""Mixed into every key; bump only when the key's meaning changes (a storage migration keeps keys)."""

COLUMNS_V1 = ["key", "created_at", "autosp_version", "request", "plan"]
COLUMNS = ["key", "created_at", "autosp_version", "code_version", "space_version", "model_fingerprint",
           "hardware_fingerprint", "objective", "seq_len", "request", "plan"]
_NEW_COLUMNS = [c for c in COLUMNS if c not in COLUMNS_V1]

_SQLITE_TABLE = ("CREATE TABLE IF NOT EXISTS plans (key TEXT PRIMARY KEY, created_at TEXT NOT NULL, "
                 "autosp_version TEXT NOT NULL, code_version TEXT NOT NULL DEFAULT '', "
                 "space_version TEXT NOT NULL DEFAULT '', model_fingerprint TEXT NOT NULL DEFAULT '', "
                 "hardware_fingerprint TEXT NOT NULL DEFAULT '', objective TEXT NOT NULL DEFAULT '', "
                 "seq_len INTEGER, request TEXT NOT NULL, plan TEXT NOT NULL)")
_SQLITE_META = "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)"
_SQLITE_ADD = {"code_version": "TEXT NOT NULL DEFAULT ''", "space_version": "TEXT NOT NULL DEFAULT ''",
               "model_fingerprint": "TEXT NOT NULL DEFAULT ''", "hardware_fingerprint": "TEXT NOT NULL DEFAULT ''",
               "objective": "TEXT NOT NULL DEFAULT ''", "seq_len": "INTEGER"}
BUSY_TIMEOUT_S = 30.0

_warned: set[str] = set()


def warn_once(message: str) -> None:
    from autosp.messages import one_line  # a driver's error can run to pages: one line, shortened

    if message not in _warned:
        _warned.add(message)
        print(f"autosp-plan: warning: {one_line(message)}", file=sys.stderr)


# -- where, and the key ---------------------------------------------------------------------------

def is_url(location) -> bool:
    return isinstance(location, str) and "://" in location


def default_cache_path() -> Path:
    """The default SQLite file (``$AUTOSP_CACHE`` when it is a path)."""
    override = os.environ.get("AUTOSP_CACHE")
    if override and not is_url(override):
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autosp" / "plans.sqlite"


def default_cache_location() -> str | Path:
    """``$AUTOSP_CACHE`` (a path or a database URL) or the default file."""
    override = os.environ.get("AUTOSP_CACHE")
    if override and is_url(override):
        return override
    return default_cache_path()


def _source_hash() -> str:
    """Hash of the planner and cost-model sources the answer depends on."""
    from autosp.planner.versions import code_version

    return code_version()


def request_key(request: dict) -> str:
    """The cache key of a request description (a JSON-able dict), with code versions mixed in."""
    from autosp.version import __version__

    payload = {"request": request, "autosp_version": __version__, "code": _source_hash(), "cache_schema": KEY_VERSION}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def row_fields(request: dict, created: str | None = None) -> dict:
    """The columns of a row besides key, request and plan (empty strings for what the request lacks)."""
    from autosp.version import __version__

    workload = request.get("workload") if isinstance(request.get("workload"), dict) else {}
    seq_len = workload.get("seq_len")
    return {"created_at": created or datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "autosp_version": __version__, "code_version": _source_hash() if request else "",
            "space_version": str(request.get("space_version") or ""),
            "model_fingerprint": str(request.get("model") or ""),
            "hardware_fingerprint": str(request.get("hardware") or ""),
            "objective": str(request.get("objective") or ""),
            "seq_len": seq_len if isinstance(seq_len, int) else None}


def _legacy_fields(request_text: str) -> dict:
    """Columns of a migrated schema-1 row, from its stored request (code version unknown: '')."""
    try:
        request = json.loads(request_text)
    except (TypeError, ValueError):
        request = {}
    if not isinstance(request, dict):
        request = {}
    fields = row_fields(request)
    fields["code_version"] = ""
    del fields["created_at"], fields["autosp_version"]
    return fields


class PlanStore:
    """Where cached plans live. Implementations never raise for storage trouble: they warn once and
    behave as an empty cache."""

    location: str = ""
    disabled: bool = False

    def get(self, key: str) -> str | None:  # pragma: no cover - interface
        raise NotImplementedError

    def put(self, key: str, plan_json: str, request: dict) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def delete(self, key: str) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def count(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Corrupt(Exception):
    pass


class _Newer(Exception):
    pass


# -- SQLite (stdlib) ------------------------------------------------------------------------------

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
        self.path.parent.mkdir(parents=True, exist_ok=True)
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


# -- any SQLAlchemy database ----------------------------------------------------------------------

PLANS_TABLE = "autosp_plans"
META_TABLE = "autosp_cache_meta"
_ADVISORY_LOCK = 0x6175746F7370  # 'autosp': serialises schema set-up across PostgreSQL clients
RETRIES = 5


def _import_sqlalchemy(url: str):
    try:
        import sqlalchemy
    except ImportError:
        from autosp.errors import UsageError

        raise UsageError(f"--cache {url}: a database URL needs SQLAlchemy: {install_hint('db')}") from None
    return sqlalchemy


def make_engine(url: str, flag: str = "--cache"):
    """(sqlalchemy, engine, display URL without password) for a database URL; UsageError for a malformed
    URL, an unknown dialect or a missing driver."""
    from autosp.errors import UsageError

    sa = _import_sqlalchemy(url)
    try:
        parsed = sa.engine.make_url(url)
    except Exception as err:  # noqa: BLE001 - ArgumentError and friends
        raise UsageError(f"{flag} {url}: not a database URL ({err})") from None
    shown = parsed.render_as_string(hide_password=True)
    kwargs = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": BUSY_TIMEOUT_S}
    try:
        engine = sa.create_engine(parsed, **kwargs)
    except ImportError as err:
        raise UsageError(f"{flag} {shown}: the database driver is not installed ({err}); for PostgreSQL: "
                         f"{install_hint('db')} (psycopg 3, URL postgresql+psycopg://...)") from None
    except Exception as err:  # noqa: BLE001 - NoSuchModuleError (unknown dialect), bad arguments
        raise UsageError(f"{flag} {shown}: {type(err).__name__}: {err}") from None
    return sa, engine, shown


class SQLAlchemyPlanStore(PlanStore):
    """Plans in any SQLAlchemy database (PostgreSQL tested in CI), shared by every planner that opens it."""

    def __init__(self, url: str):
        sa, self.engine, self.location = make_engine(url)
        self.sa = sa
        self.disabled = False
        meta = sa.MetaData()
        self.plans = sa.Table(
            PLANS_TABLE, meta,
            sa.Column("key", sa.String(64), primary_key=True),
            sa.Column("created_at", sa.String(40), nullable=False),
            sa.Column("autosp_version", sa.String(40), nullable=False),
            sa.Column("code_version", sa.String(40), nullable=False, server_default=""),
            sa.Column("space_version", sa.String(64), nullable=False, server_default=""),
            sa.Column("model_fingerprint", sa.String(64), nullable=False, server_default=""),
            sa.Column("hardware_fingerprint", sa.String(64), nullable=False, server_default=""),
            sa.Column("objective", sa.String(16), nullable=False, server_default=""),
            sa.Column("seq_len", sa.BigInteger, nullable=True),
            sa.Column("request", sa.Text, nullable=False),
            sa.Column("plan", sa.Text, nullable=False))
        self.meta = sa.Table(META_TABLE, meta,
                             sa.Column("name", sa.String(64), primary_key=True),
                             sa.Column("value", sa.String(255), nullable=False))
        self._metadata = meta
        self._setup()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def _retrying(self, what: str, fn):
        """Run ``fn`` (one transaction), retrying transient errors; on lasting trouble warn, disable,
        return None."""
        sa = self.sa
        delay = 0.05
        for attempt in range(RETRIES):
            try:
                return fn()
            except (sa.exc.OperationalError, sa.exc.InternalError, sa.exc.IntegrityError,
                    sa.exc.ProgrammingError) as err:
                # deadlocks, serialisation failures, a concurrent CREATE TABLE, a dropped connection
                if attempt + 1 < RETRIES:
                    time.sleep(delay)
                    delay *= 2
                    continue
                self._disable(f"{what}: {type(err.orig if getattr(err, 'orig', None) else err).__name__}: "
                              f"{str(err).splitlines()[0]}")
            except sa.exc.SQLAlchemyError as err:
                self._disable(f"{what}: {type(err).__name__}: {str(err).splitlines()[0]}")
                return None
        return None

    def _disable(self, why: str) -> None:
        self.disabled = True
        warn_once(f"plan cache {self.location} is unusable ({why}); planning without a cache")

    # -- schema -----------------------------------------------------------------------------------
    def _setup(self) -> None:
        self._retrying("opening", self._setup_once)

    def _setup_once(self) -> None:
        sa = self.sa
        with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_LOCK})
            inspector = sa.inspect(conn)
            tables = set(inspector.get_table_names())
            version = None
            if META_TABLE in tables:
                row = conn.execute(sa.select(self.meta.c.value).where(self.meta.c.name == "schema_version")).first()
                try:
                    version = int(row[0]) if row else None
                except ValueError:
                    version = None
            columns = [c["name"] for c in inspector.get_columns(PLANS_TABLE)] if PLANS_TABLE in tables else []
            if version is not None and version > SCHEMA:
                self._disable(f"written by a newer autosp (schema {version}, this autosp knows {SCHEMA}); "
                              "left as it is")
                return
            if PLANS_TABLE in tables and version == SCHEMA and sorted(columns) == sorted(COLUMNS):
                return
            if PLANS_TABLE in tables and version in (None, 1) and sorted(columns) == sorted(COLUMNS_V1):
                self._migrate_v1(conn)
            elif PLANS_TABLE in tables:
                stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
                aside = f"{PLANS_TABLE}_corrupt_{stamp}"
                conn.execute(sa.text(f"ALTER TABLE {PLANS_TABLE} RENAME TO {aside}"))
                warn_once(f"plan cache {self.location}: table {PLANS_TABLE} had an unexpected schema (version "
                          f"{version}, columns {columns}); renamed it to {aside} and started afresh")
                self.plans.create(conn)
            else:
                self.plans.create(conn)
            self.meta.create(conn, checkfirst=True)
            conn.execute(sa.delete(self.meta).where(self.meta.c.name == "schema_version"))
            conn.execute(sa.insert(self.meta).values(name="schema_version", value=str(SCHEMA)))

    def _migrate_v1(self, conn) -> None:
        sa = self.sa
        for name in _NEW_COLUMNS:
            kind = "BIGINT" if name == "seq_len" else "VARCHAR(64) NOT NULL DEFAULT ''"
            conn.execute(sa.text(f"ALTER TABLE {PLANS_TABLE} ADD COLUMN {name} {kind}"))
        rows = conn.execute(sa.select(self.plans.c.key, self.plans.c.request)).all()
        for key, request_text in rows:
            conn.execute(sa.update(self.plans).where(self.plans.c.key == key).values(**_legacy_fields(request_text)))
        warn_once(f"plan cache {self.location}: migrated {len(rows)} cached plan(s) from schema 1 to {SCHEMA}")

    # -- the interface ---------------------------------------------------------------------------
    def get(self, key: str) -> str | None:
        if self.disabled:
            return None
        sa = self.sa

        def read():
            with self.engine.connect() as conn:
                row = conn.execute(sa.select(self.plans.c.plan).where(self.plans.c.key == key)).first()
            return row[0] if row else None

        return self._retrying("reading", read)

    def _upsert(self, row: dict):
        sa = self.sa
        updates = {k: v for k, v in row.items() if k != "key"}
        if self.dialect in ("postgresql", "sqlite"):
            if self.dialect == "postgresql":
                from sqlalchemy.dialects.postgresql import insert
            else:
                from sqlalchemy.dialects.sqlite import insert
            stmt = insert(self.plans).values(**row).on_conflict_do_update(index_elements=["key"], set_=updates)
            with self.engine.begin() as conn:
                conn.execute(stmt)
            return
        if self.dialect in ("mysql", "mariadb"):
            from sqlalchemy.dialects.mysql import insert

            with self.engine.begin() as conn:
                conn.execute(insert(self.plans).values(**row).on_duplicate_key_update(**updates))
            return
        with self.engine.begin() as conn:  # other dialects: update, else insert (a racing insert retries)
            done = conn.execute(sa.update(self.plans).where(self.plans.c.key == row["key"]).values(**updates))
            if done.rowcount == 0:
                conn.execute(sa.insert(self.plans).values(**row))

    def put(self, key: str, plan_json: str, request: dict) -> None:
        if self.disabled:
            return
        row = {"key": key, **row_fields(request), "request": json.dumps(request, sort_keys=True, default=str),
               "plan": plan_json}
        self._retrying("writing", lambda: self._upsert(row))

    def delete(self, key: str) -> None:
        if self.disabled:
            return
        sa = self.sa

        def remove():
            with self.engine.begin() as conn:
                conn.execute(sa.delete(self.plans).where(self.plans.c.key == key))

        self._retrying("deleting", remove)

    def count(self) -> int:
        if self.disabled:
            return 0
        sa = self.sa
        with self.engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(self.plans)).scalar_one()

    def close(self) -> None:
        self.engine.dispose()


def open_store(location: str | os.PathLike | None = None) -> PlanStore:
    """The store at ``location``: a path or ``sqlite:///PATH`` (the stdlib SQLite store), any other
    database URL (SQLAlchemy), or None for ``$AUTOSP_CACHE`` / the default file."""
    if location is None:
        location = default_cache_location()
    text = os.fspath(location)
    if text.startswith("sqlite:///"):
        return SQLitePlanStore(text[len("sqlite:///"):])
    if is_url(text):
        return SQLAlchemyPlanStore(text)
    return SQLitePlanStore(text)


def display_location(location) -> str:
    """A location as it may be printed or stored in a plan: database passwords hidden."""
    text = os.fspath(location)
    if is_url(text) and not text.startswith("sqlite:///"):
        try:
            import sqlalchemy

            return sqlalchemy.engine.make_url(text).render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001 - never fail for display
            return text.split("://", 1)[0] + "://***"
    return text
