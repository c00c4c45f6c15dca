"""The search space's version stamp, without importing the space.

Plan caches key on :data:`SPACE_VERSION`, so a cache hit needs it; importing :mod:`autosp.planner.search.space`
(and the cost-model shapes it builds on) only for this stamp would cost a hit more than the lookup itself.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

SPACE_REVISION = 7
"""Bump by hand when the meaning of the space changes; the source hash below catches the rest."""

RULE_SOURCES = (Path(__file__).with_name("space.py"), Path(importlib.util.find_spec("autosp.contract.rules").origin))
"""The files with the space's rules: space.py and the knob rule table (found, not imported)."""

SPACE_VERSION = f"{SPACE_REVISION}-{hashlib.sha256(b''.join(p.read_bytes() for p in RULE_SOURCES)).hexdigest()[:10]}"
"""The revision and a hash of :data:`RULE_SOURCES`: changes whenever one of them does."""

__all__ = ["RULE_SOURCES", "SPACE_REVISION", "SPACE_VERSION"]
