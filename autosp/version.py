"""The package version, read from the installed distribution's metadata.

A cache hit of ``autosp-plan`` needs the version (it is part of the plan cache's key), and importing
``importlib.metadata`` costs about 50 ms (it imports email, zipfile, csv...), a third of a cache hit's
budget. So the version is first read straight from the ``Version:`` line of the distribution's METADATA file
(``autosp-<version>.dist-info`` on ``sys.path``, the file ``importlib.metadata`` itself reads); only when
that finds nothing unambiguous does ``importlib.metadata`` answer.
"""

from __future__ import annotations

import os
import sys


def _from_dist_info() -> str | None:
    """The version in the first ``autosp-*.dist-info/METADATA`` on ``sys.path`` (sys.path order, as
    importlib.metadata searches), or None when there is none or it is unreadable."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        found = [n for n in names if n.lower().startswith("autosp-") and n.endswith(".dist-info")]
        if len(found) != 1:  # none here, or several (a stale install beside the live one): let importlib decide
            if found:
                return None
            continue
        try:
            with open(os.path.join(entry or ".", found[0], "METADATA"), encoding="utf-8") as handle:
                for line in handle:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip() or None
                    if not line.strip():  # the headers end at the first blank line
                        break
        except OSError:
            return None
        return None
    return None


def _read_version() -> str:
    fast = _from_dist_info()
    if fast is not None:
        return fast
    from importlib import metadata

    try:
        return metadata.version("autosp")
    except metadata.PackageNotFoundError:  # running from a source tree without an install
        return "0.0.0+source"


__version__ = _read_version()


__all__ = ["__version__"]
