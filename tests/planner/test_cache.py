import multiprocessing
import sqlite3

import pytest

from autosp.planner import cache as cache_mod
from autosp.planner.cache import SQLitePlanStore, default_cache_path, open_store, request_key

REQUEST = {"model": "abc", "hardware": "def", "workload": {"seq_len": 200000}, "objective": "throughput"}


def test_default_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("AUTOSP_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_path() == tmp_path / "xdg" / "autosp" / "plans.sqlite"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_path() == tmp_path / "home" / ".cache" / "autosp" / "plans.sqlite"
    monkeypatch.setenv("AUTOSP_CACHE", str(tmp_path / "x.sqlite"))
    assert default_cache_path() == tmp_path / "x.sqlite"


def test_hit_and_miss_on_a_changed_key(tmp_path):
    store = open_store(tmp_path / "c" / "plans.sqlite")
    key = request_key(REQUEST)
    assert store.get(key) is None
    store.put(key, '{"plan": 1}', REQUEST)
    assert store.get(key) == '{"plan": 1}'
    for field, value in (("workload", {"seq_len": 200001}), ("objective", "max-ctx"), ("hardware", "deg")):
        changed = dict(REQUEST, **{field: value})
        assert request_key(changed) != key
        assert store.get(request_key(changed)) is None
    store.close()
    again = open_store(tmp_path / "c" / "plans.sqlite")  # persisted
    assert again.get(key) == '{"plan": 1}'
    again.delete(key)
    assert again.get(key) is None


def test_key_mixes_in_version_and_source(monkeypatch):
    key = request_key(REQUEST)
    assert key == request_key(dict(reversed(list(REQUEST.items()))))  # order-independent
    from autosp.planner.cache import schema

    monkeypatch.setattr(schema, "_source_hash", lambda: "different-code")
    assert request_key(REQUEST) != key


def _corrupt_files(directory):
    return sorted(p.name for p in directory.iterdir() if ".corrupt-" in p.name)


def test_not_a_database_is_moved_aside_and_rebuilt(tmp_path, capsys):
    path = tmp_path / "plans.sqlite"
    path.write_bytes(b"this is not a sqlite database, just some bytes" * 100)
    cache_mod._warned.clear()
    store = SQLitePlanStore(path)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "moved it to plans.sqlite.corrupt-" in err
    assert len(_corrupt_files(tmp_path)) == 1
    key = request_key(REQUEST)
    store.put(key, "{}", REQUEST)
    assert store.get(key) == "{}"


def test_foreign_schema_is_moved_aside(tmp_path, capsys):
    path = tmp_path / "plans.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE plans (key TEXT, something_else BLOB)")
    conn.commit()
    conn.close()
    cache_mod._warned.clear()
    store = SQLitePlanStore(path)
    assert "unexpected" in capsys.readouterr().err
    assert len(_corrupt_files(tmp_path)) == 1
    assert store.get("k") is None
    store.put("k", "{}", {})
    assert store.get("k") == "{}"


def test_unusable_location_disables_the_cache_without_failing(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cache_mod._warned.clear()
    store = SQLitePlanStore(blocker / "sub" / "plans.sqlite")  # parent is a file
    assert store.disabled
    assert store.get("k") is None
    store.put("k", "{}", {})  # silently nothing
    assert "planning without a cache" in capsys.readouterr().err


def test_locations_paths_sqlite_urls_and_database_urls(monkeypatch, tmp_path):
    from autosp.errors import UsageError
    from autosp.planner.cache import SQLAlchemyPlanStore, default_cache_location

    assert isinstance(open_store(f"sqlite:///{tmp_path}/p.sqlite"), SQLitePlanStore)  # same file format as a path
    assert isinstance(open_store(f"sqlite+pysqlite:///{tmp_path}/q.db"), SQLAlchemyPlanStore)
    with pytest.raises(UsageError, match="not a database URL|nosuchdialect"):
        open_store("nosuchdialect://db/plans")
    monkeypatch.setenv("AUTOSP_CACHE", "postgresql+psycopg://u@db/plans")
    assert default_cache_location() == "postgresql+psycopg://u@db/plans"
    monkeypatch.setenv("AUTOSP_CACHE", str(tmp_path / "x.sqlite"))
    assert default_cache_location() == tmp_path / "x.sqlite"


def test_schema_1_file_is_migrated_in_place(tmp_path, capsys):
    """A cache written by the first autosp release keeps its plans: columns are added and filled."""
    import json

    path = tmp_path / "plans.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE plans (key TEXT PRIMARY KEY, created_at TEXT NOT NULL, "
                 "autosp_version TEXT NOT NULL, request TEXT NOT NULL, plan TEXT NOT NULL)")
    conn.execute("INSERT INTO plans VALUES ('k', 'then', '0.1.0', ?, '{\"old\": true}')", (json.dumps(REQUEST),))
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    cache_mod._warned.clear()
    store = SQLitePlanStore(path)
    assert "migrated 1 cached plan(s) from schema 1 to 2" in capsys.readouterr().err
    assert store.get("k") == '{"old": true}'
    assert store._conn.execute("SELECT model_fingerprint, hardware_fingerprint, objective, seq_len FROM plans"
                               ).fetchone() == ("abc", "def", "throughput", 200000)
    store.close()
    again = SQLitePlanStore(path)  # opens as schema 2 without a word
    assert capsys.readouterr().err == "" and again.get("k") == '{"old": true}'
    assert not _corrupt_files(tmp_path)


