"""Attention kernels as part of the hardware file: which kernels each catalogued accelerator runs, how fast
each runs causal attention (forward + backward, as a fraction of the accelerator's dense bf16 peak), and which
one the compiler runs there by default; and, for a machine described by its CUDA capability, cuDNN version and
packages (:class:`Machine`), which kernels it runs (:func:`available`) and which one runs for a plan
(:func:`choose`: the compiler's start-up and ``autosp-calibrate`` use the same rule).

``attention_efficiency`` of a HardwareSpec prices *one* kernel, named by its ``attention_kernel``;
:func:`with_kernel` sets both from this table (``autosp-plan --attention-kernel``), and the plan records the
kernel it assumes. Blockwise (ring steps, sequence chunks) and per-document variants of a kernel are priced by
the block-efficiency model of cost_models/ring.py on top of the kernel's long-sequence figure.

Kernels (the names ``--attention-kernel`` takes):

- ``flash2``: FlashAttention-2 (Dao, arXiv 2307.08691); PyTorch SDPA's FLASH_ATTENTION backend runs it.
- ``flash3``: FlashAttention-3 (Shah et al., arXiv 2407.08608), Hopper only; the ``flash_attn_interface``
  package (the compiler uses it when it is installed).
- ``cudnn``: cuDNN fused attention, SDPA's CUDNN_ATTENTION backend.
- ``flex``: FlexAttention (torch.nn.attention.flex_attention), Triton-generated.

Figures, H100 80GB SXM5, head dim 128, bf16/fp16, at 16k tokens (FlashAttention-3 paper, arXiv 2407.08608,
Figure 5 "Attention forward speed, head dim 128", causal, and Figure 6 "Attention backward speed, head dim 128"):
forward FlashAttention-2 335, cuDNN 539, FlashAttention-3 616 TFLOP/s; backward 322, 516, 561 TFLOP/s. The
catalog's H100 figure for FlashAttention-2 forward + backward (0.338 of peak, from FlashAttention-2's own
fwd+bwd benchmark, hardware.toml) is scaled for the others by the time of one forward + backward (backward FLOPs
2.5 x forward, flops.py) in the same figures: cuDNN 1.604 x, FlashAttention-3 1.768 x faster than
FlashAttention-2 -> 0.542 and 0.598. FlexAttention: "90% of FlashAttention2's performance in the forward pass
and 85% in the backward pass" (PyTorch blog, "FlexAttention: The Flexibility of PyTorch with the Performance of
FlashAttention", Aug 2024) -> 0.862 x FlashAttention-2 by the same weighting.

Defaults (what the compiler runs with the torch the project pins, 2.13): SDPA puts cuDNN first on sm90 and
sm100 devices when the bundled cuDNN is at least 9.15.1 (``check_prefer_cudnn_attention`` in
aten/src/ATen/native/transformers/cuda/sdp_utils.cpp; the threshold was crossed by the cuDNN torch 2.11 bundles,
huggingface/transformers#48163), FLASH_ATTENTION (FlashAttention-2) first elsewhere. So: cudnn on H100, H200,
GH200 and B200; flash2 on A100 and MI300X (ROCm's SDPA flash backend).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

KERNELS = ("flash2", "flash3", "cudnn", "flex")

FA2_FWD, FA2_BWD = 335.0, 322.0  # arXiv 2407.08608 Figures 5-6, H100, head dim 128, 16k tokens, TFLOP/s
BACKWARD_WORK = 2.5  # attention backward FLOPs / forward (flops.py's hardware-work convention)


def relative_speed(fwd: float, bwd: float) -> float:
    """Forward + backward speed of a kernel with forward ``fwd`` and backward ``bwd`` TFLOP/s, relative to
    FlashAttention-2's in the same figures."""
    fa2 = 1.0 / FA2_FWD + BACKWARD_WORK / FA2_BWD
    return fa2 / (1.0 / fwd + BACKWARD_WORK / bwd)


