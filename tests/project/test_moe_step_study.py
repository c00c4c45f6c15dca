"""studies/moe_step.py's model: the measurement harness builds transformers' Mixtral from a MoE ModelSpec with the
parameters the cost model counts, and refuses a spec it cannot build as one."""

import pytest


def test_the_harness_builds_the_studys_mixtral_with_the_cost_models_parameter_count():
    import torch

    from studies import moe_step
    from studies.measure.harness import _build_model

    cfg = moe_step.configs(seq=64, steps=1)[0]
    model = _build_model(cfg, torch.device("cpu"))
    assert type(model).__name__ == "MixtralForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == moe_step.MODEL.n_params()
    assert model.config.num_local_experts == 8 and model.config.intermediate_size == 256


def test_a_dense_spec_is_refused_by_the_moe_build():
    import torch
    from dataclasses import replace

    from studies import moe_step
    from studies.measure.harness import _build_model

    dense = replace(moe_step.configs(seq=64, steps=1)[0], model=replace(moe_step.MODEL, n_experts=0,
                                                                          experts_per_token=0, expert_ffn_hidden=0))
    with pytest.raises(ValueError, match="hf-moe"):
        _build_model(dense, torch.device("cpu"))