def test_newer_schema_is_left_alone(tmp_path, capsys):
    path = tmp_path / "plans.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE plans (key TEXT PRIMARY KEY, whatever TEXT)")
    conn.execute("PRAGMA user_version = 7")
    conn.commit()
    conn.close()
    cache_mod._warned.clear()
    store = SQLitePlanStore(path)
    assert store.disabled and "newer autosp" in capsys.readouterr().err
    assert store.get("k") is None
    assert not _corrupt_files(tmp_path)  # not moved aside: the newer autosp still uses it


def _writer(path, worker, n, barrier):
    store = SQLitePlanStore(path)
    barrier.wait()
    for i in range(n):
        store.put(f"w{worker}-{i}", f'{{"worker": {worker}, "i": {i}}}', {"i": i})
        store.put("shared", f'{{"worker": {worker}}}', {})
    store.close()


@pytest.mark.slow
def test_two_processes_writing_at_once(tmp_path):
    path = str(tmp_path / "plans.sqlite")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(path, w, 40, barrier)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    store = SQLitePlanStore(path)
    assert store.count() == 81
    for w in range(2):
        for i in range(40):
            assert store.get(f"w{w}-{i}") == f'{{"worker": {w}, "i": {i}}}'
    assert store.get("shared") in ('{"worker": 0}', '{"worker": 1}')
    assert not _corrupt_files(tmp_path)


def test_plan_for_uses_the_cache(tmp_path):
    from autosp.planner.api import plan_for
    from autosp.planner.request import PlanRequest

    path = tmp_path / "plans.sqlite"

    def planned(ctx="8k", **changes):
        request = PlanRequest(model="llama-3.2-1b", ctx=ctx, hw="h100x2", **dict(dict(trials=20, seed=0), **changes))
        return plan_for(request, cache=str(path))

    first = planned()
    assert first.search["cache"] == "miss"
    second = planned("8000")
    assert second.search["cache"] == "hit"
    assert second.candidate == first.candidate and second.estimate == first.estimate
    assert second.runner_ups == first.runner_ups and second.created_at == first.created_at
    # anything that changes the answer is a miss
    for changed in (dict(seed=1), dict(trials=21)):
        assert planned(**changed).search["cache"] == "miss"
    assert planned("9k").search["cache"] == "miss"
    assert planned(global_batch=4).search["cache"] == "miss"
    assert planned(dtype="fp32").search["cache"] == "miss"
    # an unreadable row is dropped and recomputed, never returned
    store = SQLitePlanStore(path)
    keys = [row[0] for row in store._conn.execute("SELECT key FROM plans")]
    for key in keys:
        store.put(key, '{"schema_version": 1, "model": {}}', {})
    store.close()
    cache_mod._warned.clear()
    again = planned()
    assert again.search["cache"] == "miss" and again.candidate == first.candidate
    assert planned().search["cache"] == "hit"
    # a row that parses but answers another request (another model) is a miss too, never returned
    import json
    from dataclasses import replace

    store = SQLitePlanStore(path)
    key = store._conn.execute("SELECT key FROM plans WHERE seq_len = 8000 AND plan LIKE '%\"seed\": 0%' "
                              "AND plan NOT LIKE '%\"global_batch\": 4%'").fetchall()
    other = plan_for(PlanRequest(model="llama-3.2-3b", ctx="8k", hw="h100x2", trials=20, seed=0), cache=None)
    for (k,) in key:
        store.put(k, other.to_json(), {})
    store.close()
    cache_mod._warned.clear()
    fresh = planned()
    assert fresh.search["cache"] == "miss" and fresh.model == first.model
