"""Checkpointing policies and activation offload (plan knobs ``checkpointing``, ``offload_activations``).

Multi-process part (one spawned world-2 gloo job, like tests/compiler/test_compiler_exact.py): every case trains 3
steps at SP=2 through ``autosp.compile(plan=Candidate(...))`` and rank 0 compares the loss of every step,
every gradient of the first step and every weight after the last with one process on the full sequence
(fp32, relative 1e-5). The first step also runs under ``saved_tensors_hooks`` (compiler/saved_memory.py), so
the same cases give the measured saved-for-backward bytes per rank; the partitioner's report
(``stats.partitions``) gives them per decoder layer and says which forward ops the backward recomputes.
The per-layer bytes are checked against the cost model's ``layer_saved_elems`` (docs/cost_model.md,
"Activations") and the table is printed (``pytest -s``).

Unit part (no processes): the op classes, layer assignment, tags and partition of a traced joint graph, the
offload rewrite on CPU, and the plan errors.
"""

from __future__ import annotations

import json

import pytest
import torch

from test_compiler_exact import TOL, Z3, VOCAB, make_batches, reference_llama, sgd  # noqa: E402

from autosp.compiler.testing import assert_within

L, H, Q, KV, F_HIDDEN, HEADS = 2, 64, 64, 32, 128, 4   # reference_llama(): 2 layers, h 64, 4x16 q, 2x16 kv, f 128
SEQ, BATCH, SP = 32, 2, 2
LOCAL_TOKENS = SEQ // SP * BATCH                      # tokens one rank holds between the all-to-alls

# name -> (candidate fields, compile kwargs)
CASES = {
    "none": (dict(), {}),
    "selective": (dict(checkpointing="selective"), {}),
    "sequence": (dict(checkpointing="sequence"), {}),
    "full": (dict(checkpointing="full"), {}),
    "selective_offload": (dict(checkpointing="selective", offload_activations=True), {}),
    "full_offload": (dict(checkpointing="full", offload_activations=True), {}),
    "sequence_offload_inductor": (dict(checkpointing="sequence", offload_activations=True), dict(backend="inductor")),
    "zero3_full_offload": (dict(checkpointing="full", offload_activations=True, zero_stage=3), dict(ds_config=Z3)),
}


def _candidate(fields):
    from autosp.contract.specs import Candidate

    return Candidate(sp=SP, micro_batch=BATCH, **fields)


def run_cases(rank, world, names):
    import copy

    import autosp
    from autosp.compiler import testing
    from autosp.compiler.passes.offload import OFFLOADED
    from autosp.compiler.saved_memory import measure_saved

    def run_one(name):
        fields, compile_kw = CASES[name]
        model, batches = reference_llama(), make_batches(batch=BATCH, seq=SEQ)
        options = autosp.CompileOptions(optimizer=sgd, **{"backend": "aot_eager", **compile_kw})
        engine = autosp.compile(copy.deepcopy(model), _candidate(fields), options=options)
        losses, grads, saved, moved = [], None, None, 0
        for step, batch in enumerate(batches):
            before = OFFLOADED["bytes"]
            if step == 0:
                with measure_saved(engine.module) as saved:
                    loss = engine(**batch)
            else:
                loss = engine(**batch)
            moved = OFFLOADED["bytes"] - before
            engine.backward(loss)
            losses.append(loss.item())
            if grads is None:
                grads = {n: testing.full_grad(p) for n, p in engine.module.named_parameters()}
            engine.step()
        got = {"losses": losses, "grads": grads,
               "weights": {n: testing.full_weight(p) for n, p in engine.module.named_parameters()}}
        if rank == 0:
            ref = testing.reference_run(model, batches, sgd)
            return {"errors": testing.compare(got, ref),
                    "partitions": [vars(r) | {"saved_layers": r.saved_layers} for r in engine.stats.partitions],
                    "saved": {"device": saved.device_bytes, "host": saved.host_bytes},
                    "moved_per_step": moved}

    return testing.run_cases(rank, names, run_one)


@pytest.fixture(scope="module")
def world2():
    from autosp.compiler import testing

    return testing.spawn(run_cases, 2, list(CASES))


