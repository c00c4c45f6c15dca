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
  errors, so concurrent planners on one cache lose nothing (tests/planner/test_cache.py, test_cache_db.py).
- A cache that cannot be used at all (read-only directory, database down, ...) turns itself off with
  one warning: caching never makes planning fail. A malformed URL, or one whose driver is not
  installed, is a usage error (exit 2): the user asked for that cache by name.
"""

from __future__ import annotations

import os

from autosp.planner.cache.schema import (SCHEMA, PlanStore, default_cache_location, default_cache_path, is_url,
                                         request_key, warn_once)
from autosp.planner.cache.schema import _warned  # noqa: F401  (the warnings already given; tests reset it)
from autosp.planner.cache.sql import SQLAlchemyPlanStore, make_engine
from autosp.planner.cache.sqlite import SQLitePlanStore


def open_store(location: str | os.PathLike | None = None) -> PlanStore:
    """The store at ``location``: a path or ``sqlite:///PATH`` (the stdlib SQLite store), any other
    database URL (SQLAlchemy), or None for ``$AUTOSP_CACHE`` / the default file."""
    flag = "--cache"
    if location is None:
        location = default_cache_location()
        flag = "$AUTOSP_CACHE"
    text = os.fspath(location)
    if text.startswith("sqlite:///"):
        return SQLitePlanStore(text[len("sqlite:///"):])
    if is_url(text):
        return SQLAlchemyPlanStore(text, flag)
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


__all__ = ["SCHEMA", "PlanStore", "SQLAlchemyPlanStore", "SQLitePlanStore", "default_cache_location",
           "default_cache_path", "display_location", "make_engine", "open_store", "request_key", "warn_once"]
