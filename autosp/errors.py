"""Errors that reach the user as one line and a documented exit code, never a traceback."""


class AutospError(Exception):
    """Base class: the message is one line that says what to do."""

    exit_code = 1


class UsageError(AutospError):
    """Bad input: unknown model or hardware, malformed numbers, unreadable files, invalid plans."""

    exit_code = 2


class InfeasibleError(AutospError):
    """The request is well-formed but no plan fits the hardware."""

    exit_code = 3


EXIT_CODES = {
    0: "success",
    1: "internal error (a bug: please report it)",
    2: "usage error: bad arguments or unreadable input",
    3: "no feasible plan: the request does not fit the hardware",
}


__all__ = ["EXIT_CODES", "AutospError", "InfeasibleError", "UsageError"]
