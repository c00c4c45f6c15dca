"""autosp-train --save-dir / --resume / --export-hf and autosp-export, as a user runs them (2 gloo processes).

One uninterrupted run (SP=2, ZeRO-1, micro-batch 2, 8 steps, --save-every 4 --async-save: step 4 is written in
the background while steps 5-8 train) on packed text documents (a .jsonl tokenized with a tokenizer made here)
with a cosine schedule after 2 warm-up steps is the reference for everything else:

- the same run stopped by SIGTERM to its launcher after step 4 exits 0 with one line naming --resume, no rank
  outlives the launcher by 10 s, and ``--resume`` gives the losses of the remaining steps (<= 1e-6 relative);
- its step-4 checkpoint resumed as SP=1 x DP=2 at ZeRO-0 and as SP=2 at ZeRO-3 (the same 2 sequences per step)
  gives steps 5-8 within 1e-6 (a ring: test_checkpoint_api.py);
- ``autosp-export`` of its save directory and ``--export-hf`` at the end of the ZeRO-3 run load with
  ``from_pretrained``;
- bad checkpoint input is one line and exit 2 before anything is built, and nothing is overwritten.

The checkpoint carries the LR scheduler's state: a resumed cosine schedule that restarted would change the losses.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from autosp.compiler.testing import alive as _alive
from autosp.compiler.testing import child_pids as _children

VOCAB = 96  # the test tokenizer's 93 tokens fit


def _write_docs(path, docs):
    with open(path, "w") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs)


def _setup(tmp):
    import transformers

    from text_fixtures import documents, make_tokenizer

    tokenizer = make_tokenizer(os.path.join(tmp, "tok"))
    eos = transformers.AutoTokenizer.from_pretrained(tokenizer).eos_token_id
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      eos_token_id=eos)
    model_dir = os.path.join(tmp, "tiny-llama")
    config.save_pretrained(model_dir)
    _write_docs(os.path.join(tmp, "docs.jsonl"), documents(300, seed=0, longest=60))
    return model_dir


def _common(tmp, model_dir):
    return ["--model", model_dir, "--ctx", "64", "--dtype", "fp32", "--backend", "aot_eager", "--lr", "1e-2",
            "--data", os.path.join(tmp, "docs.jsonl"), "--tokenizer", os.path.join(tmp, "tok"),
            "--lr-schedule", "cosine", "--warmup", "2", "--steps", "8"]


def _cmd(*args):
    return [sys.executable, "-c", "import sys; from autosp.cli import train_main; sys.exit(train_main())", *args]


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1")  # with the test's AUTOSP_DATA_CACHE


def _run(*args):
    proc = subprocess.run(_cmd(*args), capture_output=True, text=True, env=_env(), timeout=900)
    return proc


def _losses(path):
    with open(path) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


def _rel(a, b):
    return abs(a - b) / abs(b)


def _one_line_exit_2(proc):
    lines = [line for line in proc.stderr.splitlines() if line.startswith("autosp-train")]
    return proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-600:]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the ranks")
def test_kill_resume_other_plans_and_export(tmp_path, monkeypatch):
    tmp = str(tmp_path)
    monkeypatch.setenv("AUTOSP_DATA_CACHE", f"{tmp}/token-cache")  # the runs share one tokenization
    model_dir = _setup(tmp)
    common = _common(tmp, model_dir)
    sp2 = ["--nproc-per-node", "2", "--sp", "2", "--zero", "1", "--micro-batch", "2"]

    full = _run(*common, *sp2, "--save-dir", f"{tmp}/full", "--save-every", "4", "--async-save",
                "--log-json", f"{tmp}/full.jsonl")
    assert full.returncode == 0, full.stderr[-2000:]
    reference = _losses(f"{tmp}/full.jsonl")
    assert sorted(reference) == list(range(1, 9))
    assert sorted(os.listdir(f"{tmp}/full")) == ["latest", "step-00000004", "step-00000008"]

    # SIGTERM to the launcher once step 4 is logged: the ranks finish their step, save, exit 0
    log = f"{tmp}/stopped.jsonl"
    # output to files, not pipes: unread pipes that fill up would block the ranks
    with open(f"{tmp}/stopped.out", "w") as stdout, open(f"{tmp}/stopped.err", "w") as stderr:
        launcher = subprocess.Popen(_cmd(*common, *sp2, "--save-dir", f"{tmp}/stopped", "--save-every", "4",
                                         "--log-json", log), stdout=stdout, stderr=stderr, env=_env())
    while launcher.poll() is None and not (os.path.exists(log) and max(_losses(log), default=0) >= 4):
        time.sleep(0.01)  # (no deadline: pytest's own timeout, if any, ends a run that hangs)
    ranks = _children(launcher.pid)
    launcher.send_signal(signal.SIGTERM)
    launcher.wait(timeout=600)
    end = time.time()
    with open(f"{tmp}/stopped.out") as f_out, open(f"{tmp}/stopped.err") as f_err:
        out, err = f_out.read(), f_err.read()
    while _alive(ranks) and time.time() < end + 10:
        time.sleep(0.1)
    assert not _alive(ranks), "ranks outlived their launcher"
    assert launcher.returncode == 0, err[-2000:]
    stopped_at = max(_losses(log))
    assert 4 <= stopped_at < 8, f"stopped after step {stopped_at}: the run finished before the signal"
    assert f"stopped by SIGTERM after step {stopped_at}" in out and "--resume" in out
    resumed = _run(*common, *sp2, "--save-dir", f"{tmp}/stopped", "--resume", "--log-json", f"{tmp}/resumed.jsonl")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    losses = _losses(f"{tmp}/resumed.jsonl")
    assert sorted(losses) == list(range(stopped_at + 1, 9))
    assert max(_rel(losses[s], reference[s]) for s in losses) <= 1e-6

    # the step-4 checkpoint under other plans (same 2 sequences per step)
    # (SP=2 with --ring 2 is resumed through the Python API in test_checkpoint_api.py, in one spawned job)
    plans = {"dp2": ["--nproc-per-node", "2", "--sp", "1", "--zero", "0", "--micro-batch", "1"],
             "zero3": [*sp2[:4], "--zero", "3", "--micro-batch", "2", "--export-hf", f"{tmp}/hf-zero3"]}
    for name, plan in plans.items():
        os.makedirs(f"{tmp}/{name}")
        shutil.copytree(f"{tmp}/full/step-00000004", f"{tmp}/{name}/step-00000004")
        run = _run(*common, *plan, "--save-dir", f"{tmp}/{name}", "--resume", "--log-json", f"{tmp}/{name}.jsonl")
        assert run.returncode == 0, (name, run.stderr[-2000:])
        losses = _losses(f"{tmp}/{name}.jsonl")
        assert sorted(losses) == [5, 6, 7, 8], name
        assert max(_rel(losses[s], reference[s]) for s in losses) <= 1e-6, (name, losses, reference)

    # exports load with transformers; --export-hf (ZeRO-3 run) and autosp-export (of a ZeRO-1 save dir)
    import torch
    import transformers

    export = subprocess.run([sys.executable, "-c", "import sys; from autosp.cli import export_main; "
                             "sys.exit(export_main())", f"{tmp}/full", "--out", f"{tmp}/hf-full"],
                            capture_output=True, text=True, env=_env(), timeout=600)
    assert export.returncode == 0, export.stderr
    a = transformers.AutoModelForCausalLM.from_pretrained(f"{tmp}/hf-full")
    b = transformers.AutoModelForCausalLM.from_pretrained(f"{tmp}/hf-zero3")
    assert type(a).__name__ == "LlamaForCausalLM"
    # the ZeRO-3 run trained steps 5-8 from the same checkpoint as the full run: (nearly) the same weights
    diff = max((pa - pb).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters()))
    assert diff < 1e-4
    # exporting again into the same directory is refused: through the console script's own function in this
    # process (as tests/project/test_bad_inputs.py runs its cases), not a third interpreter importing torch
    from autosp.cli import export_main

    with contextlib.redirect_stderr(io.StringIO()) as again:
        code = export_main([f"{tmp}/full", "--out", f"{tmp}/hf-full"])
    assert code == 2 and "not empty" in again.getvalue(), again.getvalue()

    # bad checkpoint input: one line, exit 2, before anything is built; nothing overwritten
    _bad_inputs(tmp, common, sp2, torch)


def _bad_inputs(tmp, common, sp2, torch):
    from autosp.compiler.train_cli import main
    from autosp.errors import UsageError

    def refused(*args, match):
        before = {p: os.path.getmtime(os.path.join(r, p)) for r, _, fs in os.walk(f"{tmp}/full") for p in fs}
        with pytest.raises(UsageError, match=match) as info:
            main([*common, *sp2, *args])
        assert "\n" not in str(info.value)
        after = {p: os.path.getmtime(os.path.join(r, p)) for r, _, fs in os.walk(f"{tmp}/full") for p in fs}
        assert before == after

    os.makedirs(f"{tmp}/empty")
    refused("--save-dir", f"{tmp}/empty", "--resume", match="no complete checkpoint")
    refused("--save-dir", f"{tmp}/nowhere", "--resume", match="does not exist")
    corrupt = f"{tmp}/corrupt"
    shutil.copytree(f"{tmp}/full", corrupt)
    with open(f"{corrupt}/step-00000008/__0_0.distcp", "r+b") as f:
        f.truncate(100)
    refused("--save-dir", corrupt, "--resume", match="corrupt")
    with open(f"{corrupt}/step-00000008/meta.json", "w") as f:
        f.write("{not json")
    refused("--save-dir", corrupt, "--resume", match="corrupt")
    refused("--save-dir", f"{tmp}/full", "--resume", "--vocab", "128", match="vocabulary")
    refused("--save-dir", f"{tmp}/full", "--resume", "--layers", "3", match="another model")
    refused("--save-dir", f"{tmp}/full", "--resume", "--seed", "5", match="seed")
    from text_fixtures import documents

    _write_docs(f"{tmp}/other.jsonl", documents(301, seed=0, longest=60))
    refused("--save-dir", f"{tmp}/full", "--resume", "--data", f"{tmp}/other.jsonl", match="trained on")
    with open(f"{tmp}/a-file", "w") as f:
        f.write("x")
    refused("--save-dir", f"{tmp}/a-file/sub", match="not writable")
    refused("--save-dir", f"{tmp}/a-file", match="not a directory")
    refused("--save-every", "2", match="needs --save-dir")
    refused("--async-save", match="needs --save-dir")
    refused("--checkpoint", f"{tmp}/empty", match="holds no model weights")
    refused("--export-hf", f"{tmp}/full", match="not empty")
    import autosp.compiler.training.save_dir as save_dir
    import shutil as shutil_module

    real = shutil_module.disk_usage
    save_dir.shutil.disk_usage = lambda path: real(path)._replace(free=1000)
    try:
        refused("--save-dir", f"{tmp}/roomless", match="GiB free")
    finally:
        save_dir.shutil.disk_usage = real
