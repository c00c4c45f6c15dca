"""MLP tiling, logits+loss tiling and the overlap schedules (plan knobs ``mlp_chunks``, ``loss_chunks``,
``overlap``).

Multi-process part (one spawned world-2 gloo job, like tests/compiler/test_compiler_exact.py): every case trains 3
steps at SP=2 through ``autosp.compile(plan=Candidate(...))`` and rank 0 compares the loss of every step,
every gradient of the first step and every weight after the last with one process on the full sequence
(fp32, relative 1e-5). The cases cover: S/P not divisible by the chunk count, MLP biases, HF models,
ignore_index labels spread unevenly with runtime padding and a right-padding mask, tied embeddings, GQA
with one KV head replicated over P, Inductor, ZeRO-3 (the loss tiled with tied embeddings too), and all
knobs at once (with the checkpointing and offload knobs).

Unit part (no processes): the tiled ops against the untiled computation in fp64 (and gradcheck), the
pattern matching on traced reference / Hugging Face graphs, the overlap schedules' node order in the FX
graph and in the code Inductor emits (forward and backward), and the errors.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from test_compiler_exact import TOL, Z3, hf_model, make_batches, reference_llama, sgd  # noqa: E402

from autosp.compiler import ops  # noqa: F401  (registers torch.ops.autosp_ops.*)
from autosp.compiler.context import SPContext
from autosp.compiler.passes import attention_pass, loss_pass
from autosp.compiler.passes.attention import A2A, A2A_START, A2A_WAIT, head_groups
from autosp.compiler.passes.common import SDPA, is_call
from autosp.compiler.passes.tiling_loss import (
    TILED_LOSS,
    loss_reference,
    loss_tiling_pass,
    tiled_linear_cross_entropy,
)
from autosp.compiler.passes.tiling_mlp import TILED_MLP, mlp_reference, mlp_tiling_pass, tiled_mlp
from autosp.compiler.testing import assert_within
from autosp.contract.specs import Candidate, ModelSpec
from autosp.errors import UsageError

from studies.measure.memory import allocated_peak  # the CPU allocation-event peak the studies use

# name -> (model factory, batch kwargs, candidate fields, compile kwargs)
CASES = {
    # 15 tokens per rank (S = 30) in 4 MLP chunks of 4, 4, 4, 3
    "mlp4_uneven_chunks": (reference_llama, dict(seq=30), dict(mlp_chunks=4), {}),
    # HF Llama with MLP biases; S = 31 padded to 32 by the runtime, 16 tokens per rank in 3 chunks
    "hf_llama_mlp_bias_mlp3": (lambda: hf_model("llama", mlp_bias=True), dict(seq=31), dict(mlp_chunks=3), {}),
    # tied embeddings; ignore_index runs spread unevenly + a right-padding mask + runtime padding (S = 31)
    "loss3_tied_ignore_padding": (lambda: hf_model("llama", tie_word_embeddings=True), dict(seq=31, pad_mask=True),
                                  dict(loss_chunks=3), {}),
    # HF's loss path (logits.float(), view, labels.to(device)) with more chunks than a row has tokens
    "hf_qwen2_loss20": (lambda: hf_model("qwen2"), dict(seq=32), dict(loss_chunks=20), {}),
    # kv_async on HF Llama: 2 KV heads sharded over P = 2
    "hf_llama_kv_async": (lambda: hf_model("llama"), dict(seq=32), dict(overlap="kv_async"), {}),
    # head_pipeline with GQA: 8 query heads (4 per rank -> 4 groups), one KV head replicated over P = 2
    "head_pipeline_gqa_kv1": (lambda: reference_llama(n_kv=1, n_heads=8), dict(seq=30),
                              dict(overlap="head_pipeline"), {}),
    # Inductor: the three knobs at once
    "inductor_mlp3_loss2_kv_async": (reference_llama, dict(seq=32),
                                     dict(mlp_chunks=3, loss_chunks=2, overlap="kv_async"),
                                     dict(backend="inductor")),
    # ZeRO-3 (every layer its own graph): MLP tiling and the head pipeline
    "zero3_mlp2_head_pipeline": (reference_llama, dict(seq=32),
                                 dict(mlp_chunks=2, overlap="head_pipeline", zero_stage=3), dict(ds_config=Z3)),
    # ZeRO-3 with the loss tiled: the LM head is made persistent and traced inline with the loss (zero3.py);
    # HF Llama (get_output_embeddings) and the reference model (its lm_head), with MLP tiling
    "zero3_hf_llama_loss4": (lambda: hf_model("llama"), dict(seq=32), dict(loss_chunks=4, zero_stage=3),
                             dict(ds_config=Z3)),
    "zero3_loss3_mlp2": (reference_llama, dict(seq=30), dict(loss_chunks=3, mlp_chunks=2, zero_stage=3),
                         dict(ds_config=Z3)),
    # tied embeddings at ZeRO-3 with the loss tiled: the shared matrix's gradient sums the embedding's and the
    # tiled loss's. HF Llama under DeepSpeed's default persistence threshold (the tiny head is resident already:
    # it was refused as having no LM head), the reference model with every parameter partitioned
    "zero3_hf_llama_tied_loss2": (lambda: hf_model("llama", tie_word_embeddings=True), dict(seq=32),
                                  dict(loss_chunks=2, zero_stage=3), {}),
    "zero3_tied_loss2_partitioned": (lambda: reference_llama(tied=True), dict(seq=30),
                                     dict(loss_chunks=2, zero_stage=3), dict(ds_config=Z3)),
}


def run_cases(rank, world, names):
    from autosp.compiler import testing

    def run_one(name):
        factory, batch_kw, fields, compile_kw = CASES[name]
        model, batches = factory(), make_batches(**batch_kw)
        plan = Candidate(sp=2, micro_batch=2, **fields)
        got = testing.sp_run(model, batches, sgd, plan=plan, **{"backend": "aot_eager", **compile_kw})
        if rank == 0:
            ref = testing.reference_run(model, batches, sgd)
            return {"errors": testing.compare(got, ref), "stats": got["stats"]}

    return testing.run_cases(rank, names, run_one)


@pytest.fixture(scope="module")
def world2():
    from autosp.compiler import testing

    return testing.spawn(run_cases, 2, list(CASES))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_exact_against_single_process(world2, name):
    result = assert_within(world2[name], TOL)
    stats, fields = result["stats"], CASES[name][2]
    assert (stats.mlps_tiled > 0) == (fields.get("mlp_chunks", 1) > 1), stats
    assert (stats.losses_tiled > 0) == (fields.get("loss_chunks", 1) > 1), stats
    assert (stats.attention_overlapped > 0) == (fields.get("overlap", "none") != "none"), stats


# --- the tiled ops against the untiled computation (fp64) ---------------------------------------------------
def _grads(fn, inputs):
    inputs = [t.detach().clone().requires_grad_() if t is not None else None for t in inputs]
    out = fn(*inputs)
    weights = torch.randn_like(out) if out.dim() else torch.tensor(1.7, dtype=out.dtype)
    given = [t for t in inputs if t is not None]
    return out.detach(), torch.autograd.grad((out * weights).sum(), given)


@pytest.mark.parametrize("act,gated,bias,tokens,chunks", [
    ("silu", True, False, 10, 3),      # Llama/Mistral/Qwen2 MLP, 10 tokens in chunks of 4, 3, 3
    ("gelu_tanh", True, True, 10, 4),
    ("gelu", False, True, 5, 7),       # more chunks than tokens: empty chunks
    ("relu", False, False, 9, 1),
])
def test_tiled_mlp_equals_the_untiled_mlp(act, gated, bias, tokens, chunks):
    torch.manual_seed(0)
    h, f = 6, 11
    d = dict(dtype=torch.float64)
    x = torch.randn(2, tokens, h, **d)
    up_w, down_w = torch.randn(f, h, **d), torch.randn(h, f, **d)
    gate_w = torch.randn(f, h, **d) if gated else None
    up_b, gate_b, down_b = ((torch.randn(f, **d), torch.randn(f, **d) if gated else None, torch.randn(h, **d))
                            if bias else (None, None, None))
    inputs = [x, up_w, up_b, gate_w, gate_b, down_w, down_b]
    torch.manual_seed(1)
    want, want_grads = _grads(lambda *t: mlp_reference(*t, act), inputs)
    torch.manual_seed(1)
    got, got_grads = _grads(lambda *t: tiled_mlp(*t, act, chunks), inputs)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
    for g, w in zip(got_grads, want_grads):
        assert torch.allclose(g, w, rtol=1e-12, atol=1e-12)
    if act == "silu":
        small = [t[:, :3].clone() if i == 0 else t for i, t in enumerate(inputs)]
        assert torch.autograd.gradcheck(lambda *t: tiled_mlp(*t, act, 2),
                                        [t.requires_grad_() if t is not None else None for t in small])


@pytest.mark.parametrize("bias,upcast,chunks", [(False, True, 3), (True, False, 4), (False, True, 50)])
def test_tiled_loss_equals_the_untiled_loss(bias, upcast, chunks):
    torch.manual_seed(0)
    d = dict(dtype=torch.float64)
    hidden, weight = torch.randn(2, 9, 5, **d), torch.randn(13, 5, **d)
    b = torch.randn(13, **d) if bias else None
    target = torch.randint(0, 13, (18,))
    target[2:7] = -100                  # a run of ignored targets inside one chunk
    target[-1] = -100
    inputs = [hidden, weight, b]
    want, want_grads = _grads(lambda *t: loss_reference(*t, target, -100, upcast), inputs)
    got, got_grads = _grads(lambda *t: tiled_linear_cross_entropy(*t, target, -100, upcast, chunks), inputs)
    assert torch.allclose(got.double(), want.double(), rtol=1e-12, atol=0)
    for g, w in zip(got_grads, want_grads):
        assert torch.allclose(g, w, rtol=1e-10, atol=1e-12)
    if chunks == 3:
        assert torch.autograd.gradcheck(lambda h, w: tiled_linear_cross_entropy(h, w, None, target, -100, False, 3),
                                        [hidden.clone().requires_grad_(), weight.clone().requires_grad_()])


def test_tiled_loss_bf16_logits_upcast_like_the_model():
    torch.manual_seed(0)
    hidden, weight = torch.randn(1, 12, 8, dtype=torch.bfloat16), torch.randn(20, 8, dtype=torch.bfloat16)
    target = torch.randint(0, 20, (12,))
    want, want_grads = _grads(lambda h, w: loss_reference(h, w, None, target, -100, True), [hidden, weight])
    got, got_grads = _grads(lambda h, w: tiled_linear_cross_entropy(h, w, None, target, -100, True, 5),
                            [hidden, weight])
    assert got.dtype == want.dtype == torch.float32 and abs(got - want) <= 1e-5 * abs(want)
    for g, w in zip(got_grads, want_grads):
        assert g.dtype == torch.bfloat16 and (g.float() - w.float()).norm() <= 1e-2 * w.float().norm()


def test_tiled_backwards_hold_one_chunk_at_a_time_as_the_cost_model_prices():
    """fp32, the backward alone: the tiled MLP holds four f-wide tensors per token of one chunk (the cost model's
    3f/N live + f/N gradients) besides d x (s x h) and the weight gradients its chunks add into
    (memory.tiled_weight_grad_bytes); the tiled loss holds one tile's e + 12 bytes per logit (the cost model's
    loss peak) besides d hidden and the head's gradient. Nothing of one chunk outlives it, and the weight
    gradients accumulate in place (no fp32 copy, no product tensor)."""
    torch.manual_seed(0)
    s, h, f, n = 4096, 128, 2048, 4
    x = torch.randn(1, s, h, requires_grad=True)
    weights = [torch.randn(f, h, requires_grad=True), torch.randn(f, h, requires_grad=True),
               torch.randn(h, f, requires_grad=True)]
    out = tiled_mlp(x, weights[0], None, weights[1], None, weights[2], None, "silu", n)
    grad = torch.ones_like(out)
    peak = allocated_peak(lambda: out.backward(grad))
    per_chunk_token = (peak - 4 * 3 * h * f - 4 * s * h) / (4 * (s // n) * f)
    assert per_chunk_token == pytest.approx(4.0, abs=0.02)  # f-wide fp32 tensors per token of one chunk

    s, V, h, n = 2048, 32000, 128, 8
    hidden, weight = torch.randn(s, h, requires_grad=True), torch.randn(V, h, requires_grad=True)
    target = torch.randint(0, V, (s,))
    loss = tiled_linear_cross_entropy(hidden, weight, None, target, -100, True, n)
    peak = allocated_peak(lambda: loss.backward())
    assert (peak - 4 * V * h - 4 * s * h) / ((s // n) * V) == pytest.approx(4 + 12, abs=0.02)


# --- pattern matching on traced graphs ----------------------------------------------------------------------
from autosp.compiler.testing import capture_graph as capture  # noqa: E402


def context(local_len, sp=2, group="sp", **knobs):
    return SPContext(candidate=Candidate(sp=sp, **knobs), sp_rank=0, sp_group=group, world_group=group,
                     grad_world_size=sp, local_len=local_len, global_len=local_len * sp)


def calls(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == target]


def _small_ref(gated=True, tied=False, n_heads=4, n_kv=2):
    from autosp.compiler.models import Llama

    spec = ModelSpec(name="t", n_layers=2, hidden=32, n_heads=n_heads, n_kv_heads=n_kv, head_dim=8, ffn_hidden=48,
                     vocab=64, gated_mlp=gated, tied_embeddings=tied)
    torch.manual_seed(0)
    return Llama(spec)


def _small_hf(kind="llama", **extra):
    import transformers

    config_cls, model_cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                             "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[kind]
    config = config_cls(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa", use_cache=False,
                        **extra)
    torch.manual_seed(0)
    return model_cls(config)


def _outputs(gm, inputs):
    out = gm(*inputs)
    return [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]


MLP_MODELS = {
    "reference_swiglu": lambda: _small_ref(),
    "reference_gelu_plain": lambda: _small_ref(gated=False),
    "hf_llama_silu": lambda: _small_hf("llama"),
    "hf_llama_bias_gelu_tanh": lambda: _small_hf("llama", mlp_bias=True, hidden_act="gelu_pytorch_tanh"),
    "hf_qwen2": lambda: _small_hf("qwen2"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MLP_MODELS))
def test_mlp_tiling_pass_finds_every_mlp_and_keeps_the_values(name):
    model, s = MLP_MODELS[name](), 10
    ids = torch.randint(0, 64, (2, s))
    gm, inputs = capture(model, input_ids=ids)
    before = _outputs(gm, inputs)
    ctx = context(s, mlp_chunks=3)
    mlp_tiling_pass(gm, inputs, ctx)
    gm.graph.lint()
    gm.recompile()
    tiled = calls(gm, TILED_MLP)
    assert len(tiled) == 2 and ctx.stats.mlps_tiled == 2
    assert all(n.args[-1] == 3 for n in tiled)
    # no F.linear with the ffn width (48) is left: the s x ffn intermediates only exist inside the op
    from autosp.compiler.passes.common import shape

    assert not [n for n in gm.graph.nodes if n.op == "call_function" and n.target is F.linear
                and shape(n)[-1] == 48]
    for got, want in zip(_outputs(gm, inputs), before):
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)


class HandWrittenSiLU(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _small_ref()

    def forward(self, input_ids):
        for layer in self.inner.model.layers:
            layer.mlp.forward = lambda x, m=layer.mlp: m.down_proj(m.gate_proj(x) * torch.sigmoid(m.gate_proj(x))
                                                                    * m.up_proj(x))
        return self.inner(input_ids)


@pytest.mark.slow
def test_mlp_tiling_refuses_an_mlp_it_does_not_recognise():
    gm, inputs = capture(HandWrittenSiLU(), torch.randint(0, 64, (1, 8)))
    with pytest.raises(UsageError, match=r"mlp_chunks=2: found 0 MLP\(s\) for 2 attention layer\(s\)"):
        mlp_tiling_pass(gm, inputs, context(8, mlp_chunks=2))


LOSS_MODELS = {
    "reference_tied": lambda: _small_ref(tied=True),
    "hf_llama": lambda: _small_hf("llama"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LOSS_MODELS))
def test_loss_tiling_pass_fuses_head_and_loss_and_drops_the_logits(name):
    model, s = LOSS_MODELS[name](), 8
    ids = torch.randint(0, 64, (2, s))
    gm, inputs = capture(model, input_ids=ids, labels=ids.clone())
    ctx = context(s, loss_chunks=4)
    loss_pass(gm, inputs, ctx)
    loss_tiling_pass(gm, inputs, ctx)
    gm.graph.lint()
    fused = calls(gm, TILED_LOSS)
    assert len(fused) == 1 and ctx.stats.losses_tiled == 1
    hidden, weight, bias, target, ignore_index, upcast, chunks, softcap = fused[0].args
    assert (ignore_index, upcast, chunks, bias, softcap) == (-100, True, 4, None, 0.0)  # no final-logit cap
    assert weight.op == "placeholder"
    if name == "reference_tied":
        assert "embed_tokens" in weight.name  # the LM head's weight is the input embedding
    from autosp.compiler.passes.common import shape

    # no cross-entropy and no vocab-wide (64) linear left: the logits only exist chunk by chunk inside the op
    assert not calls(gm, F.cross_entropy)
    assert not [n for n in calls(gm, F.linear) if shape(n)[-1] == 64]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    empties = [a for a in output.all_input_nodes if a.op == "call_method" and a.target == "new_empty"]
    assert len(empties) == 1 and empties[0].args[1] == (0,)  # the model's logits are an empty tensor now


class LogitsUsedTwice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _small_ref()

    def forward(self, input_ids, labels):
        out = self.inner(input_ids, labels)
        z_loss = out.logits.logsumexp(-1).pow(2).mean()
        return out.loss + 1e-4 * z_loss


@pytest.mark.slow
def test_loss_tiling_refuses_logits_used_outside_the_loss():
    ids = torch.randint(0, 64, (1, 8))
    gm, inputs = capture(LogitsUsedTwice(), ids, ids.clone())
    ctx = context(8, loss_chunks=2)
    loss_pass(gm, inputs, ctx)
    with pytest.raises(UsageError, match="loss_chunks: the logits are also used by"):
        loss_tiling_pass(gm, inputs, ctx)


def test_the_lm_head_zero3_keeps_resident_is_found_tied_or_not():
    """ZeRO-3 loss tiling keeps this module's weight resident (compiler/zero3.py); with tied embeddings it is the
    input embedding's matrix. A model without one is refused at attach time."""
    from autosp.compiler.zero3 import lm_head_module

    tied = _small_hf("llama", tie_word_embeddings=True)
    assert lm_head_module(tied) is tied.lm_head and tied.lm_head.weight is tied.model.embed_tokens.weight
    ref = _small_ref(tied=True)
    assert lm_head_module(ref) is ref.lm_head and ref.lm_head.weight is ref.model.embed_tokens.weight
    assert lm_head_module(torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))) is None


