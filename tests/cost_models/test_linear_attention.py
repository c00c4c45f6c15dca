"""Hybrid linear attention (Qwen3-Next, Qwen3.5 Gated DeltaNet) in the cost model and the planner: the config readers,
the presets' parameter counts, the terms of cost_models/linear_attention.py, bulk == scalar on hybrid spaces, the
planner's plans at 128k and 1M on h100x8 (never a ring or sequence chunks: the compiler refuses both) and its
agreement with the compiler's rules."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from autosp.contract.specs import Candidate, ModelSpec, Workload
from autosp.cost_models import flops, linear_attention, memory
from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.cost_models.catalog.models import preset_info, resolve_model
from autosp.cost_models.estimate import estimate
from autosp.cost_models.shapes import Shapes
from autosp.errors import UsageError

# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json (flat; layer_types written out by newer transformers)
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 5120,
    "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 262144, "rope_theta": 10000000,
    "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "hidden_act": "silu", "rms_norm_eps": 1e-6,
    "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}
# Qwen/Qwen3.5-35B-A3B's config.json: a vision-language wrapper, the language model's keys nested in text_config
QWEN3_5_TEXT = {
    "model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 248320, "tie_word_embeddings": False,
    "max_position_embeddings": 262144, "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "hidden_act": "silu", "rms_norm_eps": 1e-6, "attn_output_gate": True,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 10,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "mtp_num_hidden_layers": 1,
    "rope_parameters": {"rope_theta": 10000000, "partial_rotary_factor": 0.25, "mrope_interleaved": True}}
QWEN3_5 = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
           "tie_word_embeddings": False, "text_config": QWEN3_5_TEXT,
           "vision_config": {"model_type": "qwen3_5_moe_vision", "depth": 27, "hidden_size": 1152}}

# transformers 5.24, Qwen3NextForCausalLM / Qwen3_5MoeForCausalLM built on the meta device from these configs
TRANSFORMERS_COUNTS = {"qwen3-next-80b-a3b": 79_674_391_296, "qwen3.5-35b-a3b": 34_660_610_688}


def _write(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("name, config", [("qwen3-next-80b-a3b", QWEN3_NEXT), ("qwen3.5-35b-a3b", QWEN3_5)])
def test_the_configs_read_as_their_presets_and_count_transformers_parameters(tmp_path, name, config):
    preset, spec = resolve_model(name), resolve_model(_write(tmp_path, config))
    fields = ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "vocab", "n_experts", "experts_per_token",
              "expert_ffn_hidden", "shared_ffn_hidden", "attn_output_gate", "linear_layers", "linear_num_key_heads",
              "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim")
    assert {f: getattr(spec, f) for f in fields} == {f: getattr(preset, f) for f in fields}
    assert spec.linear_layers == tuple(i for i in range(preset.n_layers) if i % 4 != 3)  # 3 linear : 1 full
    # transformers' count less the MoE blocks' shared-expert gates (hidden x 1 per layer), which the model leaves out
    assert preset.n_params() == TRANSFORMERS_COUNTS[name] - preset.n_layers * preset.hidden
    assert abs(preset.n_params() / preset_info(name)["published_params"] - 1) < 0.01


def test_layer_types_or_the_interval_and_the_widths_defaults(tmp_path):
    # no layer_types: every full_attention_interval-th layer is softmax attention (transformers' rule)
    flat = {k: v for k, v in QWEN3_NEXT.items() if k != "full_attention_interval"}
    spec = resolve_model(_write(tmp_path, {**flat, "num_hidden_layers": 6, "full_attention_interval": 3}))
    assert spec.linear_layers == (0, 1, 3, 4) and spec.attention_layers == 2
    # the widths default to transformers' (Qwen3-Next-80B's), layer_types wins over the interval
    bare = {k: v for k, v in flat.items() if not k.startswith("linear_")}
    spec = resolve_model(_write(tmp_path, {**bare, "num_hidden_layers": 2,
                                           "layer_types": ["full_attention", "linear_attention"]}))
    assert spec.linear_layers == (1,) and (spec.linear_num_key_heads, spec.linear_num_value_heads) == (16, 32)
    with pytest.raises(UsageError) as err:
        resolve_model(_write(tmp_path, {**flat, "num_hidden_layers": 2,
                                        "layer_types": ["sliding_attention", "linear_attention"]}))
    assert "layer_types holds 'sliding_attention'" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="linear_layers needs every one"):
        ModelSpec(name="x", n_layers=2, hidden=8, n_heads=2, n_kv_heads=1, head_dim=4, ffn_hidden=8, vocab=8,
                  linear_layers=(0,))


def test_the_compiler_and_the_cost_model_share_the_rules():
    from autosp.compiler import linear_attention as compiled

    assert compiled.PIECE_TOKENS == linear_attention.PIECE_TOKENS
    for nk in (1, 2, 4, 16):
        for nv in (nk, 2 * nk, 4 * nk):
            for ranks in (1, 2, 3, 4, 8, 16, 32):
                assert linear_attention.split_reason(nk, nv, ranks) == compiled.split_reason(nk, nv, ranks)


def test_linear_layers_cost_linear_flops_and_keep_their_states():
    hybrid = resolve_model("qwen3-next-80b-a3b")
    softmax = replace(hybrid, linear_layers=(), linear_num_key_heads=0, linear_num_value_heads=0,
                      linear_key_head_dim=0, linear_value_head_dim=0, linear_conv_kernel_dim=0)
    cand = Candidate(sp=8, checkpointing="full", zero_stage=3)
    at = {S: Shapes(hybrid, Workload(S), cand) for S in (131072, 262144)}
    # attention FLOPs over the 12 softmax layers only; the cores' FLOPs linear in the sequence
    assert flops.attention_flops_forward(at[131072]) == pytest.approx(
        flops.attention_flops_forward(Shapes(softmax, Workload(131072), cand)) * 12 / 48, rel=1e-12)
    core = {S: linear_attention.core_flops_forward(sh.lin) for S, sh in at.items()}
    assert core[262144] == pytest.approx(2 * core[131072], rel=1e-12)
    # per value head and token: C (5 d_k + 3 d_v) + 6 d_k d_v with C = 64, d = 128
    assert linear_attention.core_flops_per_head_token(128, 128) == 64 * 1024 + 6 * 128 * 128
    # the states the op keeps: 8 pieces' worth (every 4,096 tokens of the 32,768) of 4 heads' 128 x 128 fp32 states
    sh = Shapes(hybrid, Workload(32768), Candidate(sp=8))
    assert linear_attention.state_bytes(sh.lin) == 7 * 4 * 128 * 128 * 4
    # the layer keeps, per local token, less than a softmax layer does (no K/V copies, no lse per head) ...
    assert memory.layer_kept_bytes(sh, "none", False) < memory.layer_kept_bytes(Shapes(softmax, Workload(32768),
                                                                                         Candidate(sp=8)), "none", False)
    # ... and a hybrid's step is faster at long context than the same model with softmax attention everywhere
    hw, work = resolve_hardware("h100x8"), Workload(1 << 20)
    assert estimate(hybrid, hw, work, cand).time.step < 0.5 * estimate(softmax, hw, work, cand).time.step


def test_a_ring_sequence_chunks_or_heads_the_compiler_refuses_are_refused_by_the_estimate_and_the_space():
    from autosp.planner.search.space import build_space

    model, hw = resolve_model("qwen3-next-80b-a3b"), resolve_hardware("h100x8")
    for cand, words in ((Candidate(sp=8, ring=2), "ring=2: the model's Gated DeltaNet"),
                        (Candidate(sp=8, sequence_chunks=4), "sequence_chunks=4: the model's Gated DeltaNet")):
        with pytest.raises(ValueError, match=words):
            estimate(model, hw, Workload(1 << 20), cand)
    space = build_space(model, resolve_hardware("h100x8", nodes=2), Workload(1 << 20))
    assert space.ring == (1,) and space.sequence_chunks == (1,) and 16 in space.sp
    wide = replace(model, n_heads=64)  # 64 Ulysses ranks would split its query and KV heads, not its linear heads
    space = build_space(wide, resolve_hardware("h100x8", nodes=8), Workload(1 << 20))
    assert dict(space.excluded_sp)[64] == "64 Ulysses ranks do not divide the 32 linear value heads"


@pytest.mark.parametrize("spec", [dict(model="qwen3-next-80b-a3b", ctx="128k", hw="h100x8", fix=["micro_batch=1", "zero_stage=2"]),
                                  dict(model="qwen3.5-35b-a3b", ctx="64k", hw="h100x16",
                                       fix=["micro_batch=1", "zero_stage=3"])],
                         ids=lambda s: s["model"])
def test_bulk_estimate_equals_the_scalar_one_on_hybrid_spaces(spec):
    from autosp.cost_models import bulk
    from autosp.planner.request import PlanRequest, resolve
    from autosp.planner.search.bulk_search import row_candidate, space_groups
    from autosp.planner.search.space import build_space

    request = PlanRequest(**spec)
    r = resolve(request)
    space = build_space(r.model, r.hardware, r.workload, profile=r.profile, fixed=request.fix)
    seen = 0
    for base, rows in space_groups(space):
        out = bulk.estimate_group(space.model, space.hardware, space.workload, base, rows, space.profile)
        for i in range(len(out.step)):
            ref = estimate(space.model, space.hardware, space.workload, row_candidate(space, base, rows, i))
            for got, want in ((out.step[i], ref.time.step), (out.memory[i], ref.memory.total),
                              (out.tokens_per_second[i], ref.tokens_per_second)):
                assert got == want or abs(got - want) <= 1e-12 * max(abs(got), abs(want))
            seen += 1
    assert seen == space.size() > 0


@pytest.mark.parametrize("model", ["qwen3-next-80b-a3b", "qwen3.5-35b-a3b", "next.json", "qwen3_5.json"])
@pytest.mark.parametrize("ctx", ["128k", "1M"])
def test_the_planner_plans_both_models_and_their_configs_on_h100x8(tmp_path, model, ctx):
    from autosp.planner.api import plan_for
    from autosp.planner.request import PlanRequest

    config = model.endswith(".json")
    if config:
        model = _write(tmp_path, QWEN3_NEXT if model == "next.json" else QWEN3_5, model)
    plan = plan_for(PlanRequest(model=model, ctx=ctx, hw="h100x8"), cache=False)
    assert plan.estimate.fits and plan.candidate.ring == 1 and plan.candidate.sequence_chunks == 1
    assert plan.model.linear_layers and (not config or "not traced" in plan.model.source)
