"""autosp-plan end to end, as a user runs it: a real subprocess of the installed console script."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autosp.errors import EXIT_CODES
from autosp.contract.plan import plan_from_dict

SCRIPT = Path(sys.executable).with_name("autosp-plan")


def run(*args, tmp_path=None, env=None, **kw):
    full_env = dict(os.environ)
    if tmp_path is not None:
        full_env["AUTOSP_CACHE"] = str(tmp_path / "cache.sqlite")
    full_env.update(env or {})
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "autosp.planner.cli.main"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, env=full_env, timeout=300, **kw)


def test_main_command_prints_the_plan_and_its_evidence(tmp_path):
    out = run("--model", "llama", "--ctx", "200k", "--hw", "h100x8", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for needle in ("autosp plan: llama-3.1-8b (8.03B parameters) at 200k tokens (200,000)",
                   "sequence parallel (Ulysses)", "Memory per GPU", "parameters", "activations", "logits + loss",
                   "total", "step time", "tokens/s", "MFU", "Runner-ups", "Search", "cache miss"):
        assert needle in text, needle
    assert out.stderr == ""
    again = run("--model", "llama", "--ctx", "200000", "--hw", "h100x8", tmp_path=tmp_path)
    assert again.returncode == 0 and "cached plan" in again.stdout and "(cached)" in again.stdout
    # the cached plan is the same plan
    assert text.split("Search")[0].split("\n", 1)[1] == again.stdout.split("Search")[0].split("\n", 1)[1]


def test_json_round_trips_and_files_are_written(tmp_path):
    plan_path, ds_path = tmp_path / "out" / "plan.json", tmp_path / "ds.json"
    out = run("--model", "llama-3.1-8b", "--ctx", "128Ki", "--hw", "h100x8", "--json", "--no-cache",
              "--plan-out", str(plan_path), "--ds-config", str(ds_path))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)  # nothing but the JSON on stdout
    plan = plan_from_dict(data)
    assert json.loads(plan.to_json()) == data
    assert plan.workload.seq_len == 131_072 and plan.hardware.world_size == 8
    assert plan.search["cache"] == "off" and plan.search["evaluations"] > 0
    assert json.loads(plan_path.read_text()) == data
    ds = json.loads(ds_path.read_text())
    assert ds["train_micro_batch_size_per_gpu"] == plan.candidate.micro_batch
    assert ds["zero_optimization"]["stage"] == plan.candidate.zero_stage
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["ds.json", "plan.json"]  # no temp files


def test_planning_never_imports_torch_or_deepspeed(tmp_path):
    code = ("import sys; from autosp.cli import plan_main; "
            "rc = plan_main(['--model', 'llama', '--ctx', '200k', '--hw', 'h100x8', '--json', '--no-cache']); "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed', 'transformers')); "
            "print('HEAVY', heavy, file=sys.stderr); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stderr


@pytest.mark.parametrize("args,needle", [
    (("--model", "lama-3.1-8b", "--ctx", "200k", "--hw", "h100x8"), "llama"),     # suggests a close match
    (("--model", "llama", "--ctx", "200q", "--hw", "h100x8"), "--ctx"),
    (("--model", "llama", "--ctx", "0", "--hw", "h100x8"), "--ctx"),
    (("--model", "llama", "--ctx", "200k", "--hw", "h1000x8"), "h100"),
    (("--model", "llama", "--hw", "h100x8"), "--ctx"),
    (("--model", "/nonexistent/config.json", "--ctx", "200k", "--hw", "h100x8"), "config.json"),
    (("--model", "llama", "--ctx", "200k", "--hw", "h100x8", "--trials", "0"), "--trials"),
    (("--model", "llama", "--ctx", "200k", "--hw", "h100x8", "--objective", "fast"), "objective"),
    (("--model", "llama", "--ctx", "200k", "--hw", "h100x8", "--bogus"), "--bogus"),
    (("--model", "llama", "--ctx", "200k", "--hw", "h100x8", "--global-batch", "0"), "--global-batch"),
    (("--model", "llama", "--ctx", "200k", "--hw", "h100x8", "--cache", "a", "--no-cache"), "--no-cache"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, needle):
    plan_path = tmp_path / "plan.json"
    out = run(*args, "--plan-out", str(plan_path), tmp_path=tmp_path)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert out.stdout == ""
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("autosp-plan: error: ") and needle in out.stderr
    assert not plan_path.exists()


def test_output_path_that_is_a_directory_fails_before_searching(tmp_path):
    out = run("--model", "llama", "--ctx", "200k", "--hw", "h100x8", "--ds-config", str(tmp_path), "--no-cache")
    assert out.returncode == 2 and "is a directory" in out.stderr and out.stderr.count("\n") == 1


def test_impossible_request_exits_3_with_what_would_be_needed(tmp_path):
    plan_path = tmp_path / "plan.json"
    out = run("--model", "llama-3.1-405b", "--ctx", "10M", "--hw", "a100-40gx8", "--plan-out", str(plan_path),
              tmp_path=tmp_path)
    assert out.returncode == 3, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "needs" in out.stderr and "GiB per GPU" in out.stderr and "GPUs" in out.stderr
    assert not plan_path.exists() and out.stdout == ""


def test_help_teaches_grammar_and_exit_codes():
    out = run("--help")
    assert out.returncode == 0
    for needle in ("examples:", "autosp-plan --model llama --ctx 200k --hw h100x8", "128Ki = 131,072",
                   "hardware (--hw):", "h100x32", "exit codes:", "--allow-cross-node-sp", "--no-cache"):
        assert needle in out.stdout, needle
    for code, meaning in EXIT_CODES.items():
        assert f"{code}  {meaning}" in out.stdout


def test_catalog_listings():
    models = run("--list-models")
    assert models.returncode == 0 and "llama-3.1-8b" in models.stdout and "qwen2.5-72b" in models.stdout
    hw = run("--list-hardware")
    assert hw.returncode == 0 and "h100" in hw.stdout and "mi300x" in hw.stdout


def test_max_ctx_and_ascii_terminal(tmp_path):
    out = run("--model", "llama-3.2-1b", "--objective", "max-ctx", "--hw", "h100x8", "--no-cache",
              env={"PYTHONIOENCODING": "ascii"})
    assert out.returncode == 0, out.stderr
    assert "objective max-ctx" in out.stdout and "longest trainable context" in out.stdout
    assert "#" in out.stdout  # ASCII bars