def test_plan_knobs_are_applied_and_unknown_values_refused():
    from autosp.compiler.api import resolve_candidate

    candidate, _ = resolve_candidate(Candidate(sp=2, mlp_chunks=4, loss_chunks=8, overlap="head_pipeline"))
    assert (candidate.mlp_chunks, candidate.loss_chunks, candidate.overlap) == (4, 8, "head_pipeline")
    candidate, _ = resolve_candidate(Candidate(sp=2, zero_stage=3, loss_chunks=4, overlap="kv_async"))
    assert (candidate.zero_stage, candidate.loss_chunks) == (3, 4)
    with pytest.raises(ValueError, match="overlap must be one of"):
        Candidate(sp=2, overlap="ring")


# --- overlap schedules: order of the FX graph ---------------------------------------------------------------
@pytest.mark.parametrize("local_q,local_kv,chunks,expected", [
    (4, 1, 4, [(0, 1, 0, 1), (1, 2, 0, 1), (2, 3, 0, 1), (3, 4, 0, 1)]),   # one kv head: sent with group 0
    (4, 4, 4, [(0, 1, 0, 1), (1, 2, 1, 2), (2, 3, 2, 3), (3, 4, 3, 4)]),
    (8, 2, 4, [(0, 2, 0, 1), (2, 4, 0, 1), (4, 6, 1, 2), (6, 8, 1, 2)]),
    (6, 3, 4, [(0, 1, 0, 1), (1, 2, 0, 1), (2, 4, 1, 2), (4, 6, 2, 3)]),
    (12, 6, 4, [(0, 4, 0, 2), (4, 8, 2, 4), (8, 10, 4, 5), (10, 12, 5, 6)]),
])
def test_head_groups_follow_the_kv_heads(local_q, local_kv, chunks, expected):
    assert head_groups(local_q, local_kv, chunks) == expected


