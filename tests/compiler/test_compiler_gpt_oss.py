"""gpt-oss trained through autosp == one process running transformers' own eager attention (fp32, 1e-5).

A tiny Hugging Face ``GptOssForCausalLM`` built from a config: a 6-token sliding-window layer then a global one,
learned attention sinks (``compiler/sinks.py``, ``compiler/attention/sinks.py``), 4 experts top-2 with biases,
gate/up interleaved and transposed weights and the clamped SwiGLU (``compiler/experts.py``), a router with a bias
(top-k of the logits, then a softmax), q/k/v/o biases and YaRN rotary embeddings. The sinks, the biases and the
router are drawn large enough to matter. One spawned world-2 job trains 3 steps per case; rank 0 compares the loss
of every step, every gradient of the first step (the sinks, the expert and router biases included) and every
weight after the last with one process on the full batches, whose attention is transformers' eager
``eager_attention_forward`` (packed documents: each document run alone, :func:`autosp.compiler.testing.packed_loss`).

The cases combine: S % P != 0 with the head pipeline (the sinks sliced per head group) and the experts op in token
pieces; ZeRO-3 with packed documents; expert parallelism (EP 2 inside the SP group) with the router's
load-balancing loss; a pure ring of 2 (the sinks merged once after the ring's blocks) with packed documents;
sequence-chunked layers (the sinks merged after every key chunk) with the K/V all-to-alls overlapped. The
single-process pieces (the sinks' merge and gradient, the experts op) are checked against transformers' code.
"""

from __future__ import annotations

import copy

import pytest
import torch

from test_compiler_exact import TOL, VOCAB, Z3, make_batches, sgd  # noqa: E402
from test_compiler_packed import packed_batches  # noqa: E402

from autosp.compiler.testing import assert_within
from autosp.contract.specs import Candidate

WINDOW = 6


def gpt_oss(aux=False):
    """Tiny gpt-oss: 2 layers (sliding, full), 4 heads / 2 KV heads of 16, 4 experts top-2, YaRN."""
    import transformers

    config = transformers.GptOssConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
        max_position_embeddings=64, use_cache=False, output_router_logits=aux, router_aux_loss_coef=0.1,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16})
    assert config.layer_types == ["sliding_attention", "full_attention"]
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config)
    with torch.no_grad():  # transformers starts the biases at zero and the sinks small: make them matter
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.normal_(0, 1.0)
            elif "bias" in name:
                p.normal_(0, 0.1)
    assert model.config._attn_implementation == "eager"  # the reference: transformers' own eager attention
    return model


# name -> (batches, sp_run's plan= and options)
EXACT = {
    # S % P != 0; the head pipeline (2 local heads: one ring of groups, each with its heads' sinks); the experts op
    # in token pieces (mlp_chunks)
    "sp2_pad_head_pipeline_mlp2": (dict(seq=31), dict(plan=Candidate(sp=2, micro_batch=2, overlap="head_pipeline",
                                                                     mlp_chunks=2))),
    # ZeRO-3 (each layer's attention traced in its own frame: windowed and global layers compiled apart) with
    # packed documents crossing the shard boundary, and the knobs autosp-plan picks for gpt-oss-20b at 128k on
    # h100x8 (selective checkpointing, activation offload, the head pipeline)
    "sp2_zero3_packed_selective_offload_head_pipeline": (
        "packed", dict(plan=Candidate(sp=2, micro_batch=2, zero_stage=3, checkpointing="selective",
                                      offload_activations=True, overlap="head_pipeline"), ds_config=Z3)),
    # EP 2 = the SP group (experts and their biases sharded) at ZeRO-0 (autosp clips with the global norm), the
    # load-balancing loss over the batch, S % P != 0, rows right-padded with an attention_mask
    "sp2_ep2_zero0_aux_pad_mask": (dict(seq=31, pad_mask=True),
                                   dict(plan=Candidate(sp=2, micro_batch=2, ep=2, zero_stage=0))),
    # pure ring of 2 (SP 2 = 1 x 2): the sinks join the ring's log-sum-exp merge once; packed documents; with
    # sequence checkpointing and the tiled loss, as gpt-oss-120b's plan at 128k on 2 x h100x8
    "sp2_ring2_packed_sequence_loss2": ("packed", dict(plan=Candidate(sp=2, micro_batch=2, ring=2,
                                                                      checkpointing="sequence", loss_chunks=2))),
    # sequence-chunked layers (sinks merged after the key chunks), K/V all-to-alls overlapped
    "sp2_chunks2_kv_async": (dict(seq=32), dict(plan=Candidate(sp=2, micro_batch=2, sequence_chunks=2,
                                                               overlap="kv_async"))),
}


def run_world2(rank, world):
    from autosp.compiler import testing

    def run_one(name):
        batch_kw, compile_kw = EXACT[name]
        compile_kw = {"backend": "aot_eager", **compile_kw}
        model = gpt_oss(aux="aux" in name)
        if batch_kw == "packed":
            batches, loss_fn = packed_batches(form="seq_lens"), testing.packed_loss
        else:
            batches, loss_fn = make_batches(**batch_kw), None
        got = testing.sp_run(model, batches, sgd, **compile_kw)
        if rank == 0:
            ref = testing.reference_run(model, batches, sgd, loss_fn=loss_fn)
            stats = got["stats"]
            return {"errors": testing.compare(got, ref), "mlps_tiled": stats.mlps_tiled,
                    "losses_tiled": stats.losses_tiled,
                    "layers_chunked": stats.layers_chunked, "overlapped": stats.attention_overlapped,
                    "grad_norm": got["grad_norm"], "ref_grad_norm": ref["grad_norm"], "clip": ref["clip"]}
        return None

    return testing.run_cases(rank, list(EXACT), run_one)


