"""autosp-train: trains under a plan file on 2 gloo processes and logs every step; clear usage errors."""

from __future__ import annotations

import dataclasses
import json

import pytest

from autosp.contract.specs import (
    AcceleratorSpec,
    Candidate,
    Estimate,
    HardwareSpec,
    MemoryBreakdown,
    ModelSpec,
    TimeBreakdown,
    Workload,
)
from autosp.errors import UsageError

TINY = ModelSpec(name="tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_hidden=128, vocab=97)


def _zeros(cls, **given):
    return cls(**{f.name: 0.0 for f in dataclasses.fields(cls) if f.name not in given}, **given)


def write_plan(path, candidate, seq_len=48):
    from autosp.contract.plan import Plan, save_plan

    hardware = HardwareSpec(name="cpu-test", accelerator=AcceleratorSpec("cpu", 1e11, 8e9, 1e10), devices_per_node=2)
    estimate = Estimate(memory=_zeros(MemoryBreakdown), time=_zeros(TimeBreakdown), capacity_bytes=8e9,
                        tokens_per_second=0.0, mfu=0.0)
    plan = Plan(model=TINY, hardware=hardware, workload=Workload(seq_len=seq_len, dtype="fp32"), candidate=candidate,
                estimate=estimate)
    save_plan(plan, path)
    return path


def test_plan_file_is_read_and_unsupported_knobs_rejected(tmp_path):
    from autosp.compiler.api import resolve_candidate

    path = write_plan(tmp_path / "plan.json", Candidate(sp=2, dp=1, zero_stage=2, micro_batch=1))
    candidate, plan = resolve_candidate(str(path), None, 2)
    assert (candidate.sp, candidate.zero_stage, plan.model.name) == (2, 2, "tiny")
    knobs = write_plan(tmp_path / "knobs.json", Candidate(sp=2, checkpointing="selective", mlp_chunks=2,
                                                          loss_chunks=2, overlap="kv_async"))
    candidate, _ = resolve_candidate(str(knobs), None, 2)
    assert (candidate.checkpointing, candidate.mlp_chunks, candidate.loss_chunks, candidate.overlap) == (
        "selective", 2, 2, "kv_async")
    bad = write_plan(tmp_path / "bad.json", Candidate(sp=2))
    data = json.loads(bad.read_text())
    data["candidate"]["checkpointing"] = "everything"  # a knob value no pass implements
    bad.write_text(json.dumps(data))
    with pytest.raises(UsageError, match="checkpointing"):
        resolve_candidate(str(bad), None, 2)


def _train(rank, world, argv):
    from autosp.compiler.train_cli import main

    return main(argv)


@pytest.mark.slow
def test_train_under_a_plan_on_two_processes(tmp_path):
    from autosp.compiler import testing

    plan = write_plan(tmp_path / "plan.json", Candidate(sp=2, dp=1, zero_stage=1, micro_batch=1, grad_accum=2),
                      seq_len=47)
    log = tmp_path / "steps.jsonl"
    code = testing.spawn(_train, 2, ["--plan", str(plan), "--steps", "3", "--backend", "aot_eager",
                                     "--log-json", str(log)])
    assert code == 0
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["loss"] > 0 and s["step_time_s"] > 0 and s["peak_memory_gib"] > 0 for s in steps)
    assert abs(steps[0]["loss"] - 4.57) < 0.1  # ~ln(97) for a fresh model


def test_usage_errors():
    from autosp.compiler.train_cli import main

    with pytest.raises(UsageError, match="--plan or --sp"):
        main(["--model", "llama-3.2-1b", "--ctx", "64"])
    with pytest.raises(UsageError, match="invalid choice"):  # one line (issue 10), not argparse's usage text
        main(["--zero", "5"])


def _train_packed(rank, world, argv):
    from autosp.compiler import ops
    from autosp.compiler.train_cli import main

    code = main(argv)
    return code, ops.CALLS["span_attention"]


def _train_packed_chunked(rank, world, argv):
    from autosp.compiler import ops
    from autosp.compiler.train_cli import main

    code = main(argv)
    return code, ops.CALLS["chunked_layer"]


@pytest.mark.slow
def test_train_packed_documents_from_a_token_file(tmp_path):
    import numpy as np

    from autosp.compiler import testing

    rng = np.random.default_rng(0)
    docs = [np.append(rng.integers(6, 97, size=n), 5) for n in rng.integers(1, 30, size=200)]  # 5 ends a document
    np.save(tmp_path / "docs.npy", np.concatenate(docs).astype(np.int64))
    log = tmp_path / "steps.jsonl"
    code, span_calls = testing.spawn(_train_packed, 2, [
        "--model", "llama-3.2-1b", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ffn",
        "128", "--vocab", "97", "--sp", "2", "--ctx", "64", "--steps", "2", "--backend", "aot_eager", "--dtype", "fp32",
        "--data", str(tmp_path / "docs.npy"), "--doc-sep", "5", "--log-json", str(log)])
    assert code == 0
    assert span_calls >= 2 * 2  # every layer of every step ran document-restricted attention
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and abs(steps[0]["loss"] - 4.57) < 0.2


@pytest.mark.slow
def test_train_packed_documents_with_sequence_chunked_layers(tmp_path):
    """A plan with sequence-chunked layers trains packed documents (the chunks keep to the documents)."""
    import numpy as np

    from autosp.compiler import testing

    rng = np.random.default_rng(1)
    docs = [np.append(rng.integers(6, 97, size=n), 5) for n in rng.integers(1, 30, size=200)]
    np.save(tmp_path / "docs.npy", np.concatenate(docs).astype(np.int64))
    plan = write_plan(tmp_path / "chunks.json", Candidate(sp=2, sequence_chunks=2, offload_chunks=True), seq_len=64)
    log = tmp_path / "steps.jsonl"
    code, chunked_calls = testing.spawn(_train_packed_chunked, 2, [
        "--plan", str(plan), "--steps", "2", "--backend", "aot_eager", "--data", str(tmp_path / "docs.npy"),
        "--doc-sep", "5", "--log-json", str(log)])
    assert code == 0 and chunked_calls >= 2 * 2  # every layer of every step ran chunked
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and abs(steps[0]["loss"] - 4.57) < 0.2