def _order(gm):
    return {n: i for i, n in enumerate(gm.graph.nodes)}


@pytest.mark.slow
def test_kv_async_starts_k_and_v_before_the_query_path_and_waits_before_attention():
    gm, inputs = capture(_small_ref(n_heads=4, n_kv=2), torch.randint(0, 64, (1, 8)))
    ctx = context(8, overlap="kv_async")
    attention_pass(gm, inputs, ctx)
    gm.graph.lint()
    pos = _order(gm)
    sdpa = [n for n in gm.graph.nodes if is_call(n, SDPA)]
    assert len(sdpa) == 2 and ctx.stats.attention_overlapped == 2
    for node in sdpa:
        q, k, v = node.args[:3]
        assert q.target is A2A and k.target is A2A_WAIT and v.target is A2A_WAIT
        starts = [k.args[0], v.args[0]]
        assert all(s.target is A2A_START for s in starts)
        (q_proj,) = [n for n in _ancestors(q) - _ancestors(starts[0]) - _ancestors(starts[1])
                     if n.target is F.linear]
        assert "q_proj" in str(q_proj.args[1])
        # start K, start V < Q projection < Q all-to-all < wait K, wait V < attention
        assert max(pos[s] for s in starts) < pos[q_proj] < pos[q] < min(pos[k], pos[v]) < pos[node]


