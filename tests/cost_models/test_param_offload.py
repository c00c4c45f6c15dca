"""ZeRO-3 parameter offload in the cost model (cost_models/param_offload.py) and the DeepSpeed config."""

from dataclasses import replace

import pytest

from autosp.cost_models import estimate, optimizer_offload, param_offload
from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.cost_models.catalog.models import resolve_model
from autosp.contract.deepspeed_config import deepspeed_config, zero_section
from autosp.cost_models.memory import GIB, zero3_gathered_params
from autosp.cost_models.shapes import Shapes
from autosp.contract.specs import Candidate, Workload

MODEL = resolve_model("llama-3.1-8b")
ONE = resolve_hardware("h100x1")
ALST_1GPU = Candidate(sp=1, zero_stage=3, checkpointing="full", mlp_chunks=8, loss_chunks=32,
                      offload_activations=True, offload_optimizer=True)


def _pair(hw, cand, seq):
    work = Workload(seq_len=seq)
    return estimate(MODEL, hw, work, cand), estimate(MODEL, hw, work, replace(cand, offload_param=True))


def test_one_gpu_keeps_only_the_parameters_in_flight():
    off, on = _pair(ONE, ALST_1GPU, 500_000)
    sh = Shapes(MODEL, Workload(seq_len=500_000), replace(ALST_1GPU, offload_param=True))
    assert off.memory.parameters == pytest.approx(2 * MODEL.n_params())          # all bf16 weights resident
    assert on.memory.parameters == pytest.approx(2 * zero3_gathered_params(sh, lm_head_persistent=True))
    assert on.memory.parameters < 2.5 * GIB and off.memory.parameters > 14.5 * GIB
    assert off.memory.total - on.memory.total > 12 * GIB                         # the 16 GB of weights, less in flight


def test_host_holds_the_partition_and_is_checked():
    sh = Shapes(MODEL, Workload(seq_len=4096), replace(ALST_1GPU, offload_param=True, sp=8))
    cand = replace(ALST_1GPU, offload_param=True, sp=8)
    assert param_offload.host_bytes(sh, cand) == pytest.approx(2 * MODEL.n_params() / 8)
    assert param_offload.host_bytes(sh, replace(cand, offload_param=False)) == 0
    tiny_host = replace(ONE, host_memory_bytes=20 * GIB)   # < 16 B/param optimizer + 2 B/param weights
    est = estimate(MODEL, tiny_host, Workload(seq_len=8192), replace(ALST_1GPU, offload_param=True, mlp_chunks=1,
                                                                      loss_chunks=1, offload_activations=False))
    assert not est.fits and any("host memory" in n for n in est.notes)


def test_copies_hide_behind_long_passes_and_show_at_short_ones():
    off, on = _pair(ONE, ALST_1GPU, 500_000)
    # 500K tokens: each pass computes for minutes, the 16 GB of copies take ~0.3 s: only the first module waits,
    # and the weights no longer go back to the device after the optimizer step (without parameter offload ZeRO-3
    # copies them up across dtypes through a pageable buffer, optimizer_offload.weight_copy_seconds: a few seconds)
    assert on.time.offload <= off.time.offload
    assert on.time.step <= off.time.step
    assert on.time.step == pytest.approx(off.time.step, rel=1e-2)
    short = replace(ALST_1GPU, mlp_chunks=1, loss_chunks=1)
    off, on = _pair(ONE, short, 1024)
    link = ONE.host_bandwidth * ONE.comm_efficiency
    per_pass = 2 * MODEL.n_params() / link
    assert on.time.offload > 2 * per_pass  # three passes (full recompute) barely overlap at 1K tokens
    # without parameter offload ZeRO-3's weights come back through torch's pageable cross-dtype copy after the step,
    # which on the measured host costs more than those three pinned fetches
    pageable = optimizer_offload.weight_copy_seconds(MODEL.n_params(), 2, 3, False, link)
    assert pageable > 3 * per_pass and off.time.offload > pageable
    assert param_offload.passes(short) == 3
    assert param_offload.passes(replace(short, checkpointing="sequence", offload_activations=False)) == 2


def test_offload_param_needs_zero3():
    with pytest.raises(ValueError, match="needs zero_stage 3"):
        Candidate(sp=1, zero_stage=2, offload_param=True)


def test_deepspeed_config_offloads_parameters_only_when_asked():
    on = deepspeed_config(replace(ALST_1GPU, offload_param=True), "bf16", n_params=MODEL.n_params())
    zero = on["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_optimizer"]["device"] == "cpu"
    assert "offload_param" not in deepspeed_config(ALST_1GPU, "bf16")["zero_optimization"]
    assert "offload_param" not in zero_section(2, True, offload_param=True)   # ZeRO-3 only
    assert deepspeed_config(replace(ALST_1GPU, offload_param=True), "bf16",
                            pin_memory=False)["zero_optimization"]["offload_param"]["pin_memory"] is False
