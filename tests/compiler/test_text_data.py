"""autosp-train's text data, schedules, logging and first-run notices, in one process (no training)."""

from __future__ import annotations

import json
import math
import os

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


def _reference(tokenizer, docs) -> np.ndarray:
    """The token stream built in memory: every document tokenized, EOS appended, concatenated."""
    return np.concatenate([ids + [tokenizer.eos_token_id] for ids in tokenizer(docs)["input_ids"]])


def _files(data) -> tuple[bytes, bytes]:
    return tuple(open(os.path.join(data.path, name), "rb").read() for name in ("tokens.bin", "starts.bin"))


def test_every_format_reads_the_same_documents_and_tokens_at_any_number_of_workers(tmp_path, cache, tokenizer_dir,
                                                                                   monkeypatch):
    from autosp.compiler.data import tokenizing
    from autosp.compiler.data.tokens import load_tokenizer, tokenized

    docs = documents(30)
    paths = write_all_formats(tmp_path, docs)
    tokenizer = load_tokenizer(tokenizer_dir)
    expected = _reference(tokenizer, docs)
    said = []
    results = {kind: tokenized(path, "body", tokenizer, log=lambda *a, **k: said.append(a[0]))
               for kind, path in paths.items()}
    for kind, data in results.items():
        assert not data.cached, kind
        assert data.documents == len(docs), kind
        assert isinstance(data.tokens, np.memmap) and isinstance(data.starts, np.memmap), kind  # not in memory
        np.testing.assert_array_equal(np.asarray(data.tokens), expected, err_msg=kind)
        assert data.starts[0] == 0 and data.starts[-1] == expected.size
    assert sum("tokenizing 30 documents" in line for line in said) == 4
    assert sum(f"30 documents, {expected.size:,} tokens, tokenized in" in line for line in said) == 4

    # several windows, each split between 2 map workers: the same files byte for byte as one window, one process
    monkeypatch.setattr(tokenizing, "WINDOW_BYTES", 1 << 10)
    monkeypatch.setattr(tokenizing, "MIN_WORKER_BYTES", 1)  # (a corpus this small is otherwise one worker's)
    monkeypatch.setenv("AUTOSP_DATA_CACHE", str(tmp_path / "cache-2"))
    for kind in ("jsonl", "disk"):
        said.clear()
        two = tokenized(paths[kind], "body", tokenizer, workers=2, show=False,
                        log=lambda *a, **k: said.append(a[0]))
        assert not two.cached and _files(two) == _files(results[kind]), kind
        assert "with 2 workers" in said[0], said