def _ancestors(node):
    from autosp.compiler.passes.common import ancestors

    return ancestors(node)


@pytest.mark.slow
def test_head_pipeline_runs_attention_in_head_groups_with_one_group_of_look_ahead():
    gm, inputs = capture(_small_ref(n_heads=8, n_kv=2), torch.randint(0, 64, (1, 8)))
    ctx = context(8, overlap="head_pipeline")   # 4 local query heads, 1 local kv head per rank -> 4 groups
    attention_pass(gm, inputs, ctx)
    gm.graph.lint()
    layer = []
    for n in gm.graph.nodes:
        if n.target in (A2A_START, A2A_WAIT) or is_call(n, SDPA):
            layer.append("S" if n.target is A2A_START else "W" if n.target is A2A_WAIT else "A")
        if layer and n.target is torch.flatten and getattr(n.args[0], "target", None) is torch.cat:
            break
    # group 0: q, k, v started; group 1: q started; then per group: wait, attend, start the output, ...
    schedule = "".join(layer)
    assert schedule == "SSS" "S" "WWW" "A" "S" "S" "W" "A" "S" "W" "S" "W" "A" "S" "W" "W" "A" "S" "W" "W", schedule
    assert len([n for n in gm.graph.nodes if is_call(n, SDPA)]) == 2 * 4