def _ok(world2, name):
    result = world2[name]
    assert "crash" not in result, result.get("crash")
    return result


def _layer_graph(result):
    """The report of the graph holding the decoder layers (the whole model, or one layer under ZeRO-3)."""
    return max(result["partitions"], key=lambda r: r["layers"])


def cost_model_layer_bytes(policy: str) -> float:
    """Bytes one layer keeps per rank under ``policy`` according to the cost model (memory.py)."""
    from autosp.cost_models.memory import layer_extra_bytes, layer_saved_elems
    from autosp.cost_models.shapes import Shapes
    from autosp.contract.specs import ModelSpec, Workload

    spec = ModelSpec(name="tiny", n_layers=L, hidden=H, n_heads=HEADS, n_kv_heads=2, head_dim=16,
                     ffn_hidden=F_HIDDEN, vocab=VOCAB)
    sh = Shapes(spec, Workload(seq_len=SEQ, dtype="fp32"), _candidate(dict(checkpointing=policy)))
    attn, mlp = layer_saved_elems(sh, policy, False)
    return sh.s * ((attn + mlp) * sh.e + layer_extra_bytes(sh, policy))


# --- multi-process: exactness -----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_exact_against_single_process(world2, name):
    assert_within(world2[name], TOL)


# --- multi-process: what is kept, what is recomputed ------------------------------------------------
@pytest.mark.slow
def test_saved_bytes_per_layer_against_the_cost_model(world2):
    rows = []
    for name in ("none", "selective", "sequence", "full"):
        result = _ok(world2, name)
        report = _layer_graph(result)
        assert report["layers"] == L
        measured = report["saved_by_layer"]
        predicted = cost_model_layer_bytes(name)
        rows.append((name, measured, predicted, result["saved"]["device"] + result["saved"]["host"],
                     L * predicted))
        if name == "none":
            # torch's default partitioner recomputes SiLU(gate) instead of saving it: f elements per token
            assert all(m == predicted - LOCAL_TOKENS * F_HIDDEN * 4 for m in measured), (measured, predicted)
        else:
            assert all(m == predicted for m in measured), (name, measured, predicted)
    print("\npolicy     | measured per layer (B) | cost model per layer (B) | ratio | step saved, hooks (B) | "
          "cost model x L (B)")
    for name, measured, predicted, hooks, total in rows:
        print(f"{name:10} | {measured[0]:22d} | {predicted:24.0f} | {measured[0] / predicted:5.3f} | {hooks:21d} | "
              f"{total:18.0f}")


@pytest.mark.slow
def test_saved_bytes_seen_by_autograd_match_the_partition(world2):
    """The hooks' per-rank total is the partition's saved activations (layers + outside), nothing hidden. The
    hooks count whole storages: the loss keeps a 0-d view of its 2-element statistics (4 bytes more)."""
    for name in ("none", "selective", "sequence", "full"):
        result = _ok(world2, name)
        report = _layer_graph(result)
        graph_total = report["saved_layers"] + report["saved_outside"]
        assert result["saved"]["host"] == 0
        assert 0 <= result["saved"]["device"] - graph_total <= 8, (name, result["saved"], graph_total)


@pytest.mark.slow
def test_what_the_backward_recomputes(world2):
    recomputed = {name: _layer_graph(_ok(world2, name))["recomputed"] for name in ("none", "selective", "sequence",
                                                                                     "full")}
    for name in ("none", "selective"):  # pointwise only
        assert not {"matmul", "attention", "collective"} & set(recomputed[name]), (name, recomputed[name])
    # sequence: projections and MLP (o_proj for the residual, gate and up for the MLP backward), never
    # attention or an all-to-all
    assert recomputed["sequence"].get("matmul") == 3 * L
    assert "attention" not in recomputed["sequence"] and "collective" not in recomputed["sequence"]
    # full: the whole layer's forward, attention and its 4 all-to-alls included
    assert recomputed["full"].get("attention") == L
    assert recomputed["full"].get("collective") == 4 * L
    assert recomputed["full"].get("matmul") == 6 * L   # q, k, v, o, gate, up (down's output is not needed)


