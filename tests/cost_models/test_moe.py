"""Mixture of experts in the cost model (issue 22): parameter counts of the real models, FLOPs from the active
experts, expert states sharded by ep then ZeRO, the dispatch/combine all-to-all volume, the architecture list."""

import json
from dataclasses import replace

import pytest

from autosp.cost_models import architectures, comm, flops, memory, moe
from autosp.cost_models.catalog.hardware import resolve_hardware
from autosp.cost_models.catalog.models import preset_info, resolve_model
from autosp.cost_models.estimate import estimate
from autosp.cost_models.shapes import Shapes
from autosp.contract.specs import Candidate, Workload
from autosp.errors import UsageError

GIB = 2 ** 30


@pytest.mark.parametrize("name, total, active", [
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),    # model card: 30.5B total, 3.3B activated
    ("mixtral-8x7b", 46.7e9, 12.9e9),    # mistral.ai: 46.7B total, 12.9B per token
])
def test_total_and_active_parameters_match_the_real_models(name, total, active):
    spec = resolve_model(name)
    assert abs(spec.n_params() / total - 1) < 0.005 and abs(moe.active_params(spec) / active - 1) < 0.02
    assert preset_info(name)["published_active_params"] == active
    # exact: Mixtral = 32 x (attention 41.9M + router 4096 x 8 + 8 experts x 3 x 4096 x 14336 + 2 norms) + 2 x 32000 x 4096
    if name == "mixtral-8x7b":
        assert spec.n_params() == 46_702_792_704 and moe.active_params(spec) == 12_879_925_248


def test_flops_come_from_the_active_experts():
    spec = resolve_model("qwen3-30b-a3b")
    sh = Shapes(spec, Workload(8192), Candidate(sp=8))
    # matmul work per token (parameter equivalents) = active parameters less the embedding lookup (a gather)
    active_matmul = moe.active_params(spec) - spec.vocab * spec.hidden - spec.n_layers * 2 * spec.hidden - spec.hidden
    assert sh.dense_params == pytest.approx(active_matmul, rel=1e-9)
    assert sh.dense_params < 0.12 * spec.n_params()
    dense_twin = replace(spec, n_experts=0, experts_per_token=0, expert_ffn_hidden=0, ffn_hidden=8 * 768)
    # a dense MLP as wide as the k active experts has the same FLOPs, less the router
    assert sh.dense_params - Shapes(dense_twin, Workload(8192), Candidate(sp=8)).dense_params == \
        spec.n_layers * spec.hidden * spec.n_experts


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_expert_states_are_sharded_by_ep_then_by_zero(stage):
    spec, hw = resolve_model("mixtral-8x7b"), resolve_hardware("h100x8")
    experts = moe.expert_params(spec)
    assert experts == 32 * 8 * 3 * 4096 * 14336
    for ep in (1, 2, 4, 8):
        cand = Candidate(sp=8, zero_stage=stage, ep=ep, checkpointing="full")
        e = estimate(spec, hw, Workload(32768), cand)
        psi, nd = experts / ep, 8 // ep                     # E/ep experts, ZeRO over world/ep ranks
        weights = psi * 2 / nd if stage == 3 else psi * 2
        grads = psi * 2 / nd if stage >= 2 else psi * 2
        optim = psi * 12 / nd if stage >= 1 else psi * 12
        loss_phase = any("loss phase" in n for n in e.notes)
        assert e.memory.expert_states == pytest.approx(weights + (0 if loss_phase else grads) + optim)
        # the rest of the model: ZeRO over all 8 ranks, whatever ep
        rest = spec.n_params() - experts
        assert e.memory.optimizer_states == pytest.approx(rest * 12 / 8 if stage >= 1 else rest * 12)


def test_zero3_gathers_only_this_ranks_experts():
    spec = resolve_model("qwen3-30b-a3b")
    layer = spec.layer_params()
    one = Shapes(spec, Workload(8192), Candidate(sp=8, ep=1, zero_stage=3))
    eight = Shapes(spec, Workload(8192), Candidate(sp=8, ep=8, zero_stage=3))
    assert moe.gathered_layer_params(one.moe, layer) == layer
    assert moe.gathered_layer_params(eight.moe, layer) == layer - 128 * 3 * 2048 * 768 * 7 / 8


