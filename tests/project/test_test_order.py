"""The suite's file order (tests/conftest.py's LONGEST_FIRST) names files that exist: a renamed test file would
otherwise drop out of the list silently and run last."""

from __future__ import annotations

from pathlib import Path

import conftest

ROOT = Path(__file__).resolve().parents[2]


def test_every_longest_first_file_exists():
    missing = [path for path in conftest.LONGEST_FIRST if not (ROOT / path).is_file()]
    assert missing == []
    assert len(set(conftest.LONGEST_FIRST)) == len(conftest.LONGEST_FIRST)