@pytest.mark.slow
@pytest.mark.parametrize("name,plain", [("selective_offload", "selective"), ("full_offload", "full")])
def test_offload_moves_the_layers_saved_activations_to_host(world2, name, plain):
    result, base = _ok(world2, name), _ok(world2, plain)
    report, base_report = _layer_graph(result), _layer_graph(base)
    assert report["saved_by_layer"] == base_report["saved_by_layer"]   # the same partition
    assert report["offloaded"] == report["saved_layers"] > 0
    assert result["moved_per_step"] == report["offloaded"]             # the copies really ran, every step
    assert result["saved"]["host"] == report["offloaded"]              # autograd keeps the host copies
    assert result["saved"]["device"] == base["saved"]["device"] - report["offloaded"]


@pytest.mark.slow
def test_offload_with_inductor_and_under_zero3(world2):
    inductor = _layer_graph(_ok(world2, "sequence_offload_inductor"))
    assert inductor["offloaded"] == inductor["saved_layers"] == L * cost_model_layer_bytes("sequence")
    zero3 = _ok(world2, "zero3_full_offload")
    layer = _layer_graph(zero3)
    assert layer["layers"] == 1                      # ZeRO-3: each layer is a graph of its own
    assert layer["saved_by_layer"] == [cost_model_layer_bytes("full")] == [LOCAL_TOKENS * H * 4]
    assert layer["offloaded"] == layer["saved_layers"]
    assert zero3["moved_per_step"] == L * layer["offloaded"]  # one compiled layer graph, run for both layers


# --- unit: the partition of a traced joint graph (no processes) -------------------------------------
POLICY_RUNS = (("none", False), ("selective", False), ("sequence", False), ("full", False), ("full", True))


@pytest.fixture(scope="module")
def partitions():
    """Trace the 2-layer reference model (no SP passes, 8 tokens) once; partition its joint graph for every
    policy (each on a copy) and train-step the last one (full + offload). {(policy, offload): report}."""
    import copy
    from types import SimpleNamespace

    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop

    from autosp.compiler.context import PassStats
    from autosp.compiler.passes.checkpointing import SPPartitioner

    reports = {}

    def partition(joint, joint_inputs, **kwargs):
        for policy, offload in POLICY_RUNS:
            ctx = SimpleNamespace(candidate=SimpleNamespace(checkpointing=policy, offload_activations=offload),
                                  fragments=False, stats=PassStats())
            graph = copy.deepcopy(joint) if (policy, offload) != POLICY_RUNS[-1] else joint
            fw_bw = SPPartitioner(ctx)(graph, joint_inputs, **kwargs)
            reports[policy, offload] = ctx.stats.partitions[0]
        return fw_bw

    torch._dynamo.reset()
    model = reference_llama()
    eager = copy.deepcopy(model)
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    backend = aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop, partition_fn=partition)
    loss = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)(ids, ids).loss
    loss.backward()
    eager(ids, ids).loss.backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):   # full + offload ran: exact
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7, msg=name)
    return reports


@pytest.mark.slow
def test_policies_keep_what_they_promise_on_a_traced_graph(partitions):
    none = partitions["none", False]
    assert all(r.layers == L for r in partitions.values())
    tokens = 8
    kept = {policy: partitions[policy, False].saved_by_layer for policy in ("selective", "sequence", "full")}
    assert kept["full"] == [tokens * H * 4] * L                        # the layer input only
    assert kept["full"] < kept["sequence"] < kept["selective"] < none.saved_by_layer
    # without the SP passes there are no collectives; attention is kept by every policy but full
    assert not {"matmul", "attention"} & set(none.recomputed)
    assert not {"matmul", "attention"} & set(partitions["selective", False].recomputed)
    assert partitions["sequence", False].recomputed.get("matmul", 0) > 0
    assert "attention" not in partitions["sequence", False].recomputed
    assert partitions["full", False].recomputed.get("attention") == L
    offloaded = partitions["full", True]
    assert offloaded.saved_by_layer == kept["full"] and offloaded.offloaded == offloaded.saved_layers