def test_all_to_all_volume_formula():
    spec, hw = resolve_model("qwen3-30b-a3b"), resolve_hardware("h100x8")
    S, ep = 65536, 4
    sh = Shapes(spec, Workload(S), Candidate(sp=8, ep=ep))
    s = S // 8
    # each rank sends its s x k token copies of h bf16 elements, (ep-1)/ep of them off-rank, x the margin
    sent = moe.dispatch_bytes(sh.moe, sh.s, 2)
    assert sent == s * 8 * 2048 * 2 * moe.CAPACITY_FACTOR * 3 / 4
    assert moe.dispatch_bytes(Shapes(spec, Workload(S), Candidate(sp=8)).moe, s, 2) == 0  # no EP, no traffic
    # 6 all-to-alls per MoE layer per step (dispatch + combine: forward, the experts op's re-run forward in its
    # backward, and their gradients), 8 when the policy recomputes the MLP
    t = comm.expert_all_to_all_time(hw, sh.moe, sh.s, 2, 0, 1)
    one = hw.intra_node_latency + sent / (hw.intra_node_bandwidth * hw.comm_efficiency)
    assert t == pytest.approx(48 * 6 * one)
    assert comm.expert_all_to_all_time(hw, sh.moe, sh.s, 2, 1, 1) == pytest.approx(48 * 8 * one)
    none = estimate(spec, hw, Workload(S), Candidate(sp=8, checkpointing="none", ep=ep))
    full = estimate(spec, hw, Workload(S), Candidate(sp=8, checkpointing="full", ep=ep))
    assert none.time.expert_comm == pytest.approx(t) and full.time.expert_comm == pytest.approx(8 / 6 * t)
    # across nodes: an EP group of 16 over 2 nodes sends 8/16 of its copies over the scale-out network
    two = resolve_hardware("h100x8", nodes=2)
    sh16 = Shapes(spec, Workload(S), Candidate(sp=16, ep=16))
    buffer = sh16.s * 8 * 2048 * 2 * moe.CAPACITY_FACTOR
    inter = buffer * 8 / 16 / (two.inter_node_bandwidth * two.comm_efficiency)
    assert comm.expert_all_to_all_time(two, sh16.moe, sh16.s, 2, 0, 1) == pytest.approx(48 * 6 * (two.inter_node_latency
                                                                                           + inter))


def test_the_router_is_kept_and_the_routed_experts_are_rebuilt_in_their_backward():
    """The compiler's experts op saves only its inputs: under none/selective a MoE layer keeps the router's tensors
    and nothing of the routed experts (studies/moe_costs.py: 68 B measured per token beside the eager block's 2,660);
    its backward rebuilds the permutation tensors and the experts' live set, under every policy."""
    spec = resolve_model("qwen3-30b-a3b")
    sh = Shapes(spec, Workload(8192), Candidate(sp=1))
    # router logits (E bf16) + fp32 probabilities (4E) + int64 top-k indices
    router = 128 * 2 + 4 * 128 + 8 * 8
    assert moe.moe_layer_kept(sh.moe, 2, "none") == moe.moe_layer_kept(sh.moe, 2, "selective") == router
    assert moe.moe_layer_kept(sh.moe, 2, "full") == 0
    assert sh.prof.kept_mlp[0].other == 0 and sh.prof.kept_mlp[1].other == 0  # no shared experts: nothing else
    op = moe.OP_PERMUTATION_COPIES * 8 * 2048 * 2
    assert moe.transient_bytes_per_token(sh.moe, 2, "none") == op
    assert moe.transient_bytes_per_token(sh.moe, 2, "full") == op + router
    ep = Shapes(spec, Workload(8192), Candidate(sp=8, ep=8)).moe
    margin = moe.CAPACITY_FACTOR - 1
    assert moe.transient_bytes_per_token(ep, 2, "none") - op == pytest.approx(
        margin * (moe.OP_PERMUTATION_COPIES * 8 * 2048 + moe.EXPERT_LIVE_PER_WIDTH * 8 * 768) * 2)


def test_the_experts_op_recomputes_its_forward_and_exchanges_under_every_policy():
    spec = resolve_model("qwen3-30b-a3b")
    cand = Candidate(sp=8, checkpointing="none")
    sh = Shapes(spec, Workload(65536), cand)
    routed = 2.0 * sh.s * 8 * 3 * 2048 * 768 * 48  # the k experts' forward, every MoE layer
    assert moe.recomputed_expert_flops(sh.moe, sh.s) == routed
    assert flops.recompute_flops(sh, cand)[0] == pytest.approx(routed)  # none recomputes nothing else
    tiled = Candidate(sp=8, checkpointing="none", mlp_chunks=4)  # the tiles' recompute counts it already
    assert flops.recompute_flops(Shapes(spec, Workload(65536), tiled), tiled)[0] == pytest.approx(
        2.0 * sh.s * sh.L * sh.mlp_params)
    assert moe.all_to_alls_per_layer(0) == 6 and moe.all_to_alls_per_layer(1) == 8


