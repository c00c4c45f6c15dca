"""autosp-train's text data, schedules, logging and first-run notices, in one process (no training)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from autosp.errors import UsageError
from text_fixtures import TINY_FLAGS, documents, make_tokenizer, write_all_formats


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOSP_DATA_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def tokenizer_dir(tmp_path):
    return make_tokenizer(tmp_path / "tok")


def test_every_format_reads_the_same_documents_and_the_cache_is_reused(tmp_path, cache, tokenizer_dir, monkeypatch):
    from autosp.compiler.data import tokens as tokens_module
    from autosp.compiler.data.tokens import load_tokenizer, tokenized

    docs = documents(30)
    paths = write_all_formats(tmp_path, docs)
    tokenizer = load_tokenizer(tokenizer_dir)
    expected = np.concatenate([tokenizer(d)["input_ids"] + [tokenizer.eos_token_id] for d in docs])
    said = []
    results = {kind: tokenized(path, "body", tokenizer, log=lambda *a, **k: said.append(a[0]))
               for kind, path in paths.items()}
    for kind, data in results.items():
        assert not data.cached, kind
        assert data.documents == len(docs), kind
        np.testing.assert_array_equal(np.asarray(data.tokens), expected, err_msg=kind)
        assert data.starts[0] == 0 and data.starts[-1] == expected.size
    assert all("tokenizing 30 documents" in line for line in said)

    calls = []
    original = tokens_module._tokenize
    monkeypatch.setattr(tokens_module, "_tokenize", lambda *a, **k: calls.append(1) or original(*a, **k))
    said.clear()
    again = tokenized(paths["jsonl"], "body", tokenizer, log=lambda *a, **k: said.append(a[0]))
    assert again.cached and calls == [] and "read from the token cache" in said[0]  # no tokenizing the 2nd time
    np.testing.assert_array_equal(np.asarray(again.tokens), expected)
    copy = tmp_path / "renamed.jsonl"  # the key is the content, not the name
    copy.write_bytes(open(paths["jsonl"], "rb").read())
    assert tokenized(str(copy), "body", tokenizer, show=False).cached and calls == []
    with open(copy, "a") as f:  # an edited file is tokenized again
        f.write('{"body": "w1 w2", "n": 99}\n')
    edited = tokenized(str(copy), "body", tokenizer, show=False)
    assert not edited.cached and calls == [1] and edited.documents == len(docs) + 1
    assert not list(cache.glob(".tmp-*"))  # nothing half-written left beside the entries


def test_packed_rows_follow_the_document_boundaries_and_batches_are_a_function_of_seed_and_step(tmp_path, cache,
                                                                                            tokenizer_dir):
    from autosp.compiler.data.sources import PackedTextSource, batch_counts
    from autosp.compiler.data.tokens import load_tokenizer, tokenized

    path = tmp_path / "d.jsonl"
    path.write_text("".join(f'{{"text": "{d}"}}\n' for d in documents(25, seed=3)))
    data = tokenized(str(path), "text", load_tokenizer(tokenizer_dir), show=False)
    seq = 48
    source = PackedTextSource(data, seq, 7, 1, torch)
    assert source.sequences == math.ceil(data.tokens.size / seq)
    starts = set(data.starts.tolist())
    for index in range(source.sequences):
        ids, pos, labels, mask = source.row(index)
        real = int(mask.sum())
        for t in range(real):
            g = index * seq + t
            assert ids[t] == data.tokens[g]
            begins = t == 0 or g in starts
            assert (pos[t] == 0) == begins and (labels[t] == -100) == begins
        assert (labels[real:] == -100).all() and (ids[real:] == 1).all()
    # pure function of (seed, micro-step): a fresh source (a resumed run) gives the same batches
    again = PackedTextSource(data, seq, 7, 1, torch)
    for step in (0, 5, 17):
        a, b = source.batch(step, 2), again.batch(step, 2)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(PackedTextSource(data, seq, 8, 1, torch).batch(0, 4)["input_ids"],
                           source.batch(0, 4)["input_ids"])
    # one epoch visits every sequence once
    seen = [tuple(source.batch(m, 1)["input_ids"][0].tolist()) for m in range(source.sequences)]
    assert sorted(seen) == sorted(tuple(source.row(i)[0].tolist()) for i in range(source.sequences))
    # the real tokens and targets of the evaluation batches add up to the stream
    tokens = targets = 0
    for index in range(source.eval_batches(2)):
        t, n = batch_counts(source.eval_batch(index, 2))
        tokens, targets = tokens + t, targets + n
    assert tokens == data.tokens.size
    assert source.fingerprint()["tokens_key"] == data.key and source.fingerprint_hash() == again.fingerprint_hash()


@pytest.mark.parametrize("kind, expected", [
    ("constant", [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0]),
    ("linear", [0.25, 0.5, 0.75, 1.0, 1.0, 0.7, 0.4, 0.1]),
    ("cosine", [0.25, 0.5, 0.75, 1.0, 1.0, 0.1 + 0.9 * (1 + math.cos(math.pi / 3)) / 2,
                0.1 + 0.9 * (1 + math.cos(2 * math.pi / 3)) / 2, 0.1]),
])
def test_schedules_give_the_expected_rate_at_each_step(kind, expected):
    """warmup 4 of 8 steps, lr 1, min_lr 0.1 (decay from step 4 to the last, 7) (constant ignores min_lr); through torch's LambdaLR as
    DeepSpeed steps it, and its state_dict keeps the schedule (what DeepSpeed's checkpoint saves)."""
    from autosp.compiler.training.schedule import OptimizerOptions, learning_rate, scheduler_factory

    opts = OptimizerOptions(lr=1.0, min_lr=0.1, warmup=4, schedule=kind, total_steps=8)
    assert [learning_rate(opts, s) for s in range(8)] == pytest.approx(expected)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=1.0)
    scheduler = scheduler_factory(opts)(optimizer)
    seen = []
    for _ in range(8):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx(expected)
    assert scheduler.state_dict()["lr_lambdas"][0] == {"schedule": kind, "warmup": 4, "total": 8, "min_ratio": 0.1}


