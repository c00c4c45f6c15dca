"""What every ``autosp-plan`` command line shares: a parser whose errors are one-line usage errors (exit 2),
and the check that an output path can be written before any work starts."""

from __future__ import annotations

import argparse
import os

from autosp.errors import UsageError


class ArgParser(argparse.ArgumentParser):
    """argparse, but errors become one-line UsageErrors."""

    def error(self, message):
        raise UsageError(message)


def check_output_path(path: str, flag: str) -> None:
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a directory; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    probe = parent
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK):
        raise UsageError(f"{flag} {path}: cannot write in {probe}")


__all__ = ["ArgParser", "check_output_path"]