def test_op_classes_and_layers_from_module_stacks():
    from torch import fx

    from autosp.compiler import ops  # noqa: F401
    from autosp.compiler.passes.checkpointing import assign_layers, block_path, forward_nodes, op_class

    graph = fx.Graph()
    x = graph.placeholder("primals_1")
    w = graph.placeholder("primals_2")
    mm = graph.call_function(torch.ops.aten.mm.default, (x, w))
    a2a = graph.call_function(torch.ops.autosp_ops.all_to_all.default, (mm, 1, 2, "g"))
    sdpa = graph.call_function(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, (a2a, a2a, a2a))
    out = graph.call_function(__import__("operator").getitem, (sdpa, 0))
    view = graph.call_function(torch.ops.aten.view.default, (out, [-1]))
    silu = graph.call_function(torch.ops.aten.silu.default, (view,))
    tangent = graph.placeholder("tangents_1")
    grad = graph.call_function(torch.ops.aten.mul.Tensor, (tangent, silu))
    graph.output((silu, grad))
    stack = {"l": ("L['self'].model.layers[1]", object), "a": ("L['self'].model.layers[1].attn", object)}
    for node in (mm, sdpa, out, view, silu):
        node.meta["nn_module_stack"] = stack
    assert [op_class(n) for n in (mm, a2a, sdpa, out, view, silu)] == [
        "matmul", "collective", "attention", "attention", "view", "other"]
    assert block_path(mm) == "L['self'].model.layers[1]"
    fwd = forward_nodes(graph)
    assert grad not in fwd and silu in fwd
    layers = assign_layers(graph, fwd)
    assert layers[a2a] == 0 and layers[silu] == 0   # the all-to-all a pass inserted takes its input's layer


# --- unit: plan errors ----------------------------------------------------------------------------
def _plan_dict(**candidate) -> dict:
    """A schema-valid plan (the planner's JSON) whose candidate carries ``candidate``."""
    from autosp.contract.specs import (AcceleratorSpec, Candidate, Estimate, HardwareSpec, MemoryBreakdown,
                                          ModelSpec, TimeBreakdown, Workload)
    from autosp.contract.plan import Plan

    plan = Plan(model=ModelSpec(name="tiny", n_layers=L, hidden=H, n_heads=HEADS, n_kv_heads=2, head_dim=16,
                                ffn_hidden=F_HIDDEN, vocab=VOCAB),
                hardware=HardwareSpec(name="cpu", accelerator=AcceleratorSpec("cpu", 1e12, 1e10, 1e10),
                                      devices_per_node=2),
                workload=Workload(seq_len=SEQ, dtype="fp32"), candidate=Candidate(sp=SP),
                estimate=Estimate(MemoryBreakdown(*[0.0] * 7), TimeBreakdown(*[0.0] * 7), capacity_bytes=1e10,
                                  tokens_per_second=0.0, mfu=0.0))
    data = plan.to_dict()
    data["candidate"].update(candidate)
    return data


@pytest.mark.parametrize("fields,message", [
    (dict(checkpointing="everything"), "checkpointing must be one of"),
    (dict(checkpointing="none", offload_activations=True), "needs a checkpointing policy"),
    (dict(checkpointing="full", offload_activations="yes"), "offload_activations must be true or false"),
])
def test_plan_knob_errors_are_usage_errors(tmp_path, fields, message):
    from autosp.compiler.api import resolve_candidate
    from autosp.errors import UsageError

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_plan_dict(**fields)))
    with pytest.raises(UsageError, match=message) as err:
        resolve_candidate(str(path))
    assert "\n" not in str(err.value)


def test_resolve_candidate_accepts_every_policy_and_offload():
    from autosp.compiler.api import resolve_candidate
    from autosp.contract.specs import CHECKPOINTING_POLICIES, Candidate

    for policy in CHECKPOINTING_POLICIES:
        candidate, _ = resolve_candidate(Candidate(sp=2, checkpointing=policy))
        assert candidate.checkpointing == policy
    candidate, _ = resolve_candidate(Candidate(sp=2, checkpointing="sequence", offload_activations=True))
    assert candidate.offload_activations is True
