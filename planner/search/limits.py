"""The searches' limits: how many sampler trials one runs, and the resolution and range of the longest-context search
(a module of its own so that a request's checks read them without importing the searches, which a cache hit never
runs: ~10 ms of its ~0.15 s).
"""

from __future__ import annotations

DEFAULT_TRIALS = 60
MAX_TRIALS = 10_000
"""The most sampler trials one search runs. TPE's cost per trial grows with the trials before it
(llama at 200k on h100x8: 300 trials 2.4 s, 1,000 trials 15 s; 10,000 about 20 minutes), so a longer
search is asked for by time (``time_budget``), not by count."""

CTX_GRANULE = 1024
"""Resolution of the max-ctx search, in tokens."""

MAX_CTX = 2**34
"""Upper end of the max-ctx search (17 billion tokens)."""

__all__ = ["CTX_GRANULE", "DEFAULT_TRIALS", "MAX_CTX", "MAX_TRIALS"]
