"""Reading and writing the files autosp's commands take and produce: one-line errors, never a half-written
file. Shared by the planner (plans, DeepSpeed configs), the calibration tool (hardware profiles) and the
CLIs."""

from __future__ import annotations

import json
import os
import tempfile

from autosp.errors import UsageError


def read_json(path: str | os.PathLike, what: str = ""):
    """The JSON in ``path``; unreadable or malformed files are a one-line UsageError naming ``what`` it is."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as err:
        raise UsageError(f"cannot read {what}{path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise UsageError(f"{what}{path} is not valid JSON (line {err.lineno}): {err.msg}") from None


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that a crash never leaves a half-written file behind."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".autosp-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror}") from None


__all__ = ["read_json", "write_text_atomically"]
