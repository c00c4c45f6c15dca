"""Model families beyond Llama trained through autosp == one process (fp32, 1e-5): mixture of experts with expert
parallelism, tied embeddings at ZeRO-3 with a tiled loss, Gemma 2 and Gemma 3.

Tiny Hugging Face Qwen3-MoE, Mixtral and OLMoE (4 experts, top-2) built from configs. Each spawned job (world 2,
world 4) trains 3 steps per case; rank 0 compares the loss of every step, every gradient of the first step
and every weight after the last against one process on the full batches. Expert-parallel parameters hold this
rank's experts only: the comparison gathers them over the EP group (:func:`autosp.compiler.testing.full_grad`).
Cases cover each MoE family at SP 2 and SP 4, SP alone (autosp's expert op replaces Hugging Face's
data-dependent expert loop), EP = 2 inside the SP group, SP 2 x EP 2 with DP (4 processes), EP 4, ZeRO 0-3 (at
ZeRO-3 the expert parameters are partitioned over the expert-data-parallel group: a rank never holds, nor
gathers, another rank's experts), the router's auxiliary load-balancing loss over the whole batch (right-padded
batches: the tokens the attention_mask pads count in neither side's statistics), packed documents, the MoE MLP
tiled (``mlp_chunks``: the expert op runs token pieces), and the refusals. The expert-parallel cases at ZeRO 0-2
and ZeRO-3 with the aux loss step with SGD and clip (their global gradient norm is above the threshold): a weight's
change is then lr x its clipped gradient, so clipping with any other norm than the global one shows in the
weights (AdamW, nearly scale-invariant, would hide it); the engine's reported norm is the global one too.

Tied embeddings (HF Llama and Qwen3 with ``tie_word_embeddings``) at ZeRO-3 with ``loss_chunks`` 3: the LM head is
traced inline with the tiled loss and its weight, shared with the input embedding, stays gathered
(``compiler/zero3.py``); the gradient is the sum of both uses. Gemma 2 (eager attention in transformers, its
attention logits and final logits soft-capped: compiler/softcapping.py) at Ulysses SP 2 with the final-logit cap
inside the tiled loss, and with a ring of 2; Gemma 3 (text) with a ring of 2. Both: interleaved sliding-window and
global layers, query pre-attention scaling, the embedding scale.
"""

from __future__ import annotations

import pytest
import torch

from test_compiler_exact import TOL, VOCAB, Z3, make_batches, sgd  # noqa: E402
from test_compiler_packed import packed_batches  # noqa: E402

from autosp.compiler.testing import assert_within
from autosp.contract.specs import Candidate

N_EXPERTS = 4


def moe_model(kind, aux=False, n_experts=N_EXPERTS):
    import transformers

    config_cls, model_cls, extra = {
        "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                      dict(num_experts=n_experts, moe_intermediate_size=32, head_dim=16, norm_topk_prob=True)),
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM, dict(num_local_experts=n_experts)),
        "olmoe": (transformers.OlmoeConfig, transformers.OlmoeForCausalLM, dict(num_experts=n_experts)),
    }[kind]
    config = config_cls(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_experts_per_tok=2,
                        max_position_embeddings=256, attn_implementation="sdpa", use_cache=False,
                        output_router_logits=aux, router_aux_loss_coef=0.1, **extra)
    torch.manual_seed(0)
    model = model_cls(config)
    with torch.no_grad():  # Qwen3-MoE's router starts at zero (ties everywhere): give it a real routing
        for name, p in model.named_parameters():
            if name.endswith("gate.weight"):
                p.normal_(0, 0.5)
    return model


def tied(kind):
    import transformers

    config_cls, model_cls, extra = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(head_dim=16)),
    }[kind]
    config = config_cls(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                        attn_implementation="sdpa", use_cache=False, tie_word_embeddings=True, **extra)
    torch.manual_seed(0)
    model = model_cls(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


def gemma(version, n_layers=2):
    """Tiny Gemma 2 or 3 (text): a sliding-window layer then a global one, query pre-attention scaling, the
    embedding scale; Gemma 2 caps its attention logits and its final logits (caps small enough to bite)."""
    import transformers

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=6,
                  layer_types=["sliding_attention", "full_attention"] * (n_layers // 2) + ["sliding_attention"] * (n_layers % 2),
                  max_position_embeddings=256, use_cache=False)
    torch.manual_seed(0)
    if version == 2:  # transformers runs it with eager attention (SDPA has no soft-capping)
        config = transformers.Gemma2Config(attn_logit_softcapping=0.5, final_logit_softcapping=2.0, **common)
        return transformers.Gemma2ForCausalLM(config)
    config = transformers.Gemma3TextConfig(attn_implementation="sdpa", **common)
    return transformers.Gemma3ForCausalLM(config)


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)


