"""A plan cache hit stays cheap (issue 23): it imports neither the search nor numpy, reads the catalogs from their
JSON memo, and reads the package version without importlib.metadata; each shortcut gives what the long way does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from autosp.cost_models.catalog import parsed

CATALOG = Path(parsed.__file__).resolve().parent

HIT = """
import sys
from autosp.planner.api import plan_for
from autosp.planner.request import PlanRequest
plan = plan_for(PlanRequest(model="llama-3.2-1b", ctx="16k", hw="h100x8"), cache=sys.argv[1])
heavy = sorted(m for m in ("numpy", "optuna", "torch", "autosp.planner.search.space", "autosp.planner.search.bulk_search",
                           "autosp.planner.search.optuna_search", "autosp.planner.search.evaluator",
                           "autosp.cost_models.estimate", "tomllib", "importlib.metadata") if m in sys.modules)
print(plan.search["cache"], ",".join(heavy))
"""


def test_a_cache_hit_imports_no_search_and_answers_the_same(tmp_path):
    env = dict(os.environ, AUTOSP_CACHE_DIR=str(tmp_path / "cache"))
    run = [sys.executable, "-c", HIT, str(tmp_path / "plans.sqlite")]
    miss = subprocess.run(run, capture_output=True, text=True, env=env, check=True).stdout.split()
    hit = subprocess.run(run, capture_output=True, text=True, env=env, check=True).stdout.split()
    assert miss[0] == "miss" and "autosp.planner.search.space" in miss[1]
    assert hit == ["hit"]  # nothing heavy imported on a hit


def test_catalog_memo_equals_the_toml_and_is_only_a_shortcut(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOSP_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("models.toml", "hardware.toml"):
        path = CATALOG / name
        truth = tomllib.loads(path.read_text(encoding="utf-8"))
        assert parsed.load_toml(path) == truth  # parsed, memo written
        memo, = parsed.memo_dir().glob(f"{path.stem}-*.json")
        assert json.loads(memo.read_text()) == truth
        assert repr(parsed.load_toml(path)) == repr(truth)  # from the memo: same values, types and order
        memo.write_text("{damaged")
        assert parsed.load_toml(path) == truth  # a damaged memo is parsed again (and rewritten)
        assert json.loads(memo.read_text()) == truth


def test_catalog_memo_never_creates_a_missing_home(tmp_path, monkeypatch):
    home = tmp_path / "no-such-home"
    for var, value in (("HOME", str(home)), ("XDG_CACHE_HOME", ""), ("AUTOSP_CACHE_DIR", "")):
        monkeypatch.setenv(var, value)
    path = CATALOG / "models.toml"
    assert parsed.load_toml(path) == tomllib.loads(path.read_text(encoding="utf-8"))
    assert not home.exists()


def test_version_read_without_importlib_metadata_matches_it():
    from importlib import metadata

    from autosp.version import _from_dist_info, __version__

    assert _from_dist_info() in (None, metadata.version("autosp"))
    assert __version__ == metadata.version("autosp")
