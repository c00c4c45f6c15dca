"""The plan cache's contract, shared by both backends: the storage schema version, the key of a request
(:func:`request_key`), the columns a row keeps, the default location, and the :class:`PlanStore`
interface (see :mod:`autosp.planner.cache` for the whole story)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

SCHEMA = 2
"""Storage schema of both backends. 1: (key, created_at, autosp_version, request, plan); 2: + the key's
parts in their own columns and a meta table."""

KEY_VERSION = 1
"""Mixed into every key; bump only when the key's meaning changes (a storage migration keeps keys)."""

COLUMNS_V1 = ["key", "created_at", "autosp_version", "request", "plan"]
COLUMNS = ["key", "created_at", "autosp_version", "code_version", "space_version", "model_fingerprint",
           "hardware_fingerprint", "objective", "seq_len", "request", "plan"]
_NEW_COLUMNS = [c for c in COLUMNS if c not in COLUMNS_V1]

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


__all__ = ["BUSY_TIMEOUT_S", "COLUMNS", "COLUMNS_V1", "KEY_VERSION", "SCHEMA", "PlanStore", "default_cache_location",
           "default_cache_path", "is_url", "request_key", "row_fields", "warn_once"]
