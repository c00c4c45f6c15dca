"""Cheap identities: of a token array, for data sources' ``fingerprint()`` (what a checkpoint records), and of
the files of a text dataset, for the token cache's key.

Neither reads everything: a token file or corpus can be many GB, and hashing all of it at every run costs
minutes where a few MB tell two versions apart in practice.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

SAMPLE = 1 << 20
"""Tokens hashed from each end: a token file can be many GB, and reading it all at every resume is not needed
to tell two files apart in practice (their lengths and ends differ)."""

BLOCK = 64 << 10
BLOCKS = 16
"""A data file is identified by its size, modification time and the sha256 of ``BLOCKS`` evenly spaced blocks
of ``BLOCK`` bytes (the first and the last among them; a file of at most 1 MiB whole): an edit changes the
mtime, an append the size and the last block, a copy (``cp`` sets a new mtime) is tokenized again."""


def token_array_key(tokens) -> str:
    """Length, dtype and the sha256 of the first and last :data:`SAMPLE` tokens; ``synthetic`` for None."""
    if tokens is None:
        return "synthetic"
    head = np.asarray(tokens[:SAMPLE]).tobytes()
    tail = np.asarray(tokens[-SAMPLE:]).tobytes()
    digest = hashlib.sha256(f"{len(tokens)}:{np.asarray(tokens[:1]).dtype}".encode() + head + tail)
    return digest.hexdigest()[:32]


def _sample(file: str, size: int, digest) -> None:
    with open(file, "rb") as f:
        if size <= BLOCK * BLOCKS:
            digest.update(f.read())
            return
        for i in range(BLOCKS):
            f.seek(i * (size - BLOCK) // (BLOCKS - 1))
            digest.update(f.read(BLOCK))


def data_identity(path: str) -> str:
    """sha256 over every file of ``path`` (a file, or a directory's files by relative name): size, mtime and a
    sample of its bytes (:data:`BLOCKS`). The file's own name plays no part, so a renamed file (``mv`` keeps the
    mtime) keeps its identity."""
    digest = hashlib.sha256()
    if os.path.isfile(path):
        files = [(path, "")]
    else:
        files = sorted((os.path.join(root, name), os.path.relpath(os.path.join(root, name), path))
                       for root, _, names in os.walk(path) for name in names)
    for file, name in files:
        stat = os.stat(file)
        digest.update(json.dumps([name, stat.st_size, stat.st_mtime_ns]).encode())
        _sample(file, stat.st_size, digest)
    return digest.hexdigest()


__all__ = ["BLOCK", "BLOCKS", "SAMPLE", "data_identity", "token_array_key"]