def test_the_moe_backward_phase_holds_the_expert_weight_gradients_at_few_tokens():
    """Qwen3-30B-A3B at ep 1: a layer's 128 experts are 604M parameters, 1.2 GB in bf16; the op ends its backward
    holding 1.67x that (2.67x in token pieces), more than its tokens' working set at 1k tokens."""
    spec = resolve_model("qwen3-30b-a3b")
    sh = Shapes(spec, Workload(1024), Candidate(sp=1))
    weights = 128 * 3 * 2048 * 768 * 2
    assert moe.expert_grad_bytes(sh.moe, 2, 1) == (0.0, pytest.approx(weights * 5 / 3))
    assert moe.expert_grad_bytes(sh.moe, 2, 2) == (weights, pytest.approx(weights * 8 / 3))
    phase = memory.mlp_phase_bytes(sh, "none", 1, moe.transient_bytes_per_token(sh.moe, 2, "none"))
    assert phase == pytest.approx(weights * 5 / 3 + 1024 * 2048 * 2)
    ep8 = Shapes(spec, Workload(1024), Candidate(sp=8, ep=8))  # an eighth of the experts, an eighth of the gradients
    assert moe.expert_grad_bytes(ep8.moe, 2, 1)[1] == pytest.approx(weights * 5 / 3 / 8)


def test_dense_models_are_unchanged_and_refuse_ep():
    llama, hw = resolve_model("llama"), resolve_hardware("h100x8")
    e = estimate(llama, hw, Workload(32768), Candidate(sp=8))
    assert e.memory.expert_states == 0 and e.time.expert_comm == 0
    with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
        estimate(llama, hw, Workload(32768), Candidate(sp=8, ep=2))
    with pytest.raises(ValueError, match="does not divide the 8 experts"):
        estimate(resolve_model("mixtral"), resolve_hardware("h100x8", nodes=2), Workload(32768),
                 Candidate(sp=16, ep=16))
    with pytest.raises(ValueError, match="dividing sp x dp"):
        Candidate(sp=4, ep=8)


def _write(tmp_path, config):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


MOE_CONFIGS = {
    "qwen3_moe": ({"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
                   "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
                   "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
                   "vocab_size": 151936, "tie_word_embeddings": False, "use_sliding_window": False,
                   "sliding_window": None}, "qwen3-30b-a3b"),
    "mixtral": ({"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                 "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
                 "vocab_size": 32000, "tie_word_embeddings": False, "sliding_window": None}, "mixtral-8x7b"),
}


@pytest.mark.parametrize("kind", sorted(MOE_CONFIGS))
def test_hf_moe_configs_read_as_the_presets(tmp_path, kind):
    config, preset = MOE_CONFIGS[kind]
    spec, ref = resolve_model(_write(tmp_path, config)), resolve_model(preset)
    for field in ("n_experts", "experts_per_token", "expert_ffn_hidden", "shared_ffn_hidden", "dense_layers"):
        assert getattr(spec, field) == getattr(ref, field), field
    assert spec.n_params() == ref.n_params()


def test_olmoe_and_deepseek_style_configs(tmp_path):
    # OLMoE-1B-7B (allenai/OLMoE-1B-7B-0924 config.json): 64 experts of intermediate_size 1024, top-8; ~6.9B / 1.3B
    olmoe = resolve_model(_write(tmp_path, {
        "model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024, "num_attention_heads": 16,
        "num_hidden_layers": 16, "num_key_value_heads": 16, "num_experts": 64, "num_experts_per_tok": 8,
        "vocab_size": 50304, "tie_word_embeddings": False}))
    assert round(olmoe.n_params() / 1e9, 2) == 6.92 and round(moe.active_params(olmoe) / 1e9, 2) == 1.28
    # DeepSeek-V2 style: shared experts (n_shared_experts x moe_intermediate_size), first layer dense
    ds = resolve_model(_write(tmp_path, {
        "model_type": "deepseek_v2", "hidden_size": 256, "intermediate_size": 1024, "moe_intermediate_size": 64,
        "num_attention_heads": 4, "num_hidden_layers": 4, "n_routed_experts": 16, "n_shared_experts": 2,
        "num_experts_per_tok": 4, "first_k_dense_replace": 1, "moe_layer_freq": 1, "vocab_size": 1000}))
    assert (ds.n_experts, ds.shared_ffn_hidden, ds.dense_layers) == (16, 128, (0,))
    mlp = 3 * 256 * 1024, 256 * 16 + 3 * 256 * 128 + 16 * 3 * 256 * 64
    attention = 4 * 256 * 256 + 2 * 256
    assert ds.n_params() == 4 * attention + mlp[0] + 3 * mlp[1] + 2 * 1000 * 256 + 256


