"""ZeRO-Offload's step priced as DeepSpeed 0.19.8 runs it (cost_models/optimizer_offload.py)."""

from dataclasses import replace

import pytest

from autosp.contract.deepspeed_config import GRADIENT_CLIPPING
from autosp.contract.specs import Candidate, Workload
from autosp.cost_models import estimate, optimizer_offload as oo
from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.cost_models.catalog.models import resolve_model
from autosp.cost_models.flops import OPTIMIZER_BYTES_PER_PARAM

PSI = 1.0e9
LINK = 50e9
ONE = PSI * 2 / LINK  # one bf16 copy of the partition over the link


def test_the_host_passes_are_adam_the_clip_scale_and_the_weight_cast():
    """42 B per parameter: Adam's 28, clipping's in-place scale (DeepSpeed scales whenever clipping is set, and
    autosp's configs set it) and the fp32 -> bf16 cast of the updated weights."""
    assert GRADIENT_CLIPPING > 0
    assert oo.HOST_PASS_BYTES_PER_PARAM == OPTIMIZER_BYTES_PER_PARAM + 8 + 6 == 42
    assert oo.host_step_seconds(PSI, 100e9) == pytest.approx(42 * PSI / 100e9)


def test_zero_1_2_accumulate_gradients_through_the_host_and_zero_3_on_the_device():
    """With nothing to hide behind: ZeRO 1-2 copy every micro-step's bf16 gradients down, every later micro-step's
    running sum up first, and the fp32 partition down at the boundary; ZeRO-3 only the fp32 partition."""
    fp32 = 2 * ONE
    assert oo.gradient_copies_exposed(PSI, 2, 2, 1, LINK, 0.0) == pytest.approx(fp32)
    assert oo.gradient_copies_exposed(PSI, 2, 3, 1, LINK, 0.0) == pytest.approx(fp32)
    assert oo.gradient_copies_exposed(PSI, 2, 2, 2, LINK, 0.0) == pytest.approx(ONE + 2 * ONE + fp32)
    assert oo.gradient_copies_exposed(PSI, 2, 1, 4, LINK, 0.0) == pytest.approx(ONE + 2 * 2 * ONE + 2 * ONE + fp32)
    assert oo.gradient_copies_exposed(PSI, 2, 3, 4, LINK, 0.0) == pytest.approx(fp32)
    # each micro-step's copies hide behind its own backward
    assert oo.gradient_copies_exposed(PSI, 2, 2, 4, LINK, 10.0) == 0.0
    assert oo.gradient_copies_exposed(PSI, 2, 2, 2, LINK, ONE) == pytest.approx(ONE + fp32)
    assert oo.gradient_copies_exposed(PSI, 2, 2, 3, 0.0, 0.0) == float("inf")  # no host link: never


def test_zero_3_weights_come_up_through_a_pageable_cross_dtype_copy():
    assert oo.weight_copy_seconds(PSI, 2, 2, False, LINK) == pytest.approx(ONE)
    assert oo.weight_copy_seconds(PSI, 2, 3, False, LINK) == pytest.approx(ONE / oo.PAGEABLE_COPY_FRACTION)
    assert oo.weight_copy_seconds(PSI, 2, 3, True, LINK) == 0.0  # written into the host partition


def test_an_offloaded_step_with_gradient_accumulation_pays_the_host_round_trips():
    """Llama-3.2-1B on one H200 at 8k tokens, the GPU check's optim-offload-8k row: going from one micro-step to
    two adds that micro-step's compute and its gradients' host round trip, nothing else."""
    model, hw = resolve_model("llama-3.2-1b"), resolve_hardware("h200")
    cand = Candidate(sp=1, zero_stage=2, offload_optimizer=True)
    one = estimate(model, hw, Workload(seq_len=8192), cand)
    two = estimate(model, hw, Workload(seq_len=8192), replace(cand, grad_accum=2))
    assert two.time.offload > one.time.offload
    assert two.time.compute - one.time.compute == pytest.approx(one.time.compute - one_step_host(model, hw), rel=1e-9)


def one_step_host(model, hw) -> float:
    from autosp.cost_models.step_time import host_memory_bandwidth

    return oo.host_step_seconds(model.n_params(), host_memory_bandwidth(hw) / hw.devices_per_node)