def test_schedule_options_refuse_what_no_run_can_use():
    from autosp.compiler.training.schedule import OptimizerOptions

    for bad, match in (({"schedule": "cosine"}, "total_steps"), ({"lr": 1e-3, "min_lr": 1e-2}, "above"),
                       ({"schedule": "step"}, "one of"), ({"warmup": 5, "total_steps": 3}, "longer")):
        with pytest.raises(UsageError, match=match):
            OptimizerOptions(**bad)


def test_tensorboard_holds_the_logged_scalars_and_mfu_needs_a_plan(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from autosp.compiler.training.logging import StepLogger, flops_per_token
    from autosp.contract.specs import Candidate

    lines = []
    logger = StepLogger(steps=2, seq=64, candidate=Candidate(sp=2), tensorboard=str(tmp_path / "tb"),
                        log_json=str(tmp_path / "log.jsonl"), print_fn=lambda *a, **k: lines.append(a[0]))
    first = logger.record(1, loss=4.5, lr=1e-4, grad_norm=2.0, tokens=128, seconds=2.0, peak=1.0, memory="GiB")
    second = logger.record(2, loss=4.25, lr=5e-5, grad_norm=None, tokens=100, seconds=1.0, peak=1.0, memory="GiB",
                           extra={"eval_loss": 4.0})
    logger.close()
    assert first["tokens_per_s"] == 64.0 and second["tokens_per_s"] == 100.0
    assert first["mfu"] is None and "MFU n/a" in lines[0] and "grad norm n/a" in lines[1]  # no plan: no peak
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 4.5), (2, 4.25)]
    assert [e.value for e in events.Scalars("train/lr")] == pytest.approx([1e-4, 5e-5])
    assert [(e.step, e.value) for e in events.Scalars("train/grad_norm")] == [(1, 2.0)]
    assert [(e.step, e.value) for e in events.Scalars("eval/loss")] == [(2, 4.0)]
    assert [e.value for e in events.Scalars("train/tokens_per_s")] == [64.0, 100.0]
    assert flops_per_token(None, 64, Candidate(sp=2)) is None


def test_mfu_from_the_cost_model_and_the_plans_hardware(tmp_path):
    from test_compiler_train_cli import write_plan

    from autosp.compiler.api import load_plan
    from autosp.compiler.training.logging import StepLogger
    from autosp.cost_models.flops import model_flops
    from autosp.cost_models.shapes import Shapes
    from autosp.contract.specs import Candidate

    cand = Candidate(sp=2)
    plan = load_plan(write_plan(tmp_path / "plan.json", cand, seq_len=64))
    logger = StepLogger(steps=1, seq=64, candidate=cand, plan=plan, world=2, print_fn=lambda *a, **k: None)
    rec = logger.record(1, loss=1.0, lr=1.0, grad_norm=1.0, tokens=64, seconds=0.5, peak=0.0, memory="GiB")
    per_step = model_flops(Shapes(plan.model, plan.workload, cand)) * 2  # both ranks' share of one sequence
    assert rec["mfu"] == pytest.approx(per_step / 0.5 / (plan.hardware.accelerator.peak_flops * 2))