@pytest.mark.parametrize("config, named", [
    ({"model_type": "jamba", "architectures": ["JambaForCausalLM"]}, "hybrid model with linear-attention"),
    ({"model_type": "custom", "layer_types": ["mamba", "full_attention"]}, "hybrid model with linear-attention"),
    ({"model_type": "t5", "is_encoder_decoder": True, "architectures": ["T5ForConditionalGeneration"]},
     "encoder-decoder"),
    ({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "vision_config": {},
      "text_config": {"hidden_size": 3840}}, "vision-language"),
    ({"model_type": "deepseek_v2", "kv_lora_rank": 512}, "multi-head latent attention"),
])
def test_refused_architectures_one_line(tmp_path, config, named):
    assert named in architectures.architecture_refusal(config)
    with pytest.raises(UsageError) as err:
        resolve_model(_write(tmp_path, {**config, "hidden_size": 64, "num_hidden_layers": 2,
                                        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 97}))
    assert named in str(err.value) and "\n" not in str(err.value) and str(tmp_path) in str(err.value)
    assert architectures.architecture_refusal({"model_type": "llama"}) is None


def test_gemma_soft_capping_is_priced():
    gemma, hw = resolve_model("gemma-2-9b"), resolve_hardware("h100x8")
    plain = replace(gemma, attn_logit_softcap=0.0, final_logit_softcap=0.0)
    cand, work = Candidate(sp=8, checkpointing="full", zero_stage=3), Workload(131072)
    capped, base = estimate(gemma, hw, work, cand), estimate(plain, hw, work, cand)
    assert capped.time.compute > base.time.compute                  # slower score-modified attention kernel
    assert capped.memory.logits_loss > base.memory.logits_loss      # the tanh output of the capped logits
    # interleaved local/global layers: 21 of 42 layers attend to a 4096-token window
    assert gemma.windowed_layers == 21 and gemma.sliding_window == 4096
    g3 = resolve_model("gemma-3-12b")
    assert g3.windowed_layers == 40 and g3.sliding_window == 1024 and g3.tied_embeddings


def test_gemma3_config_windows_and_the_multimodal_wrapper(tmp_path):
    # google/gemma-3-12b-pt's text_config (saved as its own config.json): 5 of every 6 layers local, 1,024 tokens
    text = {"model_type": "gemma3_text", "hidden_size": 3840, "intermediate_size": 15360, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 256, "num_hidden_layers": 48, "vocab_size": 262208,
            "sliding_window": 1024, "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0}
    spec = resolve_model(_write(tmp_path, text))
    preset = resolve_model("gemma-3-12b")
    assert (spec.sliding_window, spec.sliding_layers) == (preset.sliding_window, preset.sliding_layers)
    assert spec.n_params() == preset.n_params() and spec.tied_embeddings
    # the multimodal wrapper itself is a vision-language model: refused by name, with the way to plan its text part
    with pytest.raises(UsageError, match="vision-language model: autosp trains text decoders without a vision tower; "
                                         "plan its text_config"):
        resolve_model(_write(tmp_path, {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
                                        "text_config": text, "vision_config": {"hidden_size": 1152}}))


# --- gpt-oss (issue 35 item 3) ------------------------------------------------------------------------------------

def gpt_oss_config(preset: str) -> dict:
    """The Hugging Face config.json of a gpt-oss preset, written from the preset's fields with transformers' keys (as
    openai/gpt-oss-20b and -120b ship it: layer_types alternating from a sliding layer, YaRN, swiglu_limit)."""
    spec = resolve_model(preset)
    return {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
            "hidden_act": "silu", "hidden_size": spec.hidden, "intermediate_size": spec.expert_ffn_hidden,
            "head_dim": spec.head_dim, "num_attention_heads": spec.n_heads, "num_key_value_heads": spec.n_kv_heads,
            "num_hidden_layers": spec.n_layers, "num_local_experts": spec.n_experts,
            "num_experts_per_tok": spec.experts_per_token, "experts_per_token": spec.experts_per_token,
            "vocab_size": spec.vocab, "tie_word_embeddings": False, "sliding_window": spec.sliding_window,
            "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(spec.n_layers)],
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 150000, "swiglu_limit": 7.0,
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "original_max_position_embeddings": 4096, "truncate": False},
            "router_aux_loss_coef": 0.9, "output_router_logits": False, "initial_context_length": 4096}


