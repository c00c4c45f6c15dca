"""A cheap identity of a token array, for data sources' ``fingerprint()`` (what a checkpoint records)."""

from __future__ import annotations

import hashlib

import numpy as np

SAMPLE = 1 << 20
"""Tokens hashed from each end: a token file can be many GB, and reading it all at every resume is not needed
to tell two files apart in practice (their lengths and ends differ)."""


def token_array_key(tokens) -> str:
    """Length, dtype and the sha256 of the first and last :data:`SAMPLE` tokens; ``synthetic`` for None."""
    if tokens is None:
        return "synthetic"
    head = np.asarray(tokens[:SAMPLE]).tobytes()
    tail = np.asarray(tokens[-SAMPLE:]).tobytes()
    digest = hashlib.sha256(f"{len(tokens)}:{np.asarray(tokens[:1]).dtype}".encode() + head + tail)
    return digest.hexdigest()[:32]


__all__ = ["SAMPLE", "token_array_key"]
