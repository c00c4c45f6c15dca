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
    """Before any search: refuse a directory, device, pipe or unwritable place (:func:`autosp.files.check_output`)."""
    from autosp.files import check_output

    check_output(path, flag)


def request_fields(args, given_only: bool = False) -> dict:
    """The :class:`~autosp.planner.request.PlanRequest` fields among the parsed arguments (the flags are named
    after the fields: ``--global-batch`` sets ``global_batch``); ``given_only``: leave out those not given."""
    from dataclasses import fields

    from autosp.planner.request import PlanRequest

    out = {f.name: getattr(args, f.name) for f in fields(PlanRequest) if hasattr(args, f.name)}
    return {k: v for k, v in out.items() if v is not None and v is not False} if given_only else out


__all__ = ["ArgParser", "check_output_path", "request_fields"]