@pytest.mark.parametrize("name, total, exact", [
    # transformers 5.24's GptOssForCausalLM built on the meta device counts 20,914,757,184 / 116,829,156,672: these
    # plus the o_proj biases (2,880 per layer), which the spec leaves out
    ("gpt-oss-20b", 20.91e9, 20_914_757_184 - 24 * 2880),
    ("gpt-oss-120b", 116.83e9, 116_829_156_672 - 36 * 2880),
])
def test_gpt_oss_parameter_counts(name, total, exact):
    """Total parameters (the experts' and router's biases and the sinks included) against the model card (arXiv
    2508.10925: 20.91B / 116.83B) and transformers' own count; active ones against the card's 3.61B / 5.13B, which
    count the unembedding but not the input embedding (a lookup)."""
    spec = resolve_model(name)
    assert spec.n_params() == exact and abs(spec.n_params() / total - 1) < 0.001
    published_active = preset_info(name)["published_active_params"]
    assert abs((moe.active_params(spec) - spec.vocab * spec.hidden) / published_active - 1) < 0.001
    per_expert = 3 * 2880 * 2880 + 2 * 2880 + 2880   # weights, gate/up bias, down bias
    assert moe.expert_params(spec) == spec.n_layers * spec.n_experts * per_expert
    plain = replace(spec, expert_bias=False, attention_sinks=False)
    assert spec.n_params() - plain.n_params() == spec.n_layers * (spec.n_experts * (3 * 2880 + 1) + spec.n_heads)


def test_gpt_oss_config_reads_as_the_preset(tmp_path):
    spec, ref = resolve_model(_write(tmp_path, gpt_oss_config("gpt-oss-20b"))), resolve_model("gpt-oss-20b")
    for field in ("n_experts", "experts_per_token", "expert_ffn_hidden", "expert_bias", "clamped_swiglu",
                  "attention_sinks", "sliding_window", "sliding_layers", "qkv_bias", "tied_embeddings"):
        assert getattr(spec, field) == getattr(ref, field), field
    assert spec.n_params() == ref.n_params() and ref.sliding_layers == tuple(range(0, 24, 2))


def test_gpt_oss_experts_rebuild_the_clamped_gate_in_their_backward():
    """gpt-oss's clamped SwiGLU rebuilds 3 more f_e-wide tensors per token copy in the experts op's backward than
    SiLU's (studies/gpt_oss_experts.py measures 6.98 against 3.98), at the busiest EP rank's margin; its biases are
    expert states like the weights."""
    spec, hw = resolve_model("gpt-oss-20b"), resolve_hardware("h100x8")
    silu = replace(spec, clamped_swiglu=False)
    for ep in (1, 8):
        ms, ref = (Shapes(m, Workload(65536), Candidate(sp=8, ep=ep)).moe for m in (spec, silu))
        extra = ms.cf * moe.CLAMPED_SWIGLU_EXTRA_PER_WIDTH * 4 * 2880 * 2
        assert moe.transient_bytes_per_token(ms, 2, "none") - moe.transient_bytes_per_token(ref, 2, "none") == \
            pytest.approx(extra)
    e = estimate(spec, hw, Workload(65536), Candidate(sp=8, zero_stage=1, ep=8))
    assert e.memory.expert_states == pytest.approx(moe.expert_params(spec) / 8 * (2 + 2 + 12 / 1))


@pytest.mark.parametrize("model", ["gpt-oss-20b", "gpt-oss-120b", "config:gpt-oss-20b", "config:gpt-oss-120b"])
def test_the_planner_plans_gpt_oss_at_128k_on_one_h100_node(tmp_path, model):
    """The real configs (written from the presets' fields) and the presets plan at 128k on h100x8: gpt-oss-20b fits;
    gpt-oss-120b's 117B parameters need 16 bytes each of states (1.87 TB), more than 8 GPUs and their host memory
    hold, so the planner says infeasible (exit 3) and names the GPUs that fit, which then plan."""
    from autosp.errors import InfeasibleError
    from autosp.planner.api import plan_for
    from autosp.planner.request import PlanRequest

    name = model.partition(":")[2] or model
    arg = _write(tmp_path, gpt_oss_config(name)) if model.startswith("config:") else model
    request = PlanRequest(model=arg, ctx="128k", hw="h100x8")
    if name == "gpt-oss-20b":
        plan = plan_for(request)
    else:
        with pytest.raises(InfeasibleError, match="about 16 GPUs would fit"):
            plan_for(request)
        plan = plan_for(PlanRequest(model=arg, ctx="128k", hw="h100x8", nodes=2))
    assert plan.model.attention_sinks and plan.model.expert_bias and plan.model.clamped_swiglu
    assert plan.estimate.fits and plan.candidate.sp > 1
