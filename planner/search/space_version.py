"""The search space's version stamp, without importing the space.

Plan caches key on :data:`SPACE_VERSION`, so a cache hit needs it; importing :mod:`autosp.planner.search.space`
(and the cost-model shapes it builds on) only for this stamp would cost a hit more than the lookup itself.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SPACE_REVISION = 6
"""Bump by hand when the meaning of the space changes; the source hash below catches the rest."""

SPACE_VERSION = f"{SPACE_REVISION}-{hashlib.sha256(Path(__file__).with_name('space.py').read_bytes()).hexdigest()[:10]}"
"""The revision and a hash of space.py (the file with the space's rules): changes whenever that file does."""

__all__ = ["SPACE_REVISION", "SPACE_VERSION"]