# name -> (world, model factory, batches, sp_run's plan= and options[, optimizer]). Each case combines several
# features (every case is a fresh compile and DeepSpeed engine: the cost of this file), the two worlds are two
# spawned jobs.
EXACT = {
    # tied embeddings at ZeRO-3 with a tiled loss (S % P != 0 for Llama)
    "llama_tied_zero3_loss3": (2, lambda: tied("llama"), dict(seq=31),
                               dict(plan=Candidate(sp=2, micro_batch=2, zero_stage=3, loss_chunks=3), ds_config=Z3),
                               sgd),
    "qwen3_tied_zero3_loss3": (2, lambda: tied("qwen3"), dict(seq=32),
                               dict(plan=Candidate(sp=2, micro_batch=2, zero_stage=3, loss_chunks=3), ds_config=Z3),
                               sgd),
    # Gemma 2, Ulysses SP 2: capped attention in span attention (with the sliding window), the final-logit cap
    # inside the tiled loss, query pre-attention scale
    "gemma2_sp2_loss3": (2, lambda: gemma(2), dict(seq=32),
                         dict(plan=Candidate(sp=2, micro_batch=2, zero_stage=0, loss_chunks=3)), sgd),
    # Gemma 2 and 3 with a pure ring of 2: capped (Gemma 2) and windowed blocks passed around the ring
    "gemma2_sp2_ring2": (2, lambda: gemma(2), dict(seq=32), dict(plan=Candidate(sp=2, micro_batch=2, ring=2)), sgd),
    "gemma3_sp2_ring2": (2, lambda: gemma(3), dict(seq=32), dict(plan=Candidate(sp=2, micro_batch=2, ring=2)), sgd),
    # EP 2 = the SP group, ZeRO-3 (experts partitioned over the expert-data-parallel group), aux loss, S % P, rows
    # right-padded with an attention_mask
    "qwen3_moe_sp2_ep2_zero3_aux_pad_mask": (2, lambda: moe_model("qwen3_moe", aux=True), dict(seq=31, pad_mask=True),
                                             dict(plan=Candidate(sp=2, micro_batch=2, ep=2, zero_stage=3),
                                                  ds_config=Z3), sgd),
    # Mixtral, EP 2, ZeRO-1 (DeepSpeed's MoE optimizer groups)
    "mixtral_sp2_ep2_zero1": (2, lambda: moe_model("mixtral"), dict(seq=32),
                              dict(plan=Candidate(sp=2, micro_batch=2, ep=2, zero_stage=1)), sgd),
    # OLMoE, EP 2, ZeRO-2, aux loss, selective checkpointing (the loss code after the layers reads every layer's
    # router logits)
    "olmoe_sp2_ep2_zero2_aux_selective": (2, lambda: moe_model("olmoe", aux=True), dict(seq=32),
                                          dict(plan=Candidate(sp=2, micro_batch=2, ep=2, zero_stage=2,
                                                              checkpointing="selective")), sgd),
    # SP 2 x DP 2, EP 2 inside each SP group, ZeRO-0 (autosp clips with the global norm), aux loss over all 4
    # ranks, the DP replicas' rows right-padded differently
    "qwen3_moe_sp2_dp2_ep2_aux_mask": (4, lambda: moe_model("qwen3_moe", aux=True), dict(seq=32, pad_mask=True),
                                       dict(plan=Candidate(sp=2, dp=2, micro_batch=1, ep=2)), sgd),
    # SP 4 alone (autosp's expert op instead of HF's data-dependent loop), packed documents (seq_lens)
    "qwen3_moe_sp4_packed": (4, lambda: moe_model("qwen3_moe"), "packed", dict(plan=Candidate(sp=4, micro_batch=2))),
    # Mixtral at SP 4, EP 4 (one expert per rank), ZeRO-3
    "mixtral_sp4_ep4_zero3": (4, lambda: moe_model("mixtral"), dict(seq=32),
                              dict(plan=Candidate(sp=4, micro_batch=2, ep=4, zero_stage=3), ds_config=Z3)),
    # OLMoE at SP 4, EP 2, ZeRO-0, the MoE MLP tiled (mlp_chunks 2: the expert op dispatches two token pieces)
    "olmoe_sp4_ep2_mlp2": (4, lambda: moe_model("olmoe"), dict(seq=32),
                           dict(plan=Candidate(sp=4, micro_batch=2, ep=2, zero_stage=0, mlp_chunks=2)), sgd),
}

ERRORS = {
    "ep_not_dividing_experts": (lambda: moe_model("mixtral", n_experts=3), Candidate(sp=2, micro_batch=2, ep=2),
                                "does not divide"),
}


