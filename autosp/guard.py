"""The last line of defence of ``autosp-plan``, ``autosp-train`` and ``autosp-calibrate``: whatever goes
wrong, the user reads one line and gets a documented exit code, never a Python traceback.

- :class:`~autosp.errors.AutospError` (bad input 2, no plan fits 3, ...): its message, on one line.
- Running out of memory: one line saying so, exit 3 for device memory (what was asked does not fit) and
  1 for host memory.
- Ctrl-C: ``interrupted``, exit 130. A reader that closes the pipe (``autosp-plan ... | head``): quiet,
  exit 141 as if killed by SIGPIPE.
- Anything else is a bug in autosp: one line naming the exception, where it was raised and the command
  that triggered it, where to report it, and a details file holding the full traceback; exit 1.
  ``AUTOSP_TRACEBACK=1`` prints the traceback instead (for developers).

Under a multi-process launch (``RANK`` set, as torchrun does) only rank 0 reports an AutospError: every
rank runs the same checks on the same input, and one message is enough. An unexpected error may differ
between ranks, so each rank reports its own, prefixed with its rank.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback

from autosp.errors import AutospError
from autosp.messages import MAX_LINE, one_line

__all__ = ["EXIT_BUG", "EXIT_INTERRUPTED", "EXIT_PIPE", "report_destination", "run_command"]

EXIT_BUG, EXIT_INTERRUPTED, EXIT_PIPE = 1, 130, 141
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)
"""A write the disk, the quota or the device refused: the machine's state, not a bug (a full stdout included)."""
_OUT_OF_DEVICE_MEMORY = ("OutOfMemoryError",)  # torch.OutOfMemoryError (CUDA), named so torch is not imported


def report_destination() -> str:
    """Where to report a bug: the package's ``Issues`` project URL when the installed metadata has one."""
    try:
        from importlib import metadata

        for entry in metadata.metadata("autosp").get_all("Project-URL") or ():
            label, _, url = entry.partition(",")
            if label.strip().lower() in ("issues", "bug tracker", "bugs"):
                return url.strip()
    except Exception:  # noqa: BLE001 - no metadata (a source tree): the generic destination
        pass
    return "the autosp issue tracker"


def _rank() -> int | None:
    try:
        return int(os.environ["RANK"]) if "RANK" in os.environ else None
    except ValueError:
        return None


def _where(err: BaseException) -> str:
    """'file.py:123 in function' of the innermost frame of autosp's own code (else the innermost)."""
    import sysconfig

    libraries = tuple(p for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "purelib", "platlib")} if p)
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.endswith(f"autosp{os.sep}guard.py")]

    def is_ours(name: str) -> bool:  # autosp's code, installed or from a source tree; not a library's or Python's
        return f"{os.sep}autosp{os.sep}" in name or not name.startswith(libraries)

    ours = [f for f in frames if is_ours(f.filename)]
    frame = (ours or frames or [None])[-1]
    if frame is None:
        return "?"
    parts = frame.filename.replace(os.sep, "/").split("/")
    return f"{'/'.join(parts[-2:])}:{frame.lineno} in {frame.name}"


def _details_file(prog: str, argv, err: BaseException) -> str | None:
    """Write the traceback, the command and the versions to a temporary file; its path (None if it failed)."""
    import platform
    import tempfile

    from autosp.version import __version__

    try:
        fd, path = tempfile.mkstemp(prefix=f"{prog}-crash-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(f"command: {prog} {' '.join(argv)}\n")
            f.write(f"autosp {__version__}, Python {platform.python_version()}, {platform.platform()}\n")
            for name in ("torch", "deepspeed", "transformers", "optuna", "numpy"):
                module = sys.modules.get(name)
                if module is not None:
                    f.write(f"{name} {getattr(module, '__version__', '?')}\n")
            f.write("\n")
            f.write("".join(traceback.format_exception(type(err), err, err.__traceback__)))
        return path
    except OSError:
        return None


def _say(prog: str, text: str, rank: int | None, everywhere: bool, limit: int = MAX_LINE) -> None:
    if rank not in (None, 0) and not everywhere:
        return
    prefix = f"{prog}: " if rank is None or not everywhere else f"{prog} [rank {rank}]: "
    try:
        print(prefix + one_line(text, limit), file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr itself is gone: nothing left to tell
        pass


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def run_command(prog: str, main, argv=None) -> int:
    """Run ``main(argv)`` and turn every way it can fail into one line and an exit code."""
    shown = list(sys.argv[1:] if argv is None else argv)
    rank = _rank()
    try:
        code = int(main(argv) or 0)
        sys.stdout.flush()  # a full disk or a closed pipe behind stdout shows here, not at the interpreter's exit
        return code
    except AutospError as err:
        _say(prog, f"error: {err}", rank, everywhere=False)
        return err.exit_code
    except KeyboardInterrupt:
        _say(prog, "interrupted", rank, everywhere=False)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_PIPE
    except SystemExit:
        raise  # --help, --version: argparse's own, deliberate exits
    except OSError as err:
        if err.errno not in _FULL:
            return _bug(prog, shown, err, rank)
        if err.filename is None:  # standard output (or error): nothing more will be written to it
            _silence_stdout()
        where = err.filename or "standard output"
        _say(prog, f"error: cannot write {where}: {err.strerror or err} (errno {err.errno}); free some space or "
                   "write elsewhere", rank, everywhere=True)
        return EXIT_BUG
    except MemoryError:
        _say(prog, "error: ran out of host memory; ask for less (a shorter --ctx, fewer --ranks or trials) or use "
                   "a machine with more memory", rank, everywhere=True)
        return EXIT_BUG
    except Exception as err:  # noqa: BLE001 - the point of this module
        return _bug(prog, shown, err, rank)


def _bug(prog: str, shown: list, err: Exception, rank: int | None) -> int:
    """Out of device memory (exit 3), or a bug in autosp: one line, a details file, exit 1."""
    if type(err).__name__ in _OUT_OF_DEVICE_MEMORY:
        _say(prog, f"error: out of device memory ({one_line(err, 200)}); the run does not fit this device: "
                   "re-plan for it with autosp-plan --hw (or a calibrated hardware file)", rank, everywhere=True)
        return 3
    if os.environ.get("AUTOSP_TRACEBACK") == "1":
        traceback.print_exception(type(err), err, err.__traceback__)
        return EXIT_BUG
    details = _details_file(prog, shown, err)
    message = one_line(f"{type(err).__name__}: {err}", 200)
    command = one_line(" ".join(shown), 160) or "(no arguments)"
    _say(prog, f"internal error: {message} (at {_where(err)}; input: {command}). This is a bug in autosp: "
               f"please report it to {report_destination()} with this line"
               + (f" and {details}" if details else "")
               + " (AUTOSP_TRACEBACK=1 prints the traceback)", rank, everywhere=True, limit=2 * MAX_LINE)
    return EXIT_BUG