def test_the_cache_is_reused_for_unchanged_data_and_rebuilt_when_the_data_or_tokenizer_changes(tmp_path, cache,
                                                                                                tokenizer_dir):
    from autosp.compiler.data.tokens import load_tokenizer, tokenized

    tokenizer = load_tokenizer(tokenizer_dir)
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": d, "other": d[::-1]}) + "\n" for d in documents(20, seed=1)))
    first = tokenized(str(path), "text", tokenizer, show=False)
    said = []
    again = tokenized(str(path), "text", tokenizer, log=lambda *a, **k: said.append(a[0]))
    assert not first.cached and again.cached and again.key == first.key
    assert len(said) == 1 and "20 documents" in said[0] and "read from the token cache" in said[0]

    moved = tmp_path / "moved.jsonl"  # mv keeps the mtime: the file's name plays no part
    os.rename(path, moved)
    assert tokenized(str(moved), "text", tokenizer, show=False).cached

    keys = {first.key}

    def rebuilt(**kwargs) -> bool:
        data = tokenized(str(moved), kwargs.get("field", "text"), kwargs.get("tok", tokenizer), show=False)
        fresh = data.key not in keys and not data.cached
        keys.add(data.key)
        return fresh

    stat = os.stat(moved)
    os.utime(moved, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched: same bytes, new mtime
    assert rebuilt()
    stat = os.stat(moved)
    body = moved.read_bytes()
    at = body.index(b"w", len(body) // 2)  # the same size and mtime, another byte in the middle
    moved.write_bytes(body[:at + 1] + (b"8" if body[at + 1:at + 2] != b"8" else b"7") + body[at + 2:])
    os.utime(moved, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(moved).st_size == stat.st_size and rebuilt()
    with open(moved, "a") as f:  # appended
        f.write(json.dumps({"text": "w1 w2", "other": "x"}) + "\n")
    assert rebuilt()
    assert rebuilt(field="other")  # another text field
    other = make_tokenizer(tmp_path / "tok2", extra_words=1)  # another tokenizer
    assert rebuilt(tok=load_tokenizer(other))
    assert not rebuilt()  # each of them is cached now
    assert not list(cache.glob(".tmp-*"))  # nothing half-written left beside the entries


def test_a_txt_paragraph_ends_at_a_line_of_only_spaces_or_tabs_and_the_run_says_what_it_read(tmp_path, cache,
                                                                                               tokenizer_dir):
    """Issue 36 item 5: five documents in every format, the .txt's separators holding spaces and tabs."""
    import datasets

    from autosp.compiler.data.tokens import load_tokenizer, tokenized

    docs = ["w1 w2", "w3\nw4 w5", "w6", "w7 w8 w9", "w10"]
    (tmp_path / "d.txt").write_text("w1 w2\n  \nw3\nw4 w5\n\t\n\nw6\n \t \nw7 w8 w9\r\n\r\nw10")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    datasets.Dataset.from_dict({"text": docs}).to_parquet(str(tmp_path / "d.parquet"))
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "disk"))
    tokenizer = load_tokenizer(tokenizer_dir)
    expected = _reference(tokenizer, docs)
    for name in ("d.txt", "d.jsonl", "d.parquet", "disk"):
        said = []
        data = tokenized(str(tmp_path / name), "text", tokenizer, log=lambda *a, **k: said.append(a[0]))
        assert data.documents == 5, name
        np.testing.assert_array_equal(np.asarray(data.tokens), expected, err_msg=name)
        assert f"5 documents, {expected.size:,} tokens" in said[-1], (name, said)


@pytest.mark.parametrize("body, where", [
    ('{"text": "w1"}\n{"text": "w2"}\n{"text": "w3",}\n{"text": "w4"}\n',
     "line 3 column 15: Expecting property name enclosed in double quotes"),
    ('{"text": "w1"}\n\n{"text": "w2"\n', "line 3 column 14: Expecting ',' delimiter"),
    ('{"text": "w1"}\n["w2"]\n', "line 2 is a JSON list, not an object"),
])
def test_an_invalid_jsonl_line_is_named_with_its_json_error(tmp_path, cache, tokenizer_dir, body, where):
    """Issue 36 item 4: the file, the line and the JSON error, on one line."""
    from autosp.compiler.data.tokens import load_tokenizer, tokenized

    path = tmp_path / "bad.jsonl"
    path.write_text(body)
    with pytest.raises(UsageError) as err:
        tokenized(str(path), "text", load_tokenizer(tokenizer_dir), show=False)
    assert str(err.value) == f"--data {path} cannot be read as jsonl: {where}"
    assert not list(cache.glob(".tmp-*")) and not list(cache.glob("*/tokens.bin"))


def test_processes_wanting_the_same_data_wait_for_the_one_tokenizing(tmp_path, cache, tokenizer_dir):
    """Another process holds the key's lock (here a thread: flock locks belong to open files, so it excludes this
    process's own calls too): a caller says it waits and then reads what the holder built; if the holder failed
    meanwhile, the caller raises the holder's error instead of failing the same way again; if the holder ended
    without an entry or an error (killed: the kernel drops its lock), the caller tokenizes itself."""
    import threading

    from autosp.compiler.data.cache import building
    from autosp.compiler.data.identity import data_identity
    from autosp.compiler.data.tokens import cache_key, load_tokenizer, tokenized, tokenizer_fingerprint

    tokenizer = load_tokenizer(tokenizer_dir)
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents(12, seed=2)))
    key = cache_key(data_identity(str(path)), tokenizer_fingerprint(tokenizer), "text")

    def contend(holder_ends):
        held, waiting, out = threading.Event(), threading.Event(), {}

        def holder():
            with building(str(cache), key, lambda: None) as build:
                held.set()
                waiting.wait(60)
                holder_ends(build)

        def caller():
            try:
                out["data"] = tokenized(str(path), "text", tokenizer,
                                        log=lambda line, **k: (out.setdefault("said", []).append(line),
                                                               "waiting for another" in line and waiting.set()))
            except UsageError as err:
                out["error"] = str(err)

        threads = [threading.Thread(target=holder)]
        threads[0].start()
        assert held.wait(60)
        threads.append(threading.Thread(target=caller))
        threads[1].start()
        for thread in threads:
            thread.join(120)
        assert waiting.is_set() and not any(t.is_alive() for t in threads)
        return out

    failed = contend(lambda build: build.record_failure(f"--data {path} cannot be read as jsonl: line 7 ..."))
    assert failed["error"] == f"--data {path} cannot be read as jsonl: line 7 ..." and "data" not in failed
    gone = contend(lambda build: None)  # ended without an entry: the caller builds it (the old failure is not its)
    assert not gone["data"].cached and gone["data"].documents == 12
    assert any("tokenizing 12 documents" in line for line in gone["said"])
    assert tokenized(str(path), "text", tokenizer, show=False).cached


