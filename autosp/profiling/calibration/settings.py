"""What a calibration run measures: shapes, sequence lengths, message sizes and repeats.

Two presets per device: ``quick`` (about half a minute on a 2-core CPU with 2 ranks; a few seconds of
measuring on a GPU) and the full run (a few minutes). The *profile dtype* is the one whose figures go into
the HardwareSpec (bf16 on GPU, fp32 on CPU unless ``--dtype`` says otherwise); the other dtype is measured
on fewer shapes and only recorded in the sidecar.

Matmul shapes are ``(M, K, N)``: ``M`` tokens times a ``K x N`` weight, as in a transformer's projections
and MLP. The *training shape* (``linear``) is timed as ``F.linear`` forward + backward (three matmuls of
``2 M K N`` FLOP each) and is the one the efficiency factor comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class Settings:
    device: str  # "cpu" or "cuda"
    quick: bool
    profile_dtype: str
    matmul_shapes: dict = field(default_factory=dict)  # dtype -> [(M, K, N), ...]
    linear_shape: dict = field(default_factory=dict)  # dtype -> (M, K, N)
    attention_heads: int = 4
    attention_head_dim: int = 64
    attention_seq_lens: dict = field(default_factory=dict)  # dtype -> [S, ...]
    copy_bytes: int = 1 << 26  # device memory copy, per rank
    host_copy_bytes: int = 1 << 27  # pinned host <-> device, per rank (GPU only)
    host_stream_bytes: int = 1 << 27  # each of the host triad's three arrays, one rank per node (far beyond caches)
    message_sizes: tuple = ()  # bytes, per collective call (see fit.py for the convention)
    warmup: int = 1
    reps: int = 3
    comm_reps: int = 5  # collectives are noisier (every rank must be scheduled at once): more samples
    target_seconds: float = 0.01  # each timed sample loops the operation at least this long
    max_inner: int = 200  # ... but at most this many times

    def dtypes(self) -> tuple:
        """Profile dtype first, then the other one."""
        return (self.profile_dtype,) + tuple(d for d in DTYPES if d != self.profile_dtype)


def _sizes(lo_log2: int, hi_log2: int, step: int) -> tuple:
    return tuple(1 << e for e in range(lo_log2, hi_log2 + 1, step))


def make_settings(device: str, quick: bool, profile_dtype: str | None = None) -> Settings:
    """The preset for ``device`` ("cpu" or "cuda"); ``profile_dtype`` defaults to bf16 on GPU, fp32 on CPU."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    dtype = profile_dtype or ("bf16" if device == "cuda" else "fp32")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if device == "cpu":
        # bf16 matmul on CPUs without AVX512-BF16/AMX runs ~50x slower than fp32: keep its shapes small.
        fast, slow = ("fp32", "bf16") if dtype == "fp32" else ("bf16", "fp32")
        if quick:
            shapes = {"fp32": [(512, 512, 512), (1024, 1024, 1024), (1024, 1024, 2048)],
                      "bf16": [(256, 256, 256)]}
            linear = {"fp32": (1024, 1024, 2048), "bf16": (256, 256, 512)}
            seqs = {"fp32": [256, 512, 1024], "bf16": [256, 512]}
        else:
            shapes = {"fp32": [(512, 512, 512), (1024, 1024, 1024), (2048, 1024, 2048), (2048, 2048, 2048)],
                      "bf16": [(256, 256, 256), (512, 512, 512)]}
            linear = {"fp32": (2048, 1024, 2048), "bf16": (512, 512, 1024)}
            seqs = {"fp32": [512, 1024, 2048, 4096], "bf16": [512, 1024]}
        if dtype == "bf16":  # the user asked for a bf16 profile: give bf16 the bigger shapes
            shapes[fast], shapes[slow] = shapes["fp32"], shapes["bf16"]
            linear[fast], linear[slow] = linear["fp32"], linear["bf16"]
            seqs[fast], seqs[slow] = seqs["fp32"], seqs["bf16"]
        return Settings(
            device="cpu", quick=quick, profile_dtype=dtype, matmul_shapes=shapes, linear_shape=linear,
            attention_heads=4, attention_head_dim=64, attention_seq_lens=seqs,
            copy_bytes=(1 << 25) if quick else (1 << 27), host_copy_bytes=0,
            host_stream_bytes=(1 << 26) if quick else (1 << 27),
            message_sizes=_sizes(12, 22, 1) if quick else _sizes(10, 26, 1),
            warmup=1, reps=3 if quick else 7, comm_reps=7 if quick else 11,
            target_seconds=0.01 if quick else 0.05)
    if quick:
        shapes = {"bf16": [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 14336)],
                  "fp32": [(4096, 4096, 4096)]}
        linear = {"bf16": (16384, 4096, 14336), "fp32": (4096, 4096, 4096)}
        seqs = {"bf16": [4096, 16384, 32768], "fp32": [2048, 4096]}
    else:
        shapes = {"bf16": [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 14336),
                           (16384, 14336, 4096), (16384, 8192, 28672)],
                  "fp32": [(4096, 4096, 4096), (8192, 8192, 8192)]}
        linear = {"bf16": (16384, 4096, 14336), "fp32": (8192, 8192, 8192)}
        seqs = {"bf16": [4096, 16384, 32768, 65536], "fp32": [2048, 4096, 8192]}
    if dtype == "fp32":
        shapes["fp32"], linear["fp32"], seqs["fp32"] = shapes["bf16"], linear["bf16"], seqs["bf16"]
    return Settings(
        device="cuda", quick=quick, profile_dtype=dtype, matmul_shapes=shapes, linear_shape=linear,
        attention_heads=16 if quick else 32, attention_head_dim=128, attention_seq_lens=seqs,
        copy_bytes=(1 << 29) if quick else (1 << 30), host_copy_bytes=(1 << 27) if quick else (1 << 28),
        host_stream_bytes=(1 << 27) if quick else (1 << 28),
        message_sizes=_sizes(12, 28, 2) if quick else _sizes(10, 30, 1),
        warmup=2 if quick else 3, reps=5 if quick else 10, comm_reps=5 if quick else 10,
        target_seconds=0.01 if quick else 0.05)


__all__ = ["DTYPES", "Settings", "make_settings"]
