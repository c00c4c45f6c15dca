"""The DeepSpeed config autosp writes is accepted by DeepSpeed's own parser (DeepSpeedConfig), with the
batch semantics documented in planner/ds_config.py: DeepSpeed's world is all dp x sp ranks."""

import json
import os
import socket
from dataclasses import replace

import pytest

from autosp.contract.deepspeed_buffers import zero_config_fields
from autosp.planner.api import plan_for
from autosp.planner.request import PlanRequest
from autosp.planner.ds_config import deepspeed_config, deepspeed_config_json


@pytest.fixture(scope="module")
def one_gpu_plan():
    return plan_for(PlanRequest(model="llama-3.2-1b", ctx="8k", hw="h100", search="exhaustive"))


def _variants(plan):
    for zero in (0, 1, 2, 3):
        for dtype in ("bf16", "fp32"):
            for micro, accum, offload in ((1, 1, False), (2, 4, zero >= 1)):
                cand = replace(plan.candidate, zero_stage=zero, micro_batch=micro, grad_accum=accum,
                               offload_optimizer=offload)
                yield replace(plan, candidate=cand, workload=replace(plan.workload, dtype=dtype))


def test_deepspeed_parser_accepts_every_stage_and_dtype(one_gpu_plan):
    from deepspeed.runtime.config import DeepSpeedConfig

    for plan in _variants(one_gpu_plan):
        cfg = json.loads(deepspeed_config_json(plan))
        parsed = DeepSpeedConfig(cfg)  # no process group: DeepSpeed's world is 1, like this plan's
        c = plan.candidate
        assert parsed.world_size == 1
        assert parsed.train_micro_batch_size_per_gpu == c.micro_batch
        assert parsed.gradient_accumulation_steps == c.grad_accum
        assert parsed.train_batch_size == c.micro_batch * c.grad_accum
        assert parsed.zero_optimization_stage == c.zero_stage
        assert parsed.bfloat16_config.enabled == (plan.workload.dtype == "bf16")
        assert parsed.gradient_clipping == 1.0
        fields = zero_config_fields(c.zero_stage, plan.model.n_params())
        if "reduce_bucket_size" in fields:
            assert parsed.zero_config.reduce_bucket_size == fields["reduce_bucket_size"]
        if c.zero_stage == 3:
            assert parsed.zero_config.prefetch_bucket_size == fields["stage3_prefetch_bucket_size"]
            assert parsed.zero_config.param_persistence_threshold == fields["stage3_param_persistence_threshold"]
        assert cfg["autosp"]["sp"] == c.sp and cfg["autosp"]["checkpointing"] == c.checkpointing
        offload = parsed.zero_config.offload_optimizer
        if c.offload_optimizer:
            assert offload is not None and offload.device == "cpu" and offload.pin_memory
        else:
            assert offload is None or offload.device == "none"


def test_batch_sizes_count_every_rank():
    plan = plan_for(PlanRequest(model="llama-3.1-8b", ctx="64k", hw="h100x8", global_batch=16, search="exhaustive"))
    cfg = deepspeed_config(plan)
    c = plan.candidate
    assert c.dp * c.micro_batch * c.grad_accum == 16
    assert cfg["train_batch_size"] == c.micro_batch * c.grad_accum * c.dp * c.sp
    assert cfg["autosp"]["sequences_per_step"] == 16
    assert cfg["autosp"]["tokens_per_step"] == 16 * 64_000
    assert "sequence_parallel_size" not in cfg  # it would make DeepSpeed divide its world by sp


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parse_on_rank(rank, world, port, configs, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    results = []
    for cfg in configs:
        try:
            parsed = DeepSpeedConfig(cfg)
            results.append({"ok": True, "world": parsed.world_size, "tbs": parsed.train_batch_size})
        except Exception as err:  # noqa: BLE001 - reported to the test
            results.append({"ok": False, "error": f"{type(err).__name__}: {err}"})
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    deepspeed.comm.destroy_process_group()


@pytest.mark.slow
def test_deepspeed_accepts_the_config_on_dp_times_sp_processes(tmp_path):
    """Launched like autosp launches it (one process per GPU, gloo here), DeepSpeed sees world = dp*sp and
    accepts train_batch_size; the sequence-count alternative (micro*ga*dp) is rejected, which is why the
    config counts shards."""
    from autosp.compiler.testing import start

    base = plan_for(PlanRequest(model="llama-3.2-1b", ctx="16k", hw="h100x2", global_batch=8, search="exhaustive"))
    shapes = [dict(sp=2, dp=1, micro_batch=1, grad_accum=8, zero_stage=3),
              dict(sp=1, dp=2, micro_batch=2, grad_accum=2, zero_stage=2),
              dict(sp=2, dp=1, micro_batch=4, grad_accum=2, zero_stage=0)]
    configs, expect = [], []
    for shape in shapes:
        cfg = deepspeed_config(replace(base, candidate=replace(base.candidate, **shape)))
        configs.append(cfg)
        expect.append((True, shape["micro_batch"] * shape["grad_accum"] * 2))
    sp2 = configs[0]
    wrong = dict(sp2, train_batch_size=sp2["autosp"]["sequences_per_step"])  # counting sequences, not shards
    configs.append(wrong)
    expect.append((False, None))
    start(_parse_on_rank, (2, _free_port(), configs, str(tmp_path)), 2)  # the ranks set their own environment
    for rank in range(2):
        results = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for (ok, tbs), got in zip(expect, results):
            assert got["ok"] == ok, got
            if ok:
                assert got["world"] == 2 and got["tbs"] == tbs
            else:
                assert "train_batch_size" in got["error"] or "Train batch" in got["error"]


def test_planned_and_hand_made_runs_get_one_config_with_one_clipping_default(one_gpu_plan):
    """Regression: autosp.compile(sp_size=...) built its own config with gradient_clipping 0.0 while a planned
    run (--ds-config, or compile with the plan) clipped at 1.0. One builder now serves every entry point."""
    import torch

    from autosp.compiler.api import deepspeed_config as compile_config
    from autosp.contract.deepspeed_config import GRADIENT_CLIPPING

    plan = replace(one_gpu_plan, candidate=replace(one_gpu_plan.candidate, offload_optimizer=False))
    dtype = plan.workload.dtype
    hand_made = compile_config(plan.candidate, dtype)          # autosp.compile(model, sp_size=...)
    with_plan = compile_config(plan.candidate, dtype, plan)    # autosp.compile(model, plan=...)
    written = deepspeed_config(plan)                           # autosp-plan --ds-config
    assert GRADIENT_CLIPPING == 1.0
    assert hand_made["gradient_clipping"] == with_plan["gradient_clipping"] == written["gradient_clipping"] == 1.0
    written.pop("autosp")
    assert with_plan == written  # the planner's file is what the compiler runs, plus the autosp section
    # a hand-made run sizes the gradient bucket by the model it is given, everything else is the same
    model = torch.nn.Linear(1000, 1000)
    sized = compile_config(plan.candidate, dtype, None, model)
    assert sized["zero_optimization"]["reduce_bucket_size"] == 1000 * 1000 + 1000
    sized["zero_optimization"].pop("reduce_bucket_size"), written["zero_optimization"].pop("reduce_bucket_size")
    assert sized == written
    # the user's override (CompileOptions(gradient_clipping=0) turns clipping off)
    assert compile_config(plan.candidate, dtype, plan, gradient_clipping=0)["gradient_clipping"] == 0.0
    assert compile_config(plan.candidate, dtype, gradient_clipping=0.5)["gradient_clipping"] == 0.5
