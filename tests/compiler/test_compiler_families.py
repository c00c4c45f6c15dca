"""Model families beyond Llama: tied input/output embeddings at ZeRO-3 with a tiled loss, Gemma 3 with a ring.

Each case trains 3 steps through autosp on 2 processes and rank 0 compares the loss of every step, every gradient
of the first step and every weight after the last against one process on the full batches (fp32, 1e-5).

- Tied embeddings (HF Llama and Qwen3 with ``tie_word_embeddings``) at ZeRO-3 with ``loss_chunks`` 3: the LM head
  is traced inline with the tiled loss and its weight, shared with the input embedding, stays gathered
  (``compiler/zero3.py``); the gradient is the sum of both uses.
- Gemma 3 (text): interleaved sliding-window and global layers with their own RoPE bases, query pre-attention
  scaling, the embedding scale, at SP 2 with a ring of 2 (pure ring attention).
"""

from __future__ import annotations

import pytest
import torch

from test_compiler_exact import TOL, VOCAB, Z3, make_batches, sgd  # noqa: E402

from autosp.compiler.testing import assert_within


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


def gemma3():
    import transformers

    config = transformers.Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                           head_dim=16, query_pre_attn_scalar=24, sliding_window=6,
                                           layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                           max_position_embeddings=256, attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    return transformers.Gemma3ForCausalLM(config)


EXACT = {
    "llama_tied_zero3_loss3": (lambda: tied("llama"), dict(seq=31),
                               dict(sp_size=2, micro_batch=2, zero_stage=3, ds_config=Z3,
                                    plan_knobs=dict(loss_chunks=3))),
    "qwen3_tied_zero3_loss3": (lambda: tied("qwen3"), dict(seq=32),
                               dict(sp_size=2, micro_batch=2, zero_stage=3, ds_config=Z3,
                                    plan_knobs=dict(loss_chunks=3))),
    "gemma3_sp2_ring2": (gemma3, dict(seq=32), dict(sp_size=2, micro_batch=2, ring_size=2)),
}


def run_cases(rank, world, names):
    from autosp.compiler import testing
    from autosp.cost_models.specs import Candidate

    def run_one(name):
        factory, batch_kw, compile_kw = EXACT[name]
        compile_kw = {"backend": "aot_eager", **compile_kw}
        knobs = compile_kw.pop("plan_knobs", None)
        if knobs:
            compile_kw = {"plan": Candidate(sp=compile_kw.pop("sp_size"), micro_batch=compile_kw.pop("micro_batch"),
                                            zero_stage=compile_kw.pop("zero_stage"), **knobs), **compile_kw}
        model, batches = factory(), make_batches(**batch_kw)
        got = testing.sp_run(model, batches, sgd, **compile_kw)
        if rank == 0:
            ref = testing.reference_run(model, batches, sgd)
            return {"errors": testing.compare(got, ref), "losses_tiled": got["stats"].losses_tiled}
        return None

    return testing.run_cases(rank, names, run_one)


@pytest.fixture(scope="module")
def world2():
    from autosp.compiler import testing

    return testing.spawn(run_cases, 2, list(EXACT))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXACT))
def test_families_exact(world2, name):
    result = assert_within(world2[name], TOL)
    if "loss3" in name:
        assert result["losses_tiled"] >= 1
