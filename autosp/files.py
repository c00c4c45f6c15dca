"""Reading inputs and writing outputs safely, for every autosp command.

Writing (``--plan-out``, ``--ds-config``, ``--best-out``, ``autosp-plan sweep --plot``, ``autosp-calibrate --out``, ``autosp-train
--log-json``):

- only to a regular file, new or existing; a directory, device node, named pipe or socket at the path is
  refused with one line (a command must never replace ``/dev/...`` or feed a pipe a half-written plan);
- a symbolic link is followed: the file it points to is replaced, the link stays a link;
- atomically: the text goes to a temporary file in the target's own directory (same filesystem), is
  flushed to disk, then renamed over the target, so a reader sees the old file or the new one, never a
  part; a failure removes the temporary file;
- with the mode the file would get from ``open(path, "w")``: an existing file keeps its permission bits,
  a new one gets ``0666 & ~umask``;
- :func:`check_output` answers "could this be written?" before any work is done (by creating and removing
  a probe file: permission bits do not tell root the truth), so a bad path fails in a second, not after
  an hour of search or measurement.

Reading (plans, DeepSpeed configs, hardware and model files): :func:`read_text` refuses directories,
pipes and devices (opening a named pipe would block forever), files too large to be what they claim,
and bytes that are not UTF-8 text, each with one line naming the file. Every failure is a
:class:`~autosp.errors.UsageError`.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile

from autosp.errors import UsageError

__all__ = ["MAX_INPUT_BYTES", "check_output", "file_kind", "read_json", "read_text", "write_bytes", "write_text"]

MAX_INPUT_BYTES = 64 * 2**20
"""Plans, configs and profiles are kilobytes; a bigger input is the wrong file (and reading a multi-GB
file into memory to find that out is the unbounded work this module refuses)."""


def file_kind(mode: int) -> str:
    """'a directory', 'a named pipe (FIFO)', ... for an ``st_mode``; 'a regular file' for one."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _label(flag: str, path) -> str:
    return f"{flag} {path}" if flag else str(path)


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask can only set it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _target(path, flag: str) -> tuple[str, os.stat_result | None]:
    """(the real path a write lands on, its stat or None when it does not exist yet)."""
    text = os.fspath(path)
    if not text or "\0" in text:
        raise UsageError(f"{_label(flag, repr(text))}: not a usable file name")
    real = os.path.realpath(text)  # follow symbolic links: replace the file, keep the link
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return real, None
    except OSError as err:
        raise UsageError(f"{_label(flag, text)}: cannot use this path: {err.strerror or err}") from None
    if not stat.S_ISREG(st.st_mode):
        hint = "; give a file name inside it" if stat.S_ISDIR(st.st_mode) else ""
        raise UsageError(f"{_label(flag, text)}: is {file_kind(st.st_mode)}, not a regular file; autosp writes "
                         f"regular files only{hint}")
    return real, st


def check_output(path, flag: str = "") -> None:
    """Fail now, with one line, if :func:`write_text` could not write ``path`` later."""
    real, _ = _target(path, flag)
    probe_dir = os.path.dirname(real)
    while not os.path.lexists(probe_dir):  # write_text creates missing parent directories
        probe_dir = os.path.dirname(probe_dir)
    if not os.path.isdir(probe_dir):
        raise UsageError(f"{_label(flag, path)}: cannot create it: {probe_dir} is not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=probe_dir, prefix=".autosp-probe-"):
            pass
    except OSError as err:
        raise UsageError(f"cannot write {_label(flag, path)}: {probe_dir}: {err.strerror or err}") from None


def write_text(path, text: str, flag: str = "") -> None:
    """Replace ``path`` with ``text`` atomically (see the module docstring); UsageError on failure."""
    write_bytes(path, text.encode("utf-8"), flag)


def write_bytes(path, data: bytes, flag: str = "") -> None:
    """Replace ``path`` with ``data`` atomically (a PNG, ...; see the module docstring); UsageError on failure."""
    real, st = _target(path, flag)
    directory = os.path.dirname(real)
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(real)}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, real)
        tmp = None
    except OSError as err:
        where = f"{_label(flag, path)}" if flag else f"{path}"
        raise UsageError(f"cannot write {where}: {err.strerror or err}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def cache_subdir(name: str):
    """autosp's cache folder ``name``: ``$AUTOSP_CACHE_DIR/name``, else ``$XDG_CACHE_HOME/autosp/name``, else
    ``~/.cache/autosp/name`` (a Path; not created)."""
    from pathlib import Path

    override = os.environ.get("AUTOSP_CACHE_DIR")
    if override:
        return Path(override).expanduser() / name
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autosp" / name


def make_cache_dirs(path) -> None:
    """``mkdir -p path`` for a cache, except that a home directory that does not exist (``HOME=/nonexistent``,
    a service account) is never created: an OSError, which a cache turns into "off, with one warning"."""
    from pathlib import Path

    home = Path(os.path.expanduser("~"))
    target = Path(path)
    if not home.is_dir() and (target == home or home in target.parents):
        raise FileNotFoundError(errno.ENOENT, f"the home directory {home} does not exist (set XDG_CACHE_HOME or "
                                              "AUTOSP_CACHE to keep a cache)", str(home))
    target.mkdir(parents=True, exist_ok=True)


def read_text(path, what: str = "", *, missing_hint: str = "", allow_bom: bool = True,
              limit: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of the regular file ``path``. ``what`` names it in errors ("plan ", "cluster file ").

    A leading UTF-8 byte-order mark is dropped, or refused with ``allow_bom=False`` (for files another
    library reads after us and would choke on)."""
    label = f"{what}{os.fspath(path)}"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"cannot read {label}: it does not exist{missing_hint}") from None
    except OSError as err:
        raise UsageError(f"cannot read {label}: {err.strerror or err}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{label} is {file_kind(st.st_mode)}, not a file{missing_hint if stat.S_ISDIR(st.st_mode) else ''}")
    if st.st_size > limit:
        raise UsageError(f"{label} is {st.st_size / 2**20:,.0f} MiB, more than any {what.strip() or 'input'} "
                         f"autosp reads ({limit // 2**20} MiB); is it the right file?")
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as err:
        if err.errno == errno.EISDIR:
            raise UsageError(f"{label} is a directory, not a file") from None
        raise UsageError(f"cannot read {label}: {err.strerror or err}") from None
    if data.startswith(b"\xef\xbb\xbf"):
        if not allow_bom:
            raise UsageError(f"{label} starts with a UTF-8 byte-order mark, which transformers cannot read; "
                             "save it as plain UTF-8 (without BOM)")
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{label} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); "
                         "is it the right file?") from None


def read_json(path, what: str = "", **options):
    """The JSON value in ``path`` (see :func:`read_text`); malformed JSON is one line with its line number."""
    text = read_text(path, what, **options)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{what}{os.fspath(path)} is not valid JSON (line {err.lineno}): {err.msg}") from None
    except ValueError as err:  # e.g. an integer longer than Python converts
        raise UsageError(f"{what}{os.fspath(path)} is not valid JSON: {err}") from None
    except RecursionError:
        raise UsageError(f"{what}{os.fspath(path)} nests JSON too deeply to be a real file") from None