HOPPER_FA2 = 0.338  # hardware.toml [accelerators.h100]: FlashAttention-2 fwd+bwd, causal, head dim 128
HOPPER = {"flash2": HOPPER_FA2, "cudnn": HOPPER_FA2 * relative_speed(539.0, 516.0),
          "flash3": HOPPER_FA2 * relative_speed(616.0, 561.0),
          "flex": HOPPER_FA2 * relative_speed(0.90 * FA2_FWD, 0.85 * FA2_BWD)}
AMPERE_FA2 = 0.55  # hardware.toml [accelerators.a100-*]: FlashAttention-2 (arXiv 2307.08691)

TABLE: dict[str, tuple[str, dict[str, float]]] = {
    # accelerator: (default kernel, {kernel: attention efficiency})
    "h100": ("cudnn", HOPPER),
    "h200": ("cudnn", HOPPER),   # the same Hopper compute die (hardware.toml)
    "gh200": ("cudnn", HOPPER),
    "a100-40g": ("flash2", {"flash2": AMPERE_FA2, "flex": AMPERE_FA2 * HOPPER["flex"] / HOPPER_FA2}),
    "a100-80g": ("flash2", {"flash2": AMPERE_FA2, "flex": AMPERE_FA2 * HOPPER["flex"] / HOPPER_FA2}),
    "b200": ("cudnn", {"cudnn": 0.40}),     # hardware.toml's default for Blackwell (no per-kernel figures yet)
    "mi300x": ("flash2", {"flash2": 0.30}),  # hardware.toml's default for ROCm flash attention
}
"""flash3 needs Hopper; figures for kernels not listed on an accelerator are not published (pinning one is a
usage error naming those that are)."""


def kernels_of(accelerator: str) -> dict[str, float]:
    return TABLE[accelerator][1] if accelerator in TABLE else {}


def default_kernel(accelerator: str) -> str | None:
    return TABLE[accelerator][0] if accelerator in TABLE else None


def with_kernel(hw, kernel: str | None = None):
    """``hw`` with its attention priced for ``kernel`` (None: the accelerator's default, or the kernel a calibrated
    profile measured). A calibrated ``attention_efficiency`` pinned to another kernel is scaled by the two kernels'
    published ratio. Raises ValueError (one line) when the accelerator has no figure for ``kernel``."""
    name = hw.accelerator.name
    table = kernels_of(name)
    measured = getattr(hw, "attention_kernel", "")
    if kernel is None:
        if measured or not table:
            return hw
        kernel = default_kernel(name)
    if kernel not in KERNELS:
        raise ValueError(f"--attention-kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if kernel == measured:
        return hw
    if kernel not in table:
        offered = ", ".join(table) if table else "none (its attention_efficiency is not per kernel)"
        raise ValueError(f"no published {kernel} figures for {name}; kernels priced there: {offered}")
    if measured and measured in table:  # a calibrated figure: keep its measurement, move it by the published ratio
        efficiency = hw.attention_efficiency * table[kernel] / table[measured]
    else:
        efficiency = table[kernel]
    return replace(hw, attention_efficiency=efficiency, attention_kernel=kernel)


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


def machine_of(torch) -> Machine:
    """The machine ``torch`` (the imported module) runs on."""
    import importlib.util

    if not torch.cuda.is_available():
        return Machine(device="cpu")
    return Machine(device="cuda", capability=tuple(torch.cuda.get_device_capability()),
                   cudnn_version=int(torch.backends.cudnn.version() or 0),
                   flash3_package=importlib.util.find_spec("flash_attn_interface") is not None,
                   flex=importlib.util.find_spec("torch.nn.attention.flex_attention") is not None)


__all__ = ["CUDNN_PREFERRED_FROM", "KERNELS", "Machine", "TABLE", "available", "choose", "default_kernel", "kernels_of",
           "machine_of", "relative_speed", "with_kernel"]
