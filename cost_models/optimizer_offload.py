"""ZeRO-Offload's optimizer step (``Candidate.offload_optimizer``), priced as DeepSpeed runs it (docs/cost_model.md,
"Optimizer offload").

Read from DeepSpeed 0.19.8 (``deepspeed/runtime/zero/stage_1_and_2.py``: ``copy_grads_in_partition``,
``async_accumulate_grad_in_cpu_via_gpu``, ``async_inplace_copy_grad_to_fp32_buffer_from_gpu``, ``step``,
``unscale_and_clip_grads``; ``stage3.py``: ``_offload_grad_partition_at_boundary``,
``_reassign_or_swap_out_partitioned_parameters``) and measured on one H200 VM's host with
``python -m studies.host_offload_probe`` (studies/results/host_offload_probe_h200_*.json):

- **Host passes** over a rank's fp32 partition, streamed through the host's DRAM: CPU Adam (28 B per parameter:
  ``flops.OPTIMIZER_BYTES_PER_PARAM``; measured at 0.91x the host's triad), gradient clipping's in-place scale of
  the fp32 gradients (8 B; DeepSpeed scales whenever clipping is set, and autosp's configs set it; 0.98x triad),
  and the cast of the updated fp32 weights to the training dtype (6 B; 0.61x triad). 42 B in all.
- **Gradients down**: at the accumulation boundary each gradient is cast to fp32 on the device and copied down
  (4 B per parameter). ZeRO 1-2 with gradient accumulation also keep the running sum on the host: every
  micro-step copies its gradients down (e B) and every micro-step after the first copies the sum back up first
  (e B) to add to. ZeRO-3 accumulates on the device. These copies run in the backward's reduce hooks, so each
  micro-step's hide behind its backward up to the same overlap fraction as ZeRO's collectives.
- **Weights up**, after the step, exposed: ZeRO 1-2 copy the cast weights from a pinned buffer (e B at the host
  link's rate). ZeRO-3 with parameter offload writes them into the host partition (nothing goes up). ZeRO-3
  without it copies the fp32 host partition straight into the device's bf16 one, a copy across devices and
  dtypes that torch makes through a pageable host buffer: :data:`PAGEABLE_COPY_FRACTION` of the link's rate.

Pure functions over floats; :mod:`autosp.cost_models.bulk` applies the same ones to its rows.
"""

from __future__ import annotations

from autosp.cost_models.comm import _xfer as seconds
from autosp.cost_models.flops import OPTIMIZER_BYTES_PER_PARAM

CLIP_SCALE_BYTES_PER_PARAM = 8.0
"""Gradient clipping's ``grad.mul_(1 / scale)`` over the fp32 gradient partition on the host: read and write 4 B.
DeepSpeed 0.19.8 clamps the clip factor to >= 1 and scales whenever ``gradient_clipping`` > 0
(``unscale_and_clip_grads``); autosp's DeepSpeed configs set it (``deepspeed_config.GRADIENT_CLIPPING``)."""

WEIGHT_CAST_BYTES_PER_PARAM = 6.0
"""The updated fp32 master weights cast to the 16-bit training weights on the host: read 4 B, write 2 B."""

HOST_PASS_BYTES_PER_PARAM = OPTIMIZER_BYTES_PER_PARAM + CLIP_SCALE_BYTES_PER_PARAM + WEIGHT_CAST_BYTES_PER_PARAM
"""Host DRAM traffic of one offloaded step per local parameter: Adam, the clip scale, the weight cast."""

FP32_GRADIENT_BYTES = 4.0
"""Bytes per parameter of the gradient partition copied down at the accumulation boundary (cast to fp32 on the
device first)."""

PAGEABLE_COPY_FRACTION = 0.08
"""torch's host-to-device copy across dtypes (fp32 host -> bf16 device, ZeRO-3's weights after an offloaded step)
against a pinned copy of the same bf16 bytes: it casts on the host into a freshly allocated pageable buffer and
copies that. Measured on the H200 VM (studies/results/host_offload_probe_h200_copies.json): 3.8 GB/s for the whole
copy against 55.2 GB/s pinned; without its host cast (81 GB/s at 6 B per parameter, priced with the host passes)
the copy runs at 4.4 GB/s = 0.08 of pinned. One machine's figure: a host with faster pageable copies pays less."""


def host_step_seconds(local_params: float, host_bandwidth_per_gpu: float) -> float:
    """The offloaded step's host passes over one GPU's partition, at its share of the node's DRAM bandwidth."""
    return seconds(HOST_PASS_BYTES_PER_PARAM * local_params, host_bandwidth_per_gpu)


def gradient_copies_exposed(local_params: float, e: float, zero_stage: int, ga: int, link: float,
                            hidden_per_backward: float) -> float:
    """Exposed seconds per step of the gradients' copies (see the module docstring): each micro-step's copies
    against ``hidden_per_backward`` seconds of its backward."""
    fp32_down = seconds(FP32_GRADIENT_BYTES * local_params, link)
    if zero_stage == 3 or ga == 1:
        return max(0.0, fp32_down - hidden_per_backward)
    one = seconds(e * local_params, link)  # one micro-step's gradients, one way
    first = max(0.0, one - hidden_per_backward)  # down
    middle = max(0.0, 2.0 * one - hidden_per_backward)  # up, add, down
    last = max(0.0, 2.0 * one + fp32_down - hidden_per_backward)  # up, add, down, then the fp32 partition down
    return first + (ga - 2) * middle + last if ga > 2 else first + last


def weight_copy_seconds(local_params: float, e: float, zero_stage: int, param_offload: bool, link: float) -> float:
    """The updated weights' copy back to the device after the step (exposed: the next forward needs them)."""
    if param_offload:
        return 0.0
    rate = link * PAGEABLE_COPY_FRACTION if zero_stage == 3 else link
    return seconds(e * local_params, rate)


def copies_exposed(local_params: float, e: float, zero_stage: int, param_offload: bool, ga: int, link: float,
                   hidden_per_backward: float) -> float:
    """The offloaded step's exposed host-link seconds per step: the weights' way back and the gradients' copies."""
    return (weight_copy_seconds(local_params, e, zero_stage, param_offload, link)
            + gradient_copies_exposed(local_params, e, zero_stage, ga, link, hidden_per_backward))


__all__ = ["CLIP_SCALE_BYTES_PER_PARAM", "FP32_GRADIENT_BYTES", "HOST_PASS_BYTES_PER_PARAM", "PAGEABLE_COPY_FRACTION",
           "WEIGHT_CAST_BYTES_PER_PARAM", "copies_exposed", "gradient_copies_exposed", "host_step_seconds",
           "weight_copy_seconds"]
