"""Parameter offload (``offload_param``) in the planner: the space, the max-context search, the written configs."""

import json
from dataclasses import replace

from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.cost_models.catalog.models import resolve_model
from autosp.contract.specs import Workload
from autosp.planner.api import plan_for
from autosp.planner.request import PlanRequest
from autosp.planner.artifacts import load_artifact
from autosp.planner.search.evaluator import Evaluator
from autosp.planner.ds_config import write_outputs
from autosp.planner.search.space import build_space, canonical

MODEL = resolve_model("llama-3.1-8b")


def test_space_pairs_parameter_offload_with_zero3_and_optimizer_offload():
    space = build_space(MODEL, resolve_hardware("h100x1"), Workload(seq_len=65_536))
    cands = list(space.candidates())
    with_params = [c for c in cands if c.offload_param]
    assert with_params and all(c.zero_stage == 3 and c.offload_optimizer for c in with_params)
    assert len(cands) == len(set(cands)) == space.size()
    # every ZeRO-3 + optimizer-offload candidate exists with and without it
    z3 = {replace(c, offload_param=False) for c in cands if c.zero_stage == 3 and c.offload_optimizer}
    assert {replace(c, offload_param=False) for c in with_params} == z3
    # proposals that cannot use it are canonicalised, not invalid
    made = space.make(sp=1, zero_stage=2, micro_batch=1, checkpointing="full", mlp_chunks=1, loss_chunks=1,
                      offload_activations=False, overlap="none", offload_optimizer=True, offload_param=True)
    assert not made.offload_param and space.reason(made) is None
    assert not canonical(replace(with_params[0], offload_optimizer=False)).offload_param


def test_max_ctx_on_one_gpu_offloads_the_parameters_and_trains_longer():
    plan = plan_for(PlanRequest(model="llama-3.1-8b", ctx="1k", hw="h100", objective="max-ctx"), cache=None)
    c = plan.candidate
    assert c.offload_param and c.offload_optimizer and c.zero_stage == 3
    assert plan.workload.seq_len > 700_000                    # ALST's recipe: 500K on one H100
    space = build_space(MODEL, resolve_hardware("h100"), Workload(seq_len=1024))
    without = Evaluator(space).max_context(replace(c, offload_param=False))
    assert plan.workload.seq_len > 1.15 * without             # 16 GB of bf16 weights moved to the host


def test_written_deepspeed_config_offloads_the_parameters_and_reads_back(tmp_path):
    plan = plan_for(PlanRequest(model="llama-3.1-8b", ctx="1k", hw="h100", objective="max-ctx"), cache=None)
    plan_path, ds_path = tmp_path / "plan.json", tmp_path / "ds.json"
    write_outputs(plan, str(plan_path), str(ds_path))
    ds = json.loads(ds_path.read_text())
    assert ds["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert ds["autosp"]["offload_param"] is True
    assert load_artifact(str(ds_path)).candidate.offload_param
    assert load_artifact(str(plan_path)).candidate == plan.candidate
