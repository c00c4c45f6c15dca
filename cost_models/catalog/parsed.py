"""The catalogs' TOML files, parsed once per content and kept as JSON.

``tomllib`` is pure Python: parsing the two catalogs (models.toml, hardware.toml; ~16 kB each) and importing
the parser costs a plan cache hit about a fifth of its time, where reading the same data as JSON (a C parser)
costs well under a millisecond. So the parse is memoised in ``$AUTOSP_CACHE_DIR/catalogs/`` (else
``$XDG_CACHE_HOME/autosp/catalogs/``, else ``~/.cache/autosp/catalogs/``), one file per catalog named by the
SHA-256 of the TOML's bytes: an edited catalog has another name, so a stale memo is never read. A memo that
cannot be read or written (no home directory, a read-only disk, a damaged file) only means parsing the TOML
again; nothing here fails because of it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def memo_dir() -> Path:
    from autosp.files import cache_subdir

    return cache_subdir("catalogs")


def load_toml(path: Path) -> dict:
    """The parsed TOML file ``path`` (a catalog shipped with autosp): from its JSON memo when there is one."""
    data = path.read_bytes()
    memo = memo_dir() / f"{path.stem}-{hashlib.sha256(data).hexdigest()[:24]}.json"
    try:
        with open(memo, encoding="utf-8") as handle:
            parsed = json.load(handle)
        if isinstance(parsed, dict):
            return parsed
    except (OSError, ValueError):
        pass
    import tomllib

    parsed = tomllib.loads(data.decode("utf-8"))
    _write_memo(memo, parsed)
    return parsed


def _write_memo(memo: Path, parsed: dict) -> None:
    from autosp.errors import UsageError
    from autosp.files import make_cache_dirs, write_text

    try:
        make_cache_dirs(memo.parent)  # never creates a home directory that does not exist
        write_text(memo, json.dumps(parsed))  # atomic: a concurrent reader sees the old state or the whole file
    except (OSError, UsageError, TypeError, ValueError):  # TypeError: a value JSON cannot hold
        pass


__all__ = ["load_toml", "memo_dir"]