# --- overlap schedules: the order Inductor emits ------------------------------------------------------------
@pytest.fixture(scope="module")
def one_process_group():
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD.group_name
    if created:
        dist.destroy_process_group()


_EMITTED = re.compile(r"autosp_ops\.(all_to_all_start|all_to_all_wait|all_to_all)\.default|"
                      r"extern_kernels\.(mm)\(|aten\.(_scaled_dot_product_flash_attention_for_cpu(?:_backward)?)\.")


def emitted_order(code: str) -> list[str]:
    """The collectives, matmuls and attention calls of Inductor's wrapper code, in call order."""
    out = []
    for line in code.splitlines():
        line = line.strip()
        if line.startswith("#") or "def " in line or "assert_" in line:
            continue
        match = _EMITTED.search(line)
        if match:
            name = next(g for g in match.groups() if g)
            out.append({"all_to_all_start": "start", "all_to_all_wait": "wait", "all_to_all": "a2a",
                        "_scaled_dot_product_flash_attention_for_cpu": "attn",
                        "_scaled_dot_product_flash_attention_for_cpu_backward": "attn_bwd"}.get(name, name))
    return out


@pytest.mark.slow
def test_inductor_keeps_the_kv_async_windows_forward_and_backward(one_process_group):
    from torch._inductor.utils import run_fw_bw_and_get_code

    from autosp.compiler.backend import make_backend

    torch._dynamo.reset()
    model = _small_ref(n_heads=4, n_kv=2)
    model.model.layers = model.model.layers[:1]
    ids = torch.randint(0, 64, (1, 8))
    ctx = context(8, sp=1, group=one_process_group, overlap="kv_async")
    fn = torch.compile(model.forward, backend=make_backend(ctx, "inductor"), dynamic=False, fullgraph=True)
    _, (forward, backward) = run_fw_bw_and_get_code(lambda: fn(ids, ids.clone())[0])
    fwd, bwd = emitted_order(forward), emitted_order(backward)
    print("\nkv_async forward, as Inductor emits it: ", " ".join(fwd))
    print("kv_async backward, as Inductor emits it:", " ".join(bwd))
    # forward: K and V projections, start V, start K, Q projection, Q all-to-all, wait, wait, attention
    first = fwd.index("start")
    assert fwd[first:first + 7] == ["start", "start", "mm", "a2a", "wait", "wait", "attn"], fwd
    # backward: attention backward, start dK/dV, the Q path's backward (all-to-all, projection dx and dW), waits
    first = bwd.index("attn_bwd")
    assert bwd[first:first + 7] == ["attn_bwd", "start", "start", "a2a", "mm", "mm", "wait"], bwd
    assert bwd[first + 7] == "wait"