KILLED_CHILD = """
import sys
from autosp.compiler.data import tokenizing
from autosp.compiler.data.tokens import load_tokenizer, tokenized
tokenizing.WINDOW_BYTES = 1 << 14  # many windows: the parent kills it after the first is written
tokenized(sys.argv[1], "text", load_tokenizer(sys.argv[2]), show=False)
"""


@pytest.mark.slow
def test_a_tokenization_killed_midway_leaves_no_cache_entry_and_the_next_run_tokenizes_afresh(tmp_path, cache,
                                                                                               tokenizer_dir):
    import glob
    import signal
    import subprocess
    import sys
    import time

    from autosp.compiler.data.tokens import load_tokenizer, tokenized

    docs = documents(15_000, seed=4)
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, str(path), tokenizer_dir],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while not any(os.path.getsize(f) for f in glob.glob(str(cache / ".tmp-*" / "tokens.bin"))):
            assert child.poll() is None, f"finished before it could be killed: {child.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline
            time.sleep(0.005)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == []  # no entry, only its leftovers
    assert glob.glob(str(cache / ".tmp-*"))
    tokenizer = load_tokenizer(tokenizer_dir)
    data = tokenized(str(path), "text", tokenizer, show=False)
    assert not data.cached and data.documents == len(docs)
    np.testing.assert_array_equal(np.asarray(data.tokens), _reference(tokenizer, docs))
    assert not glob.glob(str(cache / ".tmp-*"))  # the killed build's leftovers removed by the next build


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
    ("no data workers", ["--data-workers", "0"], "--data-workers must be a positive integer"),
    ("invalid json line", ["--data", "{badjson}"],
     r"bad\.jsonl cannot be read as jsonl: line 2 column 9: Expecting ':'"),
])
def test_bad_text_inputs_are_one_line(tmp_path, cache, tokenizer_dir, case, extra, match):
    from autosp.compiler.train_cli import main

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(f'{{"text": "{d}"}}\n' for d in documents(5)))
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "d.csv").write_text("text\nw1\n")
    (tmp_path / "bad.jsonl").write_text('{"text": "w1"}\n{"text" "w2"}\n')
    argv = TINY_FLAGS + ["--sp", "1", "--ctx", "32", "--data", str(docs), "--tokenizer", tokenizer_dir]
    names = {"{empty}": str(tmp_path / "empty.jsonl"), "{csv}": str(tmp_path / "d.csv"), "{tmp}": str(tmp_path),
             "{docs}": str(docs), "{badjson}": str(tmp_path / "bad.jsonl")}
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