def test_first_run_notices(tmp_path, monkeypatch):
    from torch.utils.cpp_extension import _get_build_directory

    from autosp.compiler.training import first_run

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    assert "building DeepSpeed's CPU ops (deepspeed_shm_comm), once" in first_run.op_notice(cuda=False, offload_optimizer=False)
    built = tmp_path / _get_build_directory("deepspeed_shm_comm", verbose=False)
    built.mkdir(parents=True, exist_ok=True)
    (built / "deepspeed_shm_comm.so").write_bytes(b"")
    assert first_run.op_notice(cuda=False, offload_optimizer=False) is None  # built once: nothing to say
    assert first_run.compile_notice("aot_eager") is None
    assert "Inductor" in first_run.compile_notice("inductor")


@pytest.mark.parametrize("case, extra, match", [
    ("missing field", ["--text-field", "content"], "has no field 'content'"),
    ("empty file", ["--data", "{empty}"], "is empty"),
    ("no tokenizer", ["--tokenizer", None], "needs a tokenizer"),
    ("unknown extension", ["--data", "{csv}"], "unknown data type '.csv'"),
    ("not a tokenizer", ["--tokenizer", "{tmp}"], "holds no tokenizer"),
    ("eval without every", ["--eval-data", "{docs}"], "--eval-every"),
    ("min-lr above lr", ["--min-lr", "1"], "above --lr"),
    ("doc-sep with text", ["--doc-sep", "2"], "--doc-sep"),
])
def test_bad_text_inputs_are_one_line(tmp_path, cache, tokenizer_dir, case, extra, match):
    from autosp.compiler.train_cli import main

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(f'{{"text": "{d}"}}\n' for d in documents(5)))
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "d.csv").write_text("text\nw1\n")
    argv = TINY_FLAGS + ["--sp", "1", "--ctx", "32", "--data", str(docs), "--tokenizer", tokenizer_dir]
    names = {"{empty}": str(tmp_path / "empty.jsonl"), "{csv}": str(tmp_path / "d.csv"), "{tmp}": str(tmp_path),
             "{docs}": str(docs)}
    for i in range(0, len(extra), 2):
        flag, value = extra[i], extra[i + 1]
        at = argv.index(flag) if flag in argv else None
        if value is None:
            del argv[at:at + 2]
        elif at is not None:
            argv[at + 1] = names.get(value, value)
        else:
            argv += [flag, names.get(value, value)]
    with pytest.raises(UsageError, match=match) as err:
        main(argv)
    assert "\n" not in str(err.value)


def test_a_run_that_shrinks_the_planned_model_is_not_compared_with_the_plan(tmp_path):
    """--layers 2 under a plan priced for more layers: MFU counts the 2 layers' FLOPs, and the plan's predicted step
    time and MFU (of the planned model) are not shown next to the step."""
    import dataclasses

    from test_compiler_train_cli import write_plan

    from autosp.compiler.api import load_plan
    from autosp.compiler.training.logging import StepLogger
    from autosp.cost_models import estimate
    from autosp.cost_models.flops import model_flops
    from autosp.cost_models.shapes import Shapes
    from autosp.contract.specs import Candidate

    cand = Candidate(sp=2)
    plan = load_plan(write_plan(tmp_path / "plan.json", cand, seq_len=64))
    plan = dataclasses.replace(plan, estimate=estimate(plan.model, plan.hardware, plan.workload, cand))
    assert plan.estimate.time.step > 0
    small = dataclasses.replace(plan.model, n_layers=1, name="renamed")
    lines = []
    logger = StepLogger(steps=1, seq=64, candidate=cand, plan=plan, world=2, model=small,
                        print_fn=lambda *a, **k: lines.append(a[0]))
    rec = logger.record(1, loss=1.0, lr=1.0, grad_norm=1.0, tokens=64, seconds=0.5, peak=0.0, memory="GiB")
    per_step = model_flops(Shapes(small, plan.workload, cand)) * 2
    assert rec["mfu"] == pytest.approx(per_step / 0.5 / (plan.hardware.accelerator.peak_flops * 2))
    assert rec["predicted_step_time_s"] is None and rec["predicted_mfu"] is None and "(plan " not in lines[0]
    assert "n_layers=1" in logger.plan_difference
    same = StepLogger(steps=1, seq=64, candidate=cand, plan=plan, world=2, print_fn=lambda *a, **k: None,
                      model=dataclasses.replace(plan.model, name="same shape, another name"))
    assert same.plan_difference is None and same.predicted_step == plan.estimate.time.step
    longer = StepLogger(steps=1, seq=128, candidate=cand, plan=plan, world=2, print_fn=lambda *a, **k: None)
    assert "64 tokens" in longer.plan_difference and longer.predicted_step is None
