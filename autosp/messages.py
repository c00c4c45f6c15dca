"""Keeping what reaches a terminal to one readable line.

Error and warning texts often embed text autosp does not control (a library's exception, a file's
contents, a database driver's report, an argument the user typed): they can span lines or run to
thousands of characters. :func:`one_line` folds such a text onto one line and shortens it, so a warning
stays a line and an error stays an error message.
"""

from __future__ import annotations

import re

__all__ = ["MAX_LINE", "install_hint", "one_line", "shorten"]

MAX_LINE = 400
"""The longest message one line carries (a few terminal lines at most); longer ones are cut in the middle
(the start says what failed, the end often says why)."""

_BLANKS = re.compile(r"\s+")


def shorten(text: str, limit: int) -> str:
    """``text`` cut to at most about ``limit`` characters, keeping its start and end."""
    if len(text) <= limit:
        return text
    keep = max(limit - 30, 10)
    head, tail = keep * 2 // 3, keep - keep * 2 // 3
    return f"{text[:head]} ...[{len(text) - head - tail:,} characters cut]... {text[-tail:]}"


def one_line(text, limit: int = MAX_LINE) -> str:
    """``text`` (anything ``str()`` accepts) on one line: blanks and line breaks folded, shortened."""
    return shorten(_BLANKS.sub(" ", str(text)).strip(), limit)


def install_hint(extra: str) -> str:
    """How to add an optional extra. autosp is installed from its source tree (it is not on a package
    index, and ``pip install 'autosp[...]'`` would fetch whatever else is published under that name)."""
    return f"install autosp's [{extra}] extra: pip install -e '.[{extra}]' in the autosp source tree"
