"""The compiler's pieces in one process: input sharding, plan handling, and each FX pass on real Dynamo
graphs (captured with a recording backend; the passes only rewrite graphs, so no process group is needed
here; tests/compiler/test_compiler_exact.py runs the rewritten graphs on gloo)."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F

from autosp.compiler import ops  # noqa: F401  (registers torch.ops.autosp_ops.*)
from autosp.compiler.api import hand_made_candidate, resolve_candidate
from autosp.compiler.context import SPContext
from autosp.compiler.inputs import shard_batch
from autosp.compiler.passes import attention_pass, check_pass, loss_pass, mask_pass, position_pass
from autosp.compiler.passes.common import SDPA, is_call
from autosp.compiler.passes.mask import is_causal_mask
from autosp.contract.specs import Candidate, ModelSpec
from autosp.errors import UsageError

A2A = torch.ops.autosp_ops.all_to_all.default
ALL_REDUCE = torch.ops.autosp_ops.all_reduce_sum.default


# --- input sharding --------------------------------------------------------------------------------
def _shards(ids, labels, sp, **kw):
    return [shard_batch(ids, labels, sp=sp, sp_rank=r, dp=1, dp_rank=0, **kw) for r in range(sp)]


def test_labels_are_shifted_over_the_full_sequence_then_sharded():
    ids = torch.arange(12).reshape(1, 12)
    shards = _shards(ids, ids, 3)
    labels = torch.cat([s.labels for s in shards], dim=1)
    assert labels.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, -100]]  # no target lost at shard borders
    assert torch.cat([s.input_ids for s in shards], dim=1).tolist() == ids.tolist()
    assert [s.local_len for s in shards] == [4, 4, 4]
    # fresh tensors even when labels is input_ids (Dynamo would merge one tensor passed twice)
    assert shards[0].labels.data_ptr() != shards[0].input_ids.data_ptr()


def test_padding_to_a_multiple_of_p_never_truncates():
    ids = torch.arange(10).reshape(1, 10) + 5
    shards = _shards(ids, ids, 4, pad_token_id=0, position_ids=torch.arange(10))
    full_ids = torch.cat([s.input_ids for s in shards], dim=1)
    full_labels = torch.cat([s.labels for s in shards], dim=1)
    assert full_ids.shape[1] == 12 and full_ids[0, :10].tolist() == ids[0].tolist()
    assert full_ids[0, 10:].tolist() == [0, 0]
    assert full_labels[0, 9:].tolist() == [-100, -100, -100]
    assert torch.cat([s.position_ids for s in shards], dim=1).tolist() == [list(range(12))]
    assert shards[0].n_valid == 9


def test_data_parallel_rank_takes_its_rows():
    ids = torch.arange(4 * 8).reshape(4, 8)
    batch = shard_batch(ids, ids, sp=2, sp_rank=1, dp=2, dp_rank=1, micro_batch=2)
    assert batch.input_ids.tolist() == ids[2:, 4:].tolist()
    with pytest.raises(UsageError, match="dp x micro_batch"):
        shard_batch(ids, ids, sp=2, sp_rank=0, dp=2, dp_rank=0, micro_batch=1)


def test_right_padding_mask_is_checked_and_dropped():
    ids = torch.arange(8).reshape(1, 8)
    labels = ids.clone()
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])
    with pytest.raises(UsageError, match="labels at padded positions"):
        shard_batch(ids, labels, sp=2, sp_rank=0, dp=1, dp_rank=0, attention_mask=mask)
    labels[mask == 0] = -100
    batch = shard_batch(ids, labels, sp=2, sp_rank=0, dp=1, dp_rank=0, attention_mask=mask)
    assert batch.n_valid == 4  # targets 1..4; the last real token predicts a pad (ignored)
    with pytest.raises(UsageError, match="left-padded"):
        shard_batch(ids, labels, sp=2, sp_rank=0, dp=1, dp_rank=0, attention_mask=mask.flip(1))
    with pytest.raises(UsageError, match="holes"):
        shard_batch(ids, labels, sp=2, sp_rank=0, dp=1, dp_rank=0,
                    attention_mask=torch.tensor([[1, 1, 0, 1, 1, 0, 0, 0]]))


def test_packed_position_ids_give_documents():
    ids = torch.arange(8).reshape(1, 8)
    batch = shard_batch(ids, ids, sp=2, sp_rank=0, dp=1, dp_rank=0, position_ids=torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]]))
    assert batch.documents == [[(0, 3), (3, 8)]]  # packed documents are trained (tests/compiler/test_compiler_packed.py)


# --- plans -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("knob", [dict(mlp_chunks=2), dict(loss_chunks=4), dict(overlap="kv_async"),
                                  dict(overlap="head_pipeline"), dict(checkpointing="sequence"),
                                  dict(checkpointing="full", offload_activations=True), dict(offload_optimizer=True,
                                                                                              zero_stage=1),
                                  dict(zero_stage=3, offload_optimizer=True, offload_param=True)])
def test_every_plan_knob_is_accepted_as_planned(knob):
    candidate, _ = resolve_candidate(Candidate(sp=2, **knob))
    assert all(getattr(candidate, k) == v for k, v in knob.items())


def test_hand_made_plan_and_contradictions():
    assert resolve_candidate(None, 2, 4) == (Candidate(sp=2, dp=2), None)  # sp_size=2 on 4 processes
    assert hand_made_candidate(2, 4, zero_stage=3, ring=None) == Candidate(sp=2, dp=2, zero_stage=3)  # a launcher's
    with pytest.raises(UsageError, match="does not divide"):
        resolve_candidate(None, 3, 4)
    with pytest.raises(UsageError, match="contradicts"):
        resolve_candidate(Candidate(sp=2, dp=2), sp_size=4)
    with pytest.raises(UsageError, match="plan= .* or sp_size="):
        resolve_candidate(None, None, 4)


# --- masks -----------------------------------------------------------------------------------------
def test_causal_mask_recognition():
    tril = torch.ones(6, 6, dtype=torch.bool).tril()
    assert is_causal_mask(tril.expand(2, 1, 6, 6), 6)
    additive = torch.zeros(6, 6).masked_fill(~tril, torch.finfo(torch.float32).min)
    assert is_causal_mask(additive[None, None], 6)
    window = tril & torch.ones(6, 6, dtype=torch.bool).triu(-2)
    assert not is_causal_mask(window, 6)
    assert not is_causal_mask(tril, 5)
    assert not is_causal_mask(torch.zeros(6, 6).masked_fill(~tril, -1.0), 6)  # not a pure allow/deny mask


# --- passes on captured Dynamo graphs --------------------------------------------------------------
from autosp.compiler.testing import capture_graph as capture  # noqa: E402


def context(local_len, sp=2, rank=1):
    return SPContext(candidate=Candidate(sp=sp), sp_rank=rank, sp_group="sp", world_group="world",
                     grad_world_size=sp, local_len=local_len, global_len=local_len * sp)


def calls(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == target]


def hf_llama(**extra):
    import transformers

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa",
                                      use_cache=False, **extra)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


@pytest.mark.slow
def test_passes_on_hf_llama_graph():
    model, s = hf_llama(), 8
    ids = torch.randint(0, 64, (2, s))
    gm, inputs = capture(model, input_ids=ids, labels=ids.clone())
    ctx = context(s)
    for sp_pass in (mask_pass, position_pass, attention_pass, loss_pass, check_pass):
        sp_pass(gm, inputs, ctx)
    gm.graph.lint()
    sdpa = [n for n in gm.graph.nodes if is_call(n, SDPA)]
    assert len(sdpa) == 2 and all(n.kwargs.get("is_causal") and n.kwargs.get("attn_mask") is None for n in sdpa)
    assert ctx.stats.masks_removed == 2 and ctx.stats.attention == 2
    # 2 KV heads divide over P=2: k and v travel with their 2 heads (repeat_kv peeled), GQA in SDPA
    a2a = calls(gm, A2A)
    assert len(a2a) == 8
    assert all(n.kwargs.get("enable_gqa") is True for n in sdpa)  # 2 query heads share 1 kv head per rank
    from autosp.compiler.passes.common import shape

    for node in sdpa:
        q, k, v = node.args[:3]
        assert shape(q.args[0])[1] == 4 and shape(k.args[0])[1] == 2 and shape(v.args[0])[1] == 2
    # the position arange got rank 1's offset s, the mask construction is gone
    offsets = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is operator.add and n.args[1] == s]
    assert len(offsets) == 1 and offsets[0].args[0].target is torch.arange
    assert not any(n.op == "call_method" and n.target == "cumsum" for n in gm.graph.nodes)
    # the loss: its own label shift removed, summed, made global
    assert ctx.stats.label_shifts_removed == 1 and len(calls(gm, ALL_REDUCE)) == 1
    assert not any(n.op == "call_function" and n.target in (F.pad, torch._C._nn.pad) for n in gm.graph.nodes)


@pytest.mark.slow
def test_position_pass_offsets_only_positions_even_when_batch_equals_seq():
    table = torch.randn(64, 8)

    def fn(x):  # batch 6 == seq 6: the batch arange is an index, the position arange feeds cos/sin and a lookup
        b, s = x.shape[0], x.shape[1]
        rows = torch.arange(b)
        pos = torch.arange(s)
        picked = x[rows, 0]
        return picked.sum() + torch.cos(pos.float()).sum() + F.embedding(pos, table).sum()

    gm, inputs = capture(fn, torch.randn(6, 6))
    ctx = context(6, rank=2, sp=4)
    position_pass(gm, inputs, ctx)
    added = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is operator.add and n.args[1] == 12]
    assert len(added) == 1 and ctx.stats.positions_offset == 1
    shifted_arange = added[0].args[0]
    assert not any(u.target is operator.getitem for u in added[0].users)  # the index arange is untouched
    assert shifted_arange.target is torch.arange


def _reference_graph(n_heads=4, n_kv=2, seq=8):
    from autosp.compiler.models import Llama

    spec = ModelSpec(name="t", n_layers=1, hidden=32, n_heads=n_heads, n_kv_heads=n_kv, head_dim=8, ffn_hidden=64,
                     vocab=64)
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (1, seq))
    return capture(Llama(spec), ids, ids.clone())


@pytest.mark.slow
@pytest.mark.parametrize("n_heads,n_kv,p,message", [
    (6, 3, 4, "6 query heads do not divide over 4"),
    (12, 3, 4, "3 key/value heads are incompatible with 4"),
])
def test_attention_pass_head_errors_name_the_source_line(n_heads, n_kv, p, message):
    gm, inputs = _reference_graph(n_heads, n_kv)
    with pytest.raises(UsageError, match=message) as err:
        attention_pass(gm, inputs, context(8, sp=p))
    assert "llama.py" in str(err.value) and "scaled_dot_product_attention" in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("n_kv,p,replicated", [(1, 4, True), (4, 2, False), (2, 4, True)])
def test_kv_heads_sharded_or_replicated(n_kv, p, replicated):
    gm, inputs = _reference_graph(8, n_kv)
    attention_pass(gm, inputs, context(8, sp=p))
    repeats = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.repeat_interleave]
    assert bool(repeats) == replicated
    if replicated:
        assert all(n.args[1] == p // n_kv for n in repeats)


@pytest.mark.slow
def test_sliding_window_mask_is_an_error_naming_the_mask():
    s = 8
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa", use_cache=False,
                           sliding_window=4)
    model = MistralForCausalLM(config)
    ids = torch.randint(0, 64, (1, s))
    gm, inputs = capture(model, input_ids=ids, labels=ids.clone())
    with pytest.raises(UsageError, match="only causal masks work with sequence parallelism"):
        mask_pass(gm, inputs, context(s))


class OldStyleShift(torch.nn.Module):
    def __init__(self, log_softmax=False, reduction="mean"):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16)
        self.log_softmax, self.reduction = log_softmax, reduction

    def forward(self, input_ids, labels):
        logits = self.head(self.emb(input_ids))
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        flat = shift_logits.view(-1, 16)
        if self.log_softmax:
            return F.nll_loss(F.log_softmax(flat, dim=-1), shift_labels.view(-1))
        return F.cross_entropy(flat, shift_labels.view(-1), reduction=self.reduction)


@pytest.mark.slow
@pytest.mark.parametrize("log_softmax", [False, True])
def test_loss_pass_removes_old_style_shift_and_makes_the_loss_global(log_softmax):
    ids = torch.randint(0, 16, (2, 6))
    gm, inputs = capture(OldStyleShift(log_softmax), ids, ids.clone())
    ctx = context(6)
    loss_pass(gm, inputs, ctx)
    slices = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is operator.getitem
              and isinstance(n.args[1], tuple) and any(isinstance(i, slice) and i != slice(None) for i in n.args[1])]
    assert not slices  # both the logits[..., :-1, :] and labels[..., 1:] slices are gone
    assert ctx.stats.label_shifts_removed == 1 and len(calls(gm, ALL_REDUCE)) == 1
    loss = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in (F.cross_entropy, F.nll_loss)][0]
    assert loss.kwargs["reduction"] == "sum"


@pytest.mark.slow
def test_loss_pass_refuses_a_sum_loss():
    ids = torch.randint(0, 16, (2, 6))
    gm, inputs = capture(OldStyleShift(reduction="sum"), ids, ids.clone())
    with pytest.raises(UsageError, match="reduction='mean'"):
        loss_pass(gm, inputs, context(6))


def test_ops_do_not_collide_with_deepspeeds_autosp_namespace():
    import deepspeed.compile.custom_ops.all_to_all  # noqa: F401  registers DeepSpeed's autosp::all_to_all

    assert "str group" in str(torch.ops.autosp_ops.all_to_all.default._schema)
    assert "str name" in str(torch.ops.autosp.all_to_all.default._schema)


# --- the check pass: linear in the graph, and still strict -------------------------------------------
def _count_input_walks(limit: int):
    """Patch fx.Node.all_input_nodes to count its uses and raise past ``limit`` (so a walk that enumerates
    paths instead of nodes fails at once instead of running for hours)."""
    from torch import fx

    original = fx.Node.all_input_nodes
    count = [0]

    def counted(node):
        count[0] += 1
        if count[0] > limit:
            raise AssertionError(f"the check visited graph nodes more than {limit} times")
        return original.fget(node)

    return original, property(counted), count


@pytest.mark.slow
def test_check_pass_is_linear_when_the_logits_are_s_by_s_by_coincidence():
    """Regression: with vocab == local length s the logits are (s x s); the check's dependence walk from
    them enumerated every path through the residual stream (2 layers: 175,881 input visits for 190 nodes,
    3 layers: millions; Llama at S=4096 on SP=4 with vocab 1024 never finished compiling)."""
    from torch import fx

    import transformers

    s = 64
    config = transformers.LlamaConfig(vocab_size=s, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa",
                                      use_cache=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, s, (1, s))
    gm, inputs = capture(model, input_ids=ids, labels=ids.clone())
    ctx = context(s)
    for sp_pass in (mask_pass, position_pass, attention_pass, loss_pass):
        sp_pass(gm, inputs, ctx)
    assert any(tuple(n.meta["example_value"].shape[-2:]) == (s, s) for n in gm.graph.nodes
               if isinstance(n.meta.get("example_value"), torch.Tensor) and n.meta["example_value"].dim() >= 2)
    original, counted, count = _count_input_walks(limit=10 * len(gm.graph.nodes))
    fx.Node.all_input_nodes = counted
    try:
        check_pass(gm, inputs, ctx)  # the logits come from the LM head's weight: not a mask, no error
    finally:
        fx.Node.all_input_nodes = original
    assert count[0] <= 10 * len(gm.graph.nodes)


def _wrapped_attention_graph(extra):
    """A graph with one SDPA rewired by the attention pass, plus ``extra(q, k)``'s output."""
    s = 8

    def fn(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.sum() + extra(q, k)

    q, k, v = (torch.randn(1, 4, s, 8) for _ in range(3))
    gm, inputs = capture(fn, q, k, v)
    ctx = context(s)
    attention_pass(gm, inputs, ctx)
    return gm, inputs, ctx


@pytest.mark.slow
def test_check_pass_still_rejects_hand_written_attention_and_a_left_over_mask():
    gm, inputs, ctx = _wrapped_attention_graph(lambda q, k: (q @ k.transpose(-1, -2)).sum())
    with pytest.raises(UsageError, match="attention computed outside scaled_dot_product_attention"):
        check_pass(gm, inputs, ctx)

    def mask_left(q, k):
        keep = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril()
        return (q[0, 0, :, :1] * keep).sum()

    gm, inputs, ctx = _wrapped_attention_graph(mask_left)
    with pytest.raises(UsageError, match="8 x 8 tensor is left in the graph"):
        check_pass(gm, inputs, ctx)
