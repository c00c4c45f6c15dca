"""Sequence-chunked decoder layers (plan knobs ``sequence_chunks``, ``offload_chunks``).

Multi-process part (spawned gloo jobs of world 2 and 4, aot_eager): every case trains 3 steps through
``autosp.compile(plan=Candidate(...))`` and rank 0 compares the loss of every step, every gradient of the first
step and every weight after the last with one process on the full sequence (fp32, relative 1e-5; bf16 against
fp32 with the bf16 tolerances of tests/compiler/test_compiler_exact.py). Cases: SP=1 (DP 2), SP=2 and SP=4; 2,
3 and 8 chunks, uneven ones included (15 tokens per rank in 8 chunks: 2 x 7 + 1); offload on and off; ZeRO-3;
tiny HF Llama and Qwen2; U 2 x R 2 ring; every checkpointing policy, MLP and loss tiling, kv_async, activation
offload on top; Inductor.

Unit part (no processes): the layout, the sharding, and the pass + op on a captured one-layer graph against
the unchunked graph (fp32), forward and backward, offload on and off.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from test_compiler_exact import BF16_TOL, TOL, Z3, hf_model, make_batches, reference_llama, sgd  # noqa: E402

from autosp.compiler.attention.layout import (chunk_ring_spans, chunk_sizes, chunked_rank_spans, rank_spans,
                                              span_index)
from autosp.compiler.testing import assert_within
from autosp.contract.specs import Candidate
from autosp.errors import UsageError

hf_llama = functools.partial(hf_model, "llama")
hf_qwen2 = functools.partial(hf_model, "qwen2")

# name -> (world, model factory, batch kwargs, candidate fields, compile kwargs)
CASES = {
    # SP=1 (two data-parallel ranks), 8 chunks of 4 tokens
    "sp1_dp2_chunks8": (2, reference_llama, dict(seq=32), dict(sp=1, dp=2, sequence_chunks=8), {}),
    "sp2_chunks3": (2, reference_llama, dict(seq=30), dict(sequence_chunks=3), {}),
    # 15 tokens per rank in chunks of 2 x 7 + 1, host copies
    "sp2_chunks8_uneven_offload": (2, reference_llama, dict(seq=30), dict(sequence_chunks=8, offload_chunks=True), {}),
    "hf_llama_chunks2_offload": (2, hf_llama, dict(seq=30), dict(sequence_chunks=2, offload_chunks=True), {}),
    # ZeRO-3 (each layer its own graph); 16 tokens per rank = head_dim: the size-argument tie-break
    "hf_qwen2_zero3_chunks3_offload": (2, hf_qwen2, dict(seq=32),
                                       dict(sequence_chunks=3, offload_chunks=True, zero_stage=3), dict(ds_config=Z3)),
    "zero3_chunks3": (2, reference_llama, dict(seq=30), dict(sequence_chunks=3, zero_stage=3), dict(ds_config=Z3)),
    # with the other knobs: every checkpointing policy, tiled MLP inside the chunks, tiled loss, kv_async
    "selective_mlp2_loss3_kv_async_chunks3": (2, reference_llama, dict(seq=30),
                                              dict(sequence_chunks=3, checkpointing="selective", mlp_chunks=2,
                                                   loss_chunks=3, overlap="kv_async"), {}),
    "sequence_ckpt_chunks2_offload": (2, hf_llama, dict(seq=30),
                                      dict(sequence_chunks=2, offload_chunks=True, checkpointing="sequence"), {}),
    "full_ckpt_offload_activations_chunks3": (2, reference_llama, dict(seq=30),
                                              dict(sequence_chunks=3, checkpointing="full",
                                                   offload_activations=True), {}),
    "inductor_chunks3_offload": (2, reference_llama, dict(seq=30), dict(sequence_chunks=3, offload_chunks=True),
                                 dict(backend="inductor")),
    "sp4_chunks3": (4, reference_llama, dict(seq=30), dict(sp=4, sequence_chunks=3), {}),
    "sp4_chunks8_offload": (4, hf_llama, dict(seq=64), dict(sp=4, sequence_chunks=8, offload_chunks=True), {}),
    # 2-D SP: U 2 x R 2, S = 30 padded to 32 (each chunk laid out as a whole sequence over the ring)
    "u2r2_chunks2_offload": (4, reference_llama, dict(seq=30), dict(sp=4, ring=2, sequence_chunks=2,
                                                                    offload_chunks=True), {}),
}
BF16 = {
    "bf16_zero2_chunks3_offload": (2, reference_llama, dict(seq=30),
                                   dict(sequence_chunks=3, offload_chunks=True, zero_stage=2), dict(dtype="bf16")),
}


def run_cases(rank, world, names):
    from autosp.compiler import ops, testing

    def run_one(name):
        _, factory, batch_kw, fields, compile_kw = CASES.get(name) or BF16[name]
        model, batches = factory(), make_batches(**batch_kw)
        fields = {"sp": 2, "micro_batch": 2, **fields}
        fields.setdefault("dp", world // fields["sp"])
        if fields["dp"] > 1:
            fields["micro_batch"] = 1
        before = dict(ops.CALLS)
        got = testing.sp_run(model, batches, sgd, plan=Candidate(**fields), **{"backend": "aot_eager", **compile_kw})
        calls = {k: ops.CALLS[k] - before.get(k, 0) for k in ("chunked_layer", "chunked_layer_backward")}
        if rank == 0:
            ref = testing.reference_run(model, batches, sgd)
            return {"errors": testing.compare(got, ref), "stats": got["stats"], "calls": calls}

    return testing.run_cases(rank, names, run_one)


def _job(world):
    from autosp.compiler import testing

    return testing.spawn(run_cases, world, [n for n, spec in {**CASES, **BF16}.items() if spec[0] == world])


@pytest.fixture(scope="module")
def world2():
    return _job(2)


@pytest.fixture(scope="module")
def world4():
    return _job(4)


def _result(request, name):
    world = (CASES.get(name) or BF16[name])[0]
    return request.getfixturevalue(f"world{world}")[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_exact_against_single_process(request, name):
    result = assert_within(_result(request, name), TOL)
    assert result["stats"].layers_chunked >= 1, result["stats"]
    # every layer of every step ran chunked, forward and backward (ZeRO-3 reuses one layer graph for both)
    assert result["calls"]["chunked_layer"] >= 2 * 3 and result["calls"]["chunked_layer_backward"] >= 2 * 3, result


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BF16))
def test_bf16_close_to_fp32_single_process(request, name):
    assert_within(_result(request, name), BF16_TOL)


# --- layout and sharding ------------------------------------------------------------------------------------
@pytest.mark.parametrize("seq,ulysses,ring,chunks", [(30, 2, 1, 8), (30, 2, 1, 3), (64, 4, 1, 3), (32, 2, 2, 2),
                                                     (96, 1, 2, 3)])
def test_chunked_layout_covers_the_sequence_and_chunks_attend_earlier_chunks(seq, ulysses, ring, chunks):
    sp = ulysses * ring
    spans = [chunked_rank_spans(seq, ulysses, ring, chunks, r) for r in range(sp)]
    tokens = sorted(int(t) for s in spans for t in span_index(s))
    assert tokens == list(range(seq))
    for s in spans:  # rows in increasing global order: the rank's own causal mask stays lower-triangular
        rows = span_index(s).tolist()
        assert rows == sorted(rows) and len(rows) == seq // sp
    # after chunk i's all-to-all, the ring positions together hold exactly global chunk i, after chunks < i
    end = 0
    for i in range(chunks):
        held = sorted(t for pos in chunk_ring_spans(seq, ulysses, ring, chunks, i) for a, b in pos
                      for t in range(a, b))
        assert held == list(range(end, end + len(held)))
        end += len(held)
        # the U ranks of ring position 0 hold, in their local chunk i, exactly that position's share of chunk i
        local = [t for u in range(ulysses) for t in _local_chunk(spans[u], seq // sp, chunks, i)]
        assert local == [t for a, b in chunk_ring_spans(seq, ulysses, ring, chunks, i)[0] for t in range(a, b)]
    assert end == seq


def _local_chunk(spans, local_len, chunks, i):
    rows = span_index(spans).tolist()
    start = sum(chunk_sizes(local_len, chunks)[:i])
    return rows[start:start + chunk_sizes(local_len, chunks)[i]]


def test_one_chunk_is_the_plain_layout():
    assert chunked_rank_spans(32, 2, 2, 1, 3) == rank_spans(32, 2, 2, 3)
    assert chunk_sizes(15, 8) == [2] * 7 + [1]


def test_sharding_pads_to_a_token_per_chunk_and_permutes_labels_with_the_tokens():
    from autosp.compiler.inputs import shard_batch

    ids = torch.arange(10).unsqueeze(0)
    batch = shard_batch(ids, ids.clone(), sp=2, sp_rank=1, dp=1, dp_rank=0, chunks=8)
    assert batch.global_len == 16 and batch.local_len == 8  # 10 tokens < 2 ranks x 8 chunks: padded
    expected = span_index(chunked_rank_spans(16, 2, 1, 8, 1))
    padded_ids = torch.cat([ids[0], torch.zeros(6, dtype=ids.dtype)])
    assert torch.equal(batch.input_ids[0], padded_ids[expected])
    shifted = torch.cat([ids[0, 1:], torch.full((7,), -100)])
    assert torch.equal(batch.labels[0], shifted[expected])


# --- the pass and the op on one captured layer (SP=1, fp32: the kernels accumulate in fp32) --------------------------------------------------
class _Layer(torch.nn.Module):
    """A pre-norm decoder layer with GQA and a gated MLP (sizes chosen so no model dim equals the length)."""

    def __init__(self, h=12, heads=4, kv=2, d=3, f=20):
        super().__init__()
        self.heads, self.kv, self.d = heads, kv, d
        self.q = torch.nn.Linear(h, heads * d, bias=False)
        self.k = torch.nn.Linear(h, kv * d, bias=True)
        self.v = torch.nn.Linear(h, kv * d, bias=False)
        self.o = torch.nn.Linear(heads * d, h, bias=False)
        self.up = torch.nn.Linear(h, f, bias=False)
        self.gate = torch.nn.Linear(h, f, bias=False)
        self.down = torch.nn.Linear(f, h, bias=False)
        self.norm = torch.nn.RMSNorm(h)

    def forward(self, x, cos):
        b, s, _ = x.shape
        y = self.norm(x)
        q = (self.q(y) * cos.repeat(1, 1, self.heads)).view(b, s, self.heads, self.d).transpose(1, 2)
        k = self.k(y).view(b, s, self.kv, self.d).transpose(1, 2)
        v = self.v(y).view(b, s, self.kv, self.d).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.down(F.silu(self.gate(x)) * self.up(x))


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Layer(), _Layer()])

    def forward(self, x, cos):
        for layer in self.layers:
            x = layer(x, cos)
        return x


@pytest.mark.parametrize("chunks,offload", [(3, False), (4, True), (7, False)])
def test_chunked_layers_equal_the_unchunked_model(chunks, offload):
    from autosp.compiler.context import SPContext
    from autosp.compiler.passes.chunking import chunking_pass
    from autosp.compiler.passes.common import SDPA, is_call
    from autosp.compiler.testing import capture_graph

    torch.manual_seed(0)
    model = _Model()
    x = torch.randn(2, 10, 12, dtype=torch.float32)
    cos = torch.randn(2, 10, 3, dtype=torch.float32)
    gm, inputs = capture_graph(model, x, cos)
    ctx = SPContext(candidate=Candidate(sp=1, sequence_chunks=chunks, offload_chunks=offload), sp_rank=0, sp_group="",
                    world_group="", grad_world_size=1, local_len=10, global_len=10)
    chunking_pass(gm, inputs, ctx)
    gm.recompile()
    assert ctx.stats.layers_chunked == 2
    assert not any(is_call(n, SDPA) for n in gm.graph.nodes)  # attention only inside the chunked layers
    grad_out = torch.randn(2, 10, 12, dtype=torch.float32)

    def run(fn):
        xs = x.clone().requires_grad_()
        c = cos.clone().requires_grad_()
        out = fn(xs, c)
        out = out[0] if isinstance(out, (tuple, list)) else out
        params = list(model.parameters())
        return (out.detach(), *torch.autograd.grad(out, [xs, c, *params], grad_out))

    want = run(model)
    got = run(lambda a, b: gm(*[a if t is x else b if t is cos else t for t in _inputs_like(inputs, x, cos)]))
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-6), (g - w).abs().max()


def _inputs_like(inputs, x, cos):
    """The captured graph's inputs with the activations in place (parameters are the model's own)."""
    out = []
    for t in inputs:
        if isinstance(t, torch.nn.Parameter):
            out.append(t)
        elif t.shape[-1] == x.shape[-1]:
            out.append(x)
        else:
            out.append(cos)
    return out


def test_head_pipeline_with_chunks_is_refused():
    from autosp.compiler.api import resolve_candidate

    with pytest.raises(UsageError, match="head_pipeline"):
        resolve_candidate(Candidate(sp=2, sequence_chunks=2, overlap="head_pipeline"))


# --- autosp-train and the measured-trials runner (--measure) on a chunked plan ------------------------------
@pytest.mark.slow
def test_autosp_train_and_measure_run_a_chunked_plan(tmp_path):
    import json

    from test_compiler_train_cli import write_plan

    from autosp.planner.measure import MeasureOptions, run_one
    from autosp.contract.plan import load_plan

    candidate = Candidate(sp=2, zero_stage=1, sequence_chunks=3, offload_chunks=True)
    plan = load_plan(write_plan(tmp_path / "chunks.json", candidate, seq_len=47))
    row = run_one(plan, MeasureOptions(k=1, steps=2, warmup=1, backend="aot_eager"), str(tmp_path), 0)
    assert row["status"] == "ok", row
    assert row["steps_measured"] == 2 and row["tokens_per_second"] > 0
    out = (tmp_path / "candidate0.out").read_text()
    assert "seq/3" in out, out  # autosp-train ran the plan's chunks
    steps = [json.loads(line) for line in (tmp_path / "candidate0.steps.jsonl").read_text().splitlines()]
    assert abs(steps[0]["loss"] - 4.57) < 0.1  # ~ln(97) for a fresh model
