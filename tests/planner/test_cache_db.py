"""The plan cache on a database URL: PostgreSQL for real (tests/conftest.py's ``pg_url``), plus the same
store on SQLite through SQLAlchemy; concurrent writers, schema migration and recovery, CLI end to end."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autosp.planner import cache as cache_mod
from autosp.planner.cache import SCHEMA, SQLAlchemyPlanStore, SQLitePlanStore, open_store, request_key

REQUEST = {"model": "m" * 16, "hardware": "h" * 16, "workload": {"seq_len": 8000, "dtype": "bf16"},
           "objective": "throughput", "space_version": "2-abc"}

WRITERS = 4
ENTRIES = 100


def _engine(url):
    import sqlalchemy as sa

    return sa, sa.create_engine(url)


@pytest.fixture(params=["postgresql", "sqlite-sqlalchemy"])
def db_url(request, tmp_path):
    if request.param == "postgresql":
        return request.getfixturevalue("pg_url")
    return f"sqlite+pysqlite:///{tmp_path}/plans.db"


def test_round_trip_upsert_and_columns(db_url):
    store = open_store(db_url)
    assert isinstance(store, SQLAlchemyPlanStore) and not store.disabled
    key = request_key(REQUEST)
    assert store.get(key) is None
    store.put(key, '{"plan": 1}', REQUEST)
    store.put(key, '{"plan": 2}', REQUEST)  # upsert: same key, newer value, one row
    assert store.get(key) == '{"plan": 2}' and store.count() == 1
    store.delete(key)
    assert store.get(key) is None and store.count() == 0
    store.put(key, '{"plan": 3}', REQUEST)
    store.close()
    sa, engine = _engine(db_url)
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT model_fingerprint, hardware_fingerprint, space_version, objective, "
                                   "seq_len, code_version FROM autosp_plans")).one()
        version = conn.execute(sa.text("SELECT value FROM autosp_cache_meta WHERE name = 'schema_version'")).scalar()
    assert tuple(row[:5]) == ("m" * 16, "h" * 16, "2-abc", "throughput", 8000) and row[5]
    assert version == str(SCHEMA)
    assert open_store(db_url).get(key) == '{"plan": 3}'  # persisted, reopened without migration


def _writer(url, worker, entries, barrier):
    store = open_store(url)  # every writer sets the schema up itself, at the same moment
    barrier.wait()
    for i in range(entries):
        store.put(f"w{worker}-{i}", json.dumps({"worker": worker, "i": i}), {"i": i})
        store.put("shared", json.dumps({"worker": worker}), {})
    store.close()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgresql", "sqlite-file"])
def test_concurrent_writers_lose_nothing(backend, request, tmp_path):
    """WRITERS processes x ENTRIES entries each (plus one key all of them overwrite), started together on
    a cache none of them created yet: every entry is there, intact, and nothing was moved aside."""
    url = request.getfixturevalue("pg_url") if backend == "postgresql" else str(tmp_path / "plans.sqlite")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WRITERS)
    procs = [ctx.Process(target=_writer, args=(url, w, ENTRIES, barrier)) for w in range(WRITERS)]
    start = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    wall = time.perf_counter() - start
    store = open_store(url)
    assert not store.disabled
    rows = store.count()
    assert rows == WRITERS * ENTRIES + 1
    for w in range(WRITERS):
        for i in range(ENTRIES):
            assert json.loads(store.get(f"w{w}-{i}")) == {"worker": w, "i": i}
    assert json.loads(store.get("shared"))["worker"] in range(WRITERS)
    # the figures for the record (pytest -s shows them); informative only, nothing is asserted on time
    print(f"\nconcurrency [{backend}]: {WRITERS} writers x {ENTRIES} entries + 1 shared key "
          f"({WRITERS * (2 * ENTRIES)} writes), {rows} rows read back intact, 0 lost; "
          f"{wall:.1f} s wall incl. process start-up")
    if backend == "sqlite-file":
        assert not [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    store.close()


def test_schema_1_table_is_migrated_and_keeps_its_rows(db_url, capsys):
    sa, engine = _engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE autosp_plans (key VARCHAR(64) PRIMARY KEY, created_at VARCHAR(40) NOT NULL, "
                             "autosp_version VARCHAR(40) NOT NULL, request TEXT NOT NULL, plan TEXT NOT NULL)"))
        conn.execute(sa.text("INSERT INTO autosp_plans VALUES ('k1', 'then', '0.0.1', :r, '{\"old\": 1}')"),
                     {"r": json.dumps(REQUEST)})
    cache_mod._warned.clear()
    store = open_store(db_url)
    assert "migrated 1 cached plan(s) from schema 1 to 2" in capsys.readouterr().err
    assert store.get("k1") == '{"old": 1}'
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT model_fingerprint, seq_len FROM autosp_plans")).one() == ("m" * 16, 8000)
    store.put("k2", "{}", REQUEST)
    assert store.count() == 2


def test_foreign_table_is_renamed_aside_and_newer_schema_left_alone(db_url, capsys):
    sa, engine = _engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE autosp_plans (id INTEGER PRIMARY KEY, blob TEXT)"))
        conn.execute(sa.text("INSERT INTO autosp_plans VALUES (1, 'somebody else''s data')"))
    cache_mod._warned.clear()
    store = open_store(db_url)
    assert "unexpected schema" in capsys.readouterr().err and not store.disabled
    store.put("k", "{}", REQUEST)
    assert store.get("k") == "{}"
    tables = set(sa.inspect(engine).get_table_names())
    aside = [t for t in tables if t.startswith("autosp_plans_corrupt_")]
    assert len(aside) == 1
    with engine.connect() as conn:  # nothing of the foreign table was lost
        assert conn.execute(sa.text(f"SELECT blob FROM {aside[0]}")).scalar() == "somebody else's data"
    # a cache written by a newer autosp is neither read, written nor rebuilt
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE autosp_cache_meta SET value = '99' WHERE name = 'schema_version'"))
    cache_mod._warned.clear()
    newer = open_store(db_url)
    assert newer.disabled and "newer autosp" in capsys.readouterr().err
    assert newer.get("k") is None
    newer.put("k2", "{}", REQUEST)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM autosp_plans")).scalar() == 1


def test_bad_urls_are_usage_errors_and_a_dead_server_only_a_warning(tmp_path, capsys):
    from autosp.errors import UsageError

    for url in ("postgresql+nosuchdriver://u@h/db", "nosuchdialect://x", "postgresql+psycopg://u@h:notaport/db"):
        with pytest.raises(UsageError):
            open_store(url)
    assert isinstance(open_store(f"sqlite:///{tmp_path}/p.sqlite"), SQLitePlanStore)
    cache_mod._warned.clear()
    dead = open_store("postgresql+psycopg://nobody:secret@127.0.0.1:1/x")
    err = capsys.readouterr().err
    assert dead.disabled and "planning without a cache" in err and "secret" not in err
    assert dead.get("k") is None
    dead.put("k", "{}", {})


SCRIPT = Path(sys.executable).with_name("autosp-plan")


def _plan(*args, env=None):
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "autosp.planner.cli.main"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_cli_shares_plans_through_postgresql(pg_url):
    """Two planners (say, a laptop and CI) on one PostgreSQL cache: the second gets the first's plan;
    AUTOSP_CACHE works like --cache; a damaged row is a miss with a warning, never a wrong plan."""
    args = ["--model", "llama-3.2-1b", "--ctx", "8k", "--hw", "h100x2", "--trials", "20", "--json"]
    first = _plan(*args, "--cache", pg_url)
    assert first.returncode == 0, first.stderr
    plan = json.loads(first.stdout)
    assert plan["search"]["cache"] == "miss"
    second = _plan(*args, env={"AUTOSP_CACHE": pg_url})
    assert second.returncode == 0, second.stderr
    hit = json.loads(second.stdout)
    assert hit["search"]["cache"] == "hit" and hit["candidate"] == plan["candidate"]
    assert hit["search"]["cache_location"].startswith("postgresql+psycopg://autosp@127.0.0.1:")
    # damage the row: valid JSON, but a plan for another context
    sa, engine = _engine(pg_url)
    with engine.begin() as conn:
        text = conn.execute(sa.text("SELECT plan FROM autosp_plans")).scalar()
        wrong = json.loads(text)
        wrong["workload"]["seq_len"] = 12345
        conn.execute(sa.text("UPDATE autosp_plans SET plan = :p"), {"p": json.dumps(wrong)})
    third = _plan(*args, "--cache", pg_url)
    assert third.returncode == 0, third.stderr
    again = json.loads(third.stdout)
    assert again["search"]["cache"] == "miss" and again["workload"]["seq_len"] == 8000
    assert "ignored and deleted a cached plan" in third.stderr and third.stderr.count("\n") == 1
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE autosp_plans SET plan = 'not json at all'"))
    fourth = _plan(*args, "--cache", pg_url)
    assert fourth.returncode == 0 and json.loads(fourth.stdout)["search"]["cache"] == "miss"
    assert "does not parse" in fourth.stderr
    engine.dispose()
