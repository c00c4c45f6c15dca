"""The plan cache in any SQLAlchemy database (PostgreSQL tested): tables ``autosp_plans`` and
``autosp_cache_meta``, upserts in short transactions retried on transient errors, schema set-up under an
advisory lock. SQLAlchemy is imported only when such a URL is used."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

from autosp.messages import install_hint
from autosp.planner.cache.schema import (BUSY_TIMEOUT_S, COLUMNS, COLUMNS_V1, SCHEMA, PlanStore, _legacy_fields,
                                         _NEW_COLUMNS, row_fields, warn_once)

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
        raise UsageError(f"{flag} {shown}: {type(err).__name__}: {err}{_dialect_hint(parsed.drivername)}") from None
    return sa, engine, shown


def _dialect_hint(driver: str) -> str:
    """What a URL whose scheme SQLAlchemy does not know probably meant."""
    scheme = driver.split("+")[0].lower()
    if scheme in ("postgres", "pg", "psql"):
        return "; SQLAlchemy names PostgreSQL postgresql: write postgresql+psycopg://user@host/db"
    if scheme in ("http", "https", "ftp", "file", "s3", "gs"):
        return (f"; a {scheme}:// address is not a database: give a file path or a database URL such as "
                "postgresql+psycopg://user@host/db")
    return "; give a file path or a database URL such as postgresql+psycopg://user@host/db"


class SQLAlchemyPlanStore(PlanStore):
    """Plans in any SQLAlchemy database (PostgreSQL tested in CI), shared by every planner that opens it."""

    def __init__(self, url: str, flag: str = "--cache"):
        sa, self.engine, self.location = make_engine(url, flag)
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


__all__ = ["META_TABLE", "PLANS_TABLE", "RETRIES", "SQLAlchemyPlanStore", "make_engine"]
