"""Measuring a machine for the cost model (``autosp-calibrate``).

One concern per module:

- :mod:`.settings` — what is measured: shapes, message sizes and repeats for ``--quick`` and full runs.
- :mod:`.timing` — timing an operation on CPU or GPU (warm-up, inner loops, medians).
- :mod:`.compute` — matmul, linear forward+backward, causal SDPA attention and memory-copy throughput.
- :mod:`.collectives` — all-to-all, all-reduce, all-gather, reduce-scatter times per group and message size.
- :mod:`.memory` — usable memory per rank and host<->device bandwidth.
- :mod:`.fit` — the alpha-beta (latency-bandwidth) least-squares fit and bus-bandwidth factors.
- :mod:`.limits` — how many ranks and threads this machine can hold, checked before any is started.
- :mod:`.launch` — running the measurement on N ranks (spawned here, or under torchrun).
- :mod:`.profile` — turning raw measurements into a :class:`HardwareSpec`, its sidecar and a summary.
- :mod:`.progress` — the progress bar on stderr.

Importing this package, :mod:`.fit`, :mod:`.settings`, :mod:`.limits`, :mod:`.profile` or :mod:`.progress` does not import
torch; the measuring modules do. See docs/calibration.md for what every profile field means.
"""