@pytest.fixture(scope="module")
def world2():
    from autosp.compiler import testing

    return testing.spawn(run_world2, 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXACT))
def test_gpt_oss_matches_one_process(world2, name):
    result = assert_within(world2[name], TOL)
    assert (result["mlps_tiled"] > 0) == ("mlp2" in name)       # the experts op took the MLP tiling
    assert (result["losses_tiled"] > 0) == ("loss2" in name)
    assert (result["layers_chunked"] > 0) == ("chunks2" in name)
    assert (result["overlapped"] > 0) == ("head_pipeline" in name or "kv_async" in name)
    # the engine's gradient norm is one process's; with EP (each rank's own experts) clipping bites, so the
    # weights show which norm it clipped with
    assert abs(result["grad_norm"] - result["ref_grad_norm"]) <= TOL * result["ref_grad_norm"], result
    if "_ep" in name:
        assert result["ref_grad_norm"] > 1.2 * result["clip"] > 0, result


# --- one process: the pieces against transformers' code ---------------------------------------------------
@pytest.mark.parametrize("window", [0, WINDOW])
def test_span_attention_with_sinks_is_transformers_eager_attention(window):
    """The span op (the sinks merged after the pieces; their gradient from the merged output) against
    transformers' gpt-oss ``eager_attention_forward`` with its sliding-window mask: output and every gradient."""
    from types import SimpleNamespace

    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    from autosp.compiler.attention.local import span_attention

    gen = torch.Generator().manual_seed(0)
    b, h, h_kv, s, d = 2, 4, 2, 40, 8
    q, k, v = (torch.randn(b, n, s, d, generator=gen).requires_grad_() for n in (h, h_kv, h_kv))
    sinks = torch.randn(h, generator=gen).requires_grad_()
    i = torch.arange(s)
    allowed = (i[None, :] <= i[:, None]) & ((i[None, :] > i[:, None] - window) if window else True)
    mask = torch.zeros(s, s).masked_fill(~allowed, float("-inf"))[None, None]
    module = SimpleNamespace(sinks=sinks, num_key_value_groups=h // h_kv, training=False)
    ref = eager_attention_forward(module, q, k, v, mask, scaling=d ** -0.5)[0].transpose(1, 2)
    got, _ = span_attention(q, k, v, d ** -0.5, "", window, 0.0, sinks)
    grad = torch.randn(ref.shape, generator=gen)
    expected = torch.autograd.grad(ref, (q, k, v, sinks), grad)
    actual = torch.autograd.grad(got, (q, k, v, sinks), grad)
    assert torch.allclose(got, ref, atol=1e-6)
    for a, e in zip(actual, expected):
        assert torch.allclose(a, e, atol=2e-6), (a - e).abs().max()


@pytest.mark.parametrize("chunks", [1, 3])
def test_experts_op_is_gpt_oss_experts(chunks):
    """autosp's experts op on transformers' GptOssExperts (transposed weights, biases, interleaved gate/up, the
    clamped SwiGLU through the module's own ``_apply_gate``) against its eager loop: output and every gradient,
    in token pieces too; gate values beyond the clamp are exercised."""
    import transformers
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    from autosp.compiler import experts as autosp_experts

    config = transformers.GptOssConfig(hidden_size=16, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    module = GptOssExperts(config)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 1.0)
    eager = copy.deepcopy(module)
    eager.config = copy.deepcopy(config)
    eager.config._experts_implementation = "eager"
    tokens = torch.randn(12, 16, requires_grad=True)
    weights, index = torch.topk(torch.randn(12, 4), 2)
    weights = weights.softmax(-1).requires_grad_()
    assert autosp_experts.prepare_experts(torch.nn.ModuleDict({"experts": module}), ep=1) == 1
    inner = torch.nn.functional.linear(tokens, module.gate_up_proj[0].T) + module.gate_up_proj_bias[0]
    assert inner.abs().max() > config.swiglu_limit  # the clamp bites

    out = torch.ops.autosp_ops.moe_experts(tokens, index, weights, module.gate_up_proj, module.down_proj, "",
                                           module._autosp_act, chunks, module.gate_up_proj_bias,
                                           module.down_proj_bias, True)
    ref = eager(tokens, index, weights)
    grad = torch.randn(ref.shape)
    actual = torch.autograd.grad(out, (tokens, weights, *module.parameters()), grad)
    expected = torch.autograd.grad(ref, (tokens, weights, *eager.parameters()), grad)
    assert torch.allclose(out, ref, atol=1e-5)
    for a, e in zip(actual, expected):
        assert torch.allclose(a, e, rtol=1e-5, atol=1e-4), (a - e).abs().max()


def test_autosp_train_builds_gpt_oss_with_the_attention_autosp_replaces():
    """autosp-train's preflight takes a gpt-oss config.json (transformers has no SDPA path for its sinks; autosp runs
    its own sink attention) and builds the model with eager attention, not SDPA (which transformers refuses)."""
    import transformers

    from autosp.compiler.preflight import ModelFacts, hf_model_class
    from autosp.compiler.train_cli import _attn_implementation

    config = transformers.GptOssConfig(num_hidden_layers=2, num_local_experts=4).to_dict()
    cls, hf_config = hf_model_class(ModelFacts(spec=None, hf_config=config, hf_path="gpt-oss/config.json",
                                               description="gpt-oss"))
    assert cls is transformers.GptOssForCausalLM and _attn_implementation(hf_config) == "eager"
    assert _attn_implementation(transformers.LlamaConfig()) == "sdpa"
