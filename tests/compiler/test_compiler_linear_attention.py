"""Hybrid linear attention (Gated DeltaNet: Qwen3-Next, Qwen3.5) under SP == one process (fp32, 1e-5).

Tiny Hugging Face Qwen3-Next (a Gated DeltaNet layer then a gated full-attention layer; a MoE MLP with a shared
expert then a dense one), Qwen3.5 and Qwen3.5-MoE text models (one q/k head shared by four value heads: each
replicated over the two Ulysses ranks) built from configs. One spawned world-2 job trains 3 steps per case; rank 0 compares
the loss of every step, every gradient of the first step and every weight after the last against one process
on the full batches (packed batches: every document run alone, :func:`autosp.compiler.testing.packed_loss`).
Cases: SP 2 with S % P != 0 (the runtime pads), ZeRO-3, packed documents (``position_ids`` restarting at 0,
documents crossing the shard boundary and documents of one token; the conv and the recurrence restart at each),
the core run in pieces of 16 tokens (state and conv window carried across), selective checkpointing, and the
refusals (a ring, sequence-chunked layers, an SP degree that does not divide the value heads). The units check the
head split, the architecture check, and that the layer over packed rows equals transformers' own layer run on
every document alone (whole and in pieces).
"""

from __future__ import annotations

import pytest
import torch

from test_compiler_exact import TOL, VOCAB, Z3, make_batches, sgd  # noqa: E402
from test_compiler_packed import packed_batches  # noqa: E402

from autosp.compiler.testing import assert_within
from autosp.contract.specs import Candidate

LINEAR = dict(linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
              layer_types=["linear_attention", "full_attention"])


def qwen3_next(n_k=2, n_v=4):
    import transformers

    config = transformers.Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=n_k, linear_num_value_heads=n_v, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32, mlp_only_layers=[1],
        max_position_embeddings=256, attn_implementation="sdpa", use_cache=False, **LINEAR)
    torch.manual_seed(0)
    return real_routing(slow_decay(transformers.Qwen3NextForCausalLM(config)))


def qwen3_5(n_k=1, n_v=4, moe=False):
    import transformers

    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, linear_num_key_heads=n_k, linear_num_value_heads=n_v, max_position_embeddings=256,
                  attn_implementation="sdpa", use_cache=False, **LINEAR)
    torch.manual_seed(0)
    if not moe:
        return slow_decay(transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(intermediate_size=64,
                                                                                          **common)))
    config = transformers.Qwen3_5MoeTextConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                               shared_expert_intermediate_size=32, **common)
    return real_routing(slow_decay(transformers.Qwen3_5MoeForCausalLM(config)))


def real_routing(model):
    with torch.no_grad():  # the router starts at zero (ties everywhere): give it a real routing
        for name, p in model.named_parameters():
            if name.endswith("gate.weight"):
                p.normal_(0, 0.5)
    return model


