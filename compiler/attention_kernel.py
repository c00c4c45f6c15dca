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

Pure functions over plain values (the device's capability, the cuDNN version, whether a package imports), so the
selection is tested on CPU (tests/compiler/test_attention_kernel.py); :func:`machine` reads them from torch.
"""

from __future__ import annotations

from dataclasses import dataclass

CUDNN_PREFERRED_FROM = 91501
"""cuDNN 9.15.1: from this version SDPA prefers its cuDNN backend on sm90/sm100 (torch sdp_utils.cpp)."""


@dataclass(frozen=True)
class Machine:
    """What decides the attention kernels a process can run."""

    device: str                 # "cuda" or "cpu"
    capability: tuple = (0, 0)  # CUDA compute capability (major, minor)
    cudnn_version: int = 0      # torch.backends.cudnn.version(), 0 when absent
    flash3_package: bool = False  # flash_attn_interface (FlashAttention-3) imports
    flex: bool = True           # torch.nn.attention.flex_attention exists


def available(m: Machine) -> tuple[str, ...]:
    """The kernels this machine runs, its default first."""
    if m.device != "cuda":
        return ("cpu",)
    major = m.capability[0]
    kernels = []
    prefer_cudnn = major in (9, 10) and m.capability[1] == 0 and m.cudnn_version >= CUDNN_PREFERRED_FROM
    if prefer_cudnn:
        kernels.append("cudnn")
    if major >= 8:
        kernels.append("flash2")
    if major == 9 and m.flash3_package:
        kernels.append("flash3")
    if major >= 8 and m.cudnn_version and not prefer_cudnn:
        kernels.append("cudnn")
    if m.flex:
        kernels.append("flex")
    return tuple(kernels) or ("efficient",)


def choose(planned: str | None, m: Machine) -> tuple[str, str | None]:
    """(the kernel that runs, a warning or None): the plan's kernel when the machine has it, else the machine's
    default with a one-line warning naming both."""
    kernels = available(m)
    if not planned or planned in kernels:
        return (planned or kernels[0]), None
    return kernels[0], (f"the plan was priced for the {planned} attention kernel, which this machine does not run "
                        f"({m.device}{'' if m.device != 'cuda' else ' sm%d%d' % tuple(m.capability)}); {kernels[0]} "
                        f"will run, so the step time will differ from the plan's prediction")


SDPA_BACKENDS = {"cudnn": ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"),
                 "flash2": ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"),
                 "efficient": ("EFFICIENT_ATTENTION", "MATH"),
                 "cpu": ("FLASH_ATTENTION", "MATH")}
"""SDPA backends, in order, for each kernel SDPA runs (a shape one backend refuses falls to the next); flash3 and
flex are not SDPA backends (their own entry points), so SDPA calls keep the machine's default order there."""


def sdpa_backends(kernel: str) -> tuple[str, ...] | None:
    """SDPBackend member names to run SDPA with for ``kernel`` (None: leave SDPA's own order)."""
    return SDPA_BACKENDS.get(kernel)


def machine() -> Machine:
    """This process's machine (imports torch)."""
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        return Machine(device="cpu")
    return Machine(device="cuda", capability=tuple(torch.cuda.get_device_capability()),
                   cudnn_version=int(torch.backends.cudnn.version() or 0),
                   flash3_package=importlib.util.find_spec("flash_attn_interface") is not None,
                   flex=importlib.util.find_spec("torch.nn.attention.flex_attention") is not None)


__all__ = ["CUDNN_PREFERRED_FROM", "Machine", "SDPA_BACKENDS", "available", "choose", "machine", "sdpa_backends"]
