"""The token cache on disk: where entries live, reading one, and building one safely among processes.

An entry is a directory named by its key holding ``tokens.bin`` (``int32``), ``starts.bin`` (``int64``) and
``meta.json`` (:mod:`autosp.compiler.data.tokenizing`). It appears by one atomic rename of a temporary directory
``.tmp-KEY-*`` once its files are written and flushed, so a run killed while tokenizing leaves no entry; the next
process to build that key removes such leftovers.

Processes that want the same key (every rank of a torchrun job, on every node sharing the cache) take a file lock,
``.KEY.lock``: the first tokenizes, the others wait on the lock. A lock rather than a ``torch.distributed``
barrier, because the data is prepared before any process group exists (before a model is built, so a bad
corpus costs seconds, not a model load), the waiters need no timeout (the kernel releases the lock of a process
that dies, however it dies: the next waiter then builds the entry itself), and it also serialises independent
runs that share a cache. A build that fails leaves ``.KEY.failed`` (its one-line error): the processes that were
waiting for it raise that error instead of failing the same way one after another; a later run ignores it.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import shutil
import tempfile

import numpy as np

from autosp.errors import UsageError

FORMAT = "autosp-tokens-2"
"""Bump when what a cache entry holds changes (old entries are then ignored). 2: int32 ``tokens.bin`` and
``starts.bin`` written window by window (1: ``.npy`` arrays built in memory)."""


def cache_root() -> str:
    override = os.environ.get("AUTOSP_DATA_CACHE")
    if override:
        return os.path.expanduser(override)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "autosp", "tokens")


def _unwritable(root: str, err: OSError) -> UsageError:
    return UsageError(f"cannot write the token cache {root}: {err.strerror or err} (set AUTOSP_DATA_CACHE to a "
                      "writable directory)")


def read_entry(directory: str):
    """(tokens, starts, meta) of a complete entry, memory-mapped; None if there is none (or it is damaged)."""
    from autosp.compiler.data.tokenizing import START_DTYPE, TOKEN_DTYPE

    try:
        with open(os.path.join(directory, "meta.json")) as f:
            meta = json.load(f)
        if meta.get("format") != FORMAT:
            return None
        tokens_path, starts_path = os.path.join(directory, "tokens.bin"), os.path.join(directory, "starts.bin")
        n, docs = int(meta["tokens"]), int(meta["documents"])
        if (os.path.getsize(tokens_path) != n * np.dtype(TOKEN_DTYPE).itemsize
                or os.path.getsize(starts_path) != (docs + 1) * np.dtype(START_DTYPE).itemsize or n == 0):
            return None
        tokens = np.memmap(tokens_path, dtype=TOKEN_DTYPE, mode="r")
        starts = np.memmap(starts_path, dtype=START_DTYPE, mode="r")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if int(starts[0]) != 0 or int(starts[-1]) != n:
        return None
    return tokens, starts, meta


class Build:
    """Holding the key's lock: ``waited`` (whether another process held it first) and :meth:`temporary`."""

    def __init__(self, root: str, key: str, waited: bool, failure_before):
        self.root, self.key, self.waited, self.failure_before = root, key, waited, failure_before
        self.failure = failure_path(root, key)

    def failed_meanwhile(self) -> str | None:
        """The error of a build that failed while this process waited for it (None for an older one: the
        failure file is replaced, a new inode, at every failure)."""
        if not self.waited or _signature(self.failure) in (None, self.failure_before):
            return None
        try:
            with open(self.failure) as f:
                return f.read().strip()
        except OSError:
            return None

    def record_failure(self, message: str) -> None:
        with contextlib.suppress(OSError):
            tmp = f"{self.failure}.{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(message + "\n")
            os.replace(tmp, self.failure)

    @contextlib.contextmanager
    def temporary(self, directory: str):
        """A fresh ``.tmp-KEY-*`` directory beside ``directory``, renamed to it if the block completes and
        removed otherwise (with any a killed build left: none is in use while this process holds the lock)."""
        for stale in glob.glob(os.path.join(self.root, f".tmp-{self.key}-*")):
            shutil.rmtree(stale, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.remove(self.failure)
        try:
            tmp = tempfile.mkdtemp(dir=self.root, prefix=f".tmp-{self.key}-")
        except OSError as err:
            raise _unwritable(self.root, err) from None
        try:
            yield tmp
            os.rename(tmp, directory)
            tmp = None
        except OSError as err:
            raise _unwritable(self.root, err) from None
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)


def failure_path(root: str, key: str) -> str:
    return os.path.join(root, f".{key}.failed")


def _signature(path: str):
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


@contextlib.contextmanager
def building(root: str, key: str, on_wait):
    """Hold ``key``'s lock for a build; ``on_wait()`` is called once if another process holds it now."""
    try:
        os.makedirs(root, exist_ok=True)
        lock = open(os.path.join(root, f".{key}.lock"), "w")
    except OSError as err:
        raise _unwritable(root, err) from None
    with lock:
        waited, before = False, None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited, before = True, _signature(failure_path(root, key))
            on_wait()
            fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel however its holder ends
        yield Build(root, key, waited, before)


__all__ = ["Build", "FORMAT", "building", "cache_root", "read_entry"]