def slow_decay(model):
    """Decay rates that keep a token in the state for tens of tokens, across the shard boundary and the
    fallback's 64-token chunks. transformers draws A from [0.01, 16]: most heads then forget within a token or
    two (a weak test of the recurrence), and their A_log / dt_bias gradients cancel down to fp32 rounding (the
    fp32 single-process gradient itself 1e-5 to 5e-5 from the fp64 one)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.linspace(0.02, 0.3, p.numel()).log())
    return model


FACTORIES = {"qwen3_next": qwen3_next, "qwen3_5": qwen3_5, "qwen3_5_moe": lambda: qwen3_5(moe=True)}

# name -> (model, batches, sp_run's plan= and options)
EXACT = {
    "qwen3_next_sp2_pad": ("qwen3_next", dict(seq=31), dict(plan=Candidate(sp=2, micro_batch=2))),
    "qwen3_5_sp2_pad_selective": ("qwen3_5", dict(seq=31),
                                  dict(plan=Candidate(sp=2, micro_batch=2, checkpointing="selective"))),
    # the core in pieces of 16 tokens (the state and the conv's window passed from piece to piece)
    "qwen3_next_sp2_zero3_packed_pad_pieces": ("qwen3_next", "packed_pad",
                                               dict(plan=Candidate(sp=2, micro_batch=2, zero_stage=3), ds_config=Z3,
                                                    piece=16)),
    "qwen3_5_moe_sp2_zero3_packed": ("qwen3_5_moe", "packed",
                                     dict(plan=Candidate(sp=2, micro_batch=2, zero_stage=3), ds_config=Z3)),
}

ERRORS = {
    "ring": ("qwen3_next", dict(plan=Candidate(sp=2, micro_batch=2, ring=2)), "ring=2"),
    "sequence_chunks": ("qwen3_next", dict(plan=Candidate(sp=2, micro_batch=2, sequence_chunks=2)),
                        "sequence_chunks=2"),
    "heads": (lambda: qwen3_5(n_k=1, n_v=1), dict(plan=Candidate(sp=2, micro_batch=2)),
              "do not divide the 1 linear value heads"),
}


def run_world2(rank, world):
    from autosp.compiler import linear_attention, ops, testing
    from autosp.compiler.api import compile_model
    from autosp.compiler.options import CompileOptions
    from autosp.errors import UsageError

    default_piece = linear_attention.PIECE_TOKENS

    def run_exact(name):
        kind, batch_kw, compile_kw = EXACT[name]
        model = FACTORIES[kind]()
        loss_fn = None
        if batch_kw == "packed":
            batches, loss_fn = packed_batches(), testing.packed_loss
        elif batch_kw == "packed_pad":
            batches, loss_fn = packed_batches(trim=1), testing.packed_loss
        else:
            batches = make_batches(**batch_kw)
        before = dict(ops.CALLS)
        compile_kw = dict(compile_kw)
        linear_attention.PIECE_TOKENS = compile_kw.pop("piece", default_piece)
        try:
            got = testing.sp_run(model, batches, sgd, **{"backend": "aot_eager", **compile_kw})
        finally:
            linear_attention.PIECE_TOKENS = default_piece
        calls = {k: ops.CALLS[k] - before.get(k, 0) for k in ("gated_delta_core", "gated_delta_core_backward")}
        if rank == 0:
            ref = testing.reference_run(model, batches, sgd, loss_fn=loss_fn)
            return {"errors": testing.compare(got, ref), "calls": calls, "steps": len(batches)}
        return None

    def run_error(name):
        kind, compile_kw, _ = ERRORS[name]
        model = FACTORIES[kind]() if isinstance(kind, str) else kind()
        try:
            compile_model(model, compile_kw["plan"], options=CompileOptions(backend="aot_eager"))
        except UsageError as err:
            return {"error": str(err)}
        return {"error": None}

    out = testing.run_cases(rank, list(EXACT), run_exact)
    out.update(testing.run_cases(rank, list(ERRORS), run_error))
    return out


@pytest.fixture(scope="module")
def world2():
    from autosp.compiler import testing

    return testing.spawn(run_world2, 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXACT))
def test_exact(world2, name):
    result = assert_within(world2[name], TOL)
    # the one linear layer ran through autosp's op, once per forward and once per backward: its outputs are kept
    # like attention's (autosp/contract/op_classes.py), so selective checkpointing does not re-run it either
    assert result["calls"] == {"gated_delta_core": result["steps"], "gated_delta_core_backward": result["steps"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ERRORS))
def test_refusals(world2, name):
    error = world2[name]["error"]
    assert error is not None and ERRORS[name][2] in error and "\n" not in error


# --- units (one process, no compile) -------------------------------------------------------------------------
@pytest.mark.parametrize("n_k, n_v, ranks, reason", [
    (2, 4, 2, None), (2, 4, 4, None), (1, 4, 2, None), (16, 32, 8, None), (16, 32, 32, None),
    (2, 4, 8, "do not divide the 4 linear value heads"), (4, 12, 3, "one must divide the other"),
])
def test_split_reason(n_k, n_v, ranks, reason):
    from autosp.compiler.linear_attention import split_reason

    got = split_reason(n_k, n_v, ranks)
    assert got is None if reason is None else reason in got


@pytest.mark.parametrize("n_k, n_v, ranks", [(2, 4, 2), (2, 4, 4), (1, 4, 2), (16, 32, 8), (2, 8, 4)])
def test_head_slices_cover_every_value_head_with_its_key_head(n_k, n_v, ranks):
    """Every v head on exactly one rank, beside the q/k head transformers pairs it with (v head j reads q/k
    head j // (n_v / n_k)); the q/k head of a rank is the one its slot of the all-to-all carries."""
    from autosp.compiler.linear_attention import head_slice

    owners = {}
    for rank in range(ranks):
        part = head_slice(n_k, n_v, ranks, rank, "g")
        sent = [h for h in range(n_k) for _ in range(part.replicas)]  # q/k heads after replication, in order
        per = len(sent) // ranks
        assert sent[rank * per:(rank + 1) * per] == list(range(part.k0, part.k1))
        for v in range(part.v0, part.v1):
            owners[v] = rank
            assert part.k0 <= v // (n_v // n_k) < part.k1
    assert sorted(owners) == list(range(n_v))


@pytest.mark.parametrize("kind, piece", [("qwen3_next", 4096), ("qwen3_5", 4096), ("qwen3_5_moe", 4096),
                                         ("qwen3_next", 16), ("qwen3_5", 3)])
def test_layer_on_packed_documents_equals_each_document_alone(kind, piece, monkeypatch):
    """One rank (no all-to-all): autosp's layer over packed rows == transformers' own layer run on every
    document alone (output and every gradient), with documents of one token and longer than a 64-token chunk;
    also when the core runs the documents in pieces of 16 or 3 tokens (the state and the conv's window carried
    across, a piece shorter than the conv's window included)."""
    import copy
    from types import SimpleNamespace

    from autosp.compiler import linear_attention
    from autosp.compiler.attention.documents import publish, spans_from_seq_lens
    from autosp.compiler.linear_attention import install
    from autosp.compiler.testing import rel_err
    from autosp.contract.specs import Candidate

    model = FACTORIES[kind]()
    reference = model.model.layers[0].linear_attn
    layer_model = copy.deepcopy(model)
    rows = [[70, 1, 9], [5, 75]]
    spans = [spans_from_seq_lens(r) for r in rows]
    x = torch.randn(2, 80, 64, generator=torch.Generator().manual_seed(5))
    x_ref, x_sp = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref = torch.cat([torch.cat([reference(x_ref[b:b + 1, a:e]) for a, e in spans[b]], dim=1) for b in range(2)])
    monkeypatch.setattr(linear_attention, "PIECE_TOKENS", piece)
    install(layer_model, SimpleNamespace(candidate=Candidate(sp=1), rule="unit-rule", ulysses_group=None))
    publish("unit-rule", spans)
    got = layer_model.model.layers[0].linear_attn(x_sp)
    weights = torch.randn_like(ref)
    (ref * weights).sum().backward()
    (got * weights).sum().backward()
    assert rel_err(got, ref) < TOL and rel_err(x_sp.grad, x_ref.grad) < TOL
    for (name, p), q in zip(reference.named_parameters(), layer_model.model.layers[0].linear_attn.parameters()):
        assert rel_err(q.grad, p.grad) < TOL, name


def test_hybrid_models_compile_and_others_stay_refused():
    from autosp.compiler.linear_attention import check_architecture
    from autosp.errors import UsageError

    for factory in FACTORIES.values():
        check_architecture(factory())  # admitted: their linear layers run through autosp's op
    model = qwen3_5()
    model.config.vision_config = {}  # a vision-language wrapper stays refused (by the shared list)
    with pytest.raises(UsageError, match="autosp does not support it"):
        check_architecture(model)
