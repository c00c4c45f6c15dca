"""``autosp-train --save-dir DIR``: a directory of checkpoints, one per saved step, and a ``latest`` pointer.

::

    DIR/step-00000004/    a complete checkpoint (autosp.compiler.training.checkpoint)
    DIR/step-00000008/
    DIR/latest            "step-00000008", replaced atomically after the checkpoint it names is complete

``--resume`` loads the newest complete checkpoint: the one ``latest`` names when it is complete, else the
highest-numbered complete ``step-*`` (a run killed between the rename of a checkpoint and the update of
``latest`` loses nothing). ``--keep-last K`` removes the oldest complete checkpoints beyond K, and leftovers of
interrupted saves (``.step-*.partial``), only after a new checkpoint is complete.
"""

from __future__ import annotations

import os
import re
import shutil

from autosp.errors import UsageError

__all__ = ["LATEST", "check_save_dir", "checkpoint_bytes", "complete_checkpoints", "find_resume", "prune",
           "step_dir", "write_latest"]

LATEST = "latest"
_STEP = re.compile(r"^step-(\d{8,})$")
ADAM_STATES = 2  # exp_avg and exp_avg_sq next to the fp32 weight: what torch's and DeepSpeed's Adam keep
HEADROOM = 1.05  # DCP's per-tensor headers, .metadata, the RNG and engine states, meta.json


def step_dir(save_dir: str, step: int) -> str:
    return os.path.join(save_dir, f"step-{step:08d}")


def checkpoint_bytes(n_params: int) -> int:
    """The size of one checkpoint: fp32 weights and two fp32 Adam states per parameter."""
    return int(n_params * 4 * (1 + ADAM_STATES) * HEADROOM) + (1 << 20)


def complete_checkpoints(save_dir: str) -> list[tuple[int, str]]:
    """(step, path) of every step directory holding a meta.json, oldest first (completeness is checked in full
    when one is loaded)."""
    try:
        names = os.listdir(save_dir)
    except OSError:
        return []
    out = []
    for name in names:
        match = _STEP.match(name)
        path = os.path.join(save_dir, name)
        if match and os.path.isfile(os.path.join(path, "meta.json")):
            out.append((int(match.group(1)), path))
    return sorted(out)


def find_resume(save_dir: str) -> str:
    """The checkpoint ``--resume`` continues from; one line when there is none."""
    if not os.path.isdir(save_dir):
        raise UsageError(f"--resume: --save-dir {save_dir} does not exist, so there is no checkpoint to resume from")
    complete = complete_checkpoints(save_dir)
    try:
        with open(os.path.join(save_dir, LATEST), encoding="utf-8") as f:
            named = os.path.join(save_dir, f.read().strip())
    except OSError:
        named = None
    if named and any(path == named for _, path in complete):
        newest = complete[-1][1]
        return newest if newest > named else named
    if complete:
        return complete[-1][1]
    raise UsageError(f"--resume: {save_dir} holds no complete checkpoint (no step-*/meta.json); start without "
                     "--resume, or give the --save-dir of the run to continue")


def write_latest(save_dir: str, path: str) -> None:
    """Point ``latest`` at ``path`` atomically (temp file, fsync, rename, fsync the directory)."""
    from autosp.compiler.training.checkpoint import fsync_dir, write_file

    tmp = os.path.join(save_dir, f".{LATEST}.tmp")
    write_file(tmp, (os.path.basename(path) + "\n").encode())
    os.replace(tmp, os.path.join(save_dir, LATEST))
    fsync_dir(save_dir)


def prune(save_dir: str, keep_last: int | None) -> None:
    """Remove complete checkpoints beyond the newest ``keep_last`` and leftovers of interrupted saves."""
    for name in os.listdir(save_dir):
        if name.startswith(".step-") and (name.endswith(".partial") or name.endswith(".old")):
            shutil.rmtree(os.path.join(save_dir, name), ignore_errors=True)
    if keep_last:
        for _, path in complete_checkpoints(save_dir)[:-keep_last]:
            shutil.rmtree(path, ignore_errors=True)


def check_save_dir(save_dir: str, need_bytes: int) -> None:
    """--save-dir can be created, is a directory, is writable and has room for one checkpoint."""
    from autosp.files import file_kind

    if os.path.exists(save_dir) and not os.path.isdir(save_dir):
        raise UsageError(f"--save-dir {save_dir} is {file_kind(os.stat(save_dir).st_mode)}, not a directory")
    try:
        os.makedirs(save_dir, exist_ok=True)
        probe = os.path.join(save_dir, f".write-probe-{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"x")
        os.unlink(probe)
    except OSError as err:
        raise UsageError(f"--save-dir {save_dir} is not writable: {err.strerror or err}") from None
    free = shutil.disk_usage(save_dir).free
    if free < need_bytes:
        raise UsageError(f"--save-dir {save_dir} has {free / 2**30:,.2f} GiB free and one checkpoint of this model "
                         f"(fp32 weights and Adam states) needs about {need_bytes / 2**30:,.2f} GiB; free some space "
                         "or choose another directory")
