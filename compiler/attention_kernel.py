"""Which attention kernel runs on this machine, and what to say when the plan assumed another.

The planner prices attention by kernel (cost_models/catalog/attention_kernels.py: flash2, flash3, cudnn, flex) and
records the one it assumed in the plan (``hardware.attention_kernel``). Here the compiler decides which kernel it
runs, from what the machine has, with the same defaults as the planner: the plan's kernel when the machine offers
it, otherwise the machine's default -- cudnn on sm90/sm100 when torch's cuDNN is at least 9.15.1 (what SDPA itself
prefers there, ``check_prefer_cudnn_attention``), flash3 when the ``flash_attn_interface`` package is installed on
Hopper and the plan asks for it, flash2 (SDPA's FLASH_ATTENTION backend) on sm80 and up, flex wherever torch has
FlexAttention on CUDA -- and a plan that assumed a kernel the machine lacks gets one warning naming the kernel
that will run (its step time will differ from the prediction).

:func:`sdpa_backends` gives the ``torch.nn.attention.SDPBackend`` names to run SDPA with for a kernel
(``torch.nn.attention.sdpa_kernel``). On CPU there is no choice: SDPA's CPU flash kernel runs (``cpu``).

The selection itself (:func:`choose`, :func:`available`) lives with the planner's kernel table in
cost_models/catalog/attention_kernels.py, so planner, compiler and ``autosp-calibrate`` share one rule: pure
functions over plain values (the device's capability, the cuDNN version, whether a package imports), tested on CPU
(tests/compiler/test_attention_kernel.py); :func:`machine` reads them from torch.
"""

from __future__ import annotations

from autosp.cost_models.catalog.attention_kernels import CUDNN_PREFERRED_FROM, Machine, available, choose, machine_of

SDPA_BACKENDS = {"cudnn": ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"),
                 "flash2": ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"),
                 "efficient": ("EFFICIENT_ATTENTION", "MATH"),
                 "cpu": ("FLASH_ATTENTION", "MATH")}
"""SDPA backends, in order, for each kernel SDPA runs (a shape one backend refuses falls to the next); flash3 and
flex are not SDPA backends (their own entry points), so SDPA calls keep the machine's default order there."""


def sdpa_backends(kernel: str) -> tuple[str, ...] | None:
    """SDPBackend member names to run SDPA with for ``kernel`` (None: leave SDPA's own order)."""
    return SDPA_BACKENDS.get(kernel)


def sdpa_context(kernel: str | None):
    """A context in which SDPA calls run on ``kernel``'s backends first (a null context for None or a kernel that
    is not an SDPA backend: flash3, flex)."""
    import contextlib

    backends = sdpa_backends(kernel) if kernel else None
    if not backends:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, b) for b in backends], set_priority=True)


def machine() -> Machine:
    """This process's machine (imports torch)."""
    import torch

    return machine_of(torch)


__all__ = ["CUDNN_PREFERRED_FROM", "Machine", "SDPA_BACKENDS", "available", "choose", "machine", "sdpa_backends", "sdpa_context"]