def run_cases(rank, world, names):
    from autosp.compiler import testing

    def run_one(name):
        _, factory, batch_kw, compile_kw, *optimizer = EXACT[name]
        optimizer = optimizer[0] if optimizer else adamw
        compile_kw = {"backend": "aot_eager", **compile_kw}
        model = factory()
        if batch_kw == "packed":
            batches, loss_fn = packed_batches(form="seq_lens"), testing.packed_loss
        else:
            batches, loss_fn = make_batches(**batch_kw), None
        got = testing.sp_run(model, batches, optimizer, **compile_kw)
        if rank == 0:
            ref = testing.reference_run(model, batches, optimizer, loss_fn=loss_fn)
            return {"errors": testing.compare(got, ref), "losses_tiled": got["stats"].losses_tiled,
                    "mlps_tiled": got["stats"].mlps_tiled, "grad_norm": got["grad_norm"],
                    "ref_grad_norm": ref["grad_norm"], "clip": ref["clip"]}
        return None

    return testing.run_cases(rank, [n for n in names if EXACT[n][0] == world], run_one)


def run_errors(rank, world, names):
    from autosp.compiler import testing
    from autosp.compiler.api import compile_model
    from autosp.compiler.options import CompileOptions
    from autosp.errors import UsageError

    def run_one(name):
        factory, plan, _ = ERRORS[name]
        try:
            compile_model(factory(), plan, options=CompileOptions(backend="aot_eager"))
        except UsageError as err:
            return {"error": str(err)}
        return {"error": None}

    return testing.run_cases(rank, names, run_one)


def run_world2(rank, world):
    out = run_cases(rank, world, list(EXACT))
    out.update(run_errors(rank, world, list(ERRORS)))
    return out


@pytest.fixture(scope="module")
def world2():
    from autosp.compiler import testing

    return testing.spawn(run_world2, 2)


@pytest.fixture(scope="module")
def world4():
    from autosp.compiler import testing

    return testing.spawn(run_cases, 4, list(EXACT))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, case in EXACT.items() if case[0] == 2])
def test_exact_world2(world2, name):
    result = assert_within(world2[name], TOL)
    assert (result["losses_tiled"] > 0) == ("loss3" in name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, case in EXACT.items() if case[0] == 4])
def test_exact_world4(world4, name):
    result = assert_within(world4[name], TOL)
    assert (result["mlps_tiled"] > 0) == ("mlp2" in name)  # the expert op took the MLP tiling


CLIPPED_EP = [name for name, case in EXACT.items() if "_ep" in name and case[4:] == (sgd,)]


@pytest.mark.slow
@pytest.mark.parametrize("name", CLIPPED_EP)
def test_expert_parallel_clips_with_the_global_norm(request, name):
    """The case's clipping bites (else the weights could not show a wrong norm), and the engine's gradient norm is
    one process's: its dense and every rank's expert gradients together, at every ZeRO stage."""
    result = request.getfixturevalue(f"world{EXACT[name][0]}")[name]
    assert "crash" not in result, result.get("crash")
    assert result["ref_grad_norm"] > 1.2 * result["clip"] > 0, result
    assert abs(result["grad_norm"] - result["ref_grad_norm"]) <= TOL * result["ref_grad_norm"], result


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ERRORS))
def test_moe_refusals(world2, name):
    error = world2[name]["error"]
    assert error is not None and ERRORS[name][2] in error and "\n" not in error


class _Configured(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.linear = torch.nn.Linear(2, 2)


@pytest.mark.parametrize("config, words", [
    (dict(model_type="jamba"), "hybrid model with linear-attention or state-space layers"),
    (dict(model_type="t5"), "encoder-decoder"),
    (dict(model_type="gemma3"), "vision-language"),
    (dict(model_type="my_vlm", vision_config={}), "vision-language"),
])
def test_compile_refuses_architectures_before_building_anything(config, words, monkeypatch):
    from types import SimpleNamespace

    import deepspeed

    from autosp.compiler.api import compile_model
    from autosp.errors import UsageError

    def built(*args, **kwargs):
        raise AssertionError("a process group or a DeepSpeed engine was built before the refusal")

    # before torch.distributed or DeepSpeed: whatever earlier tests left initialised, nothing is built now
    for module, name in ((deepspeed, "init_distributed"), (deepspeed, "initialize"),
                         (torch.distributed, "init_process_group")):
        monkeypatch.setattr(module, name, built)
    with pytest.raises(UsageError) as err:
        compile_model(_Configured(SimpleNamespace(**config)), sp_size=1)
    assert words in str(err.value) and "\n" not in str(err.value)
