"""autosp-train checks everything it can before building anything (issue 10, items 6, 8 and 10).

An 8B plan launched on 2 processes used to build the model in both and be killed for memory a minute
later with no message; a directory as --data, token ids out of range, a float token file, --lr nan or an
unwritable --log-json failed only after the build (or trained silently). Now each is one line, printed
once, before torch is even imported where the check does not need it, and the world-size error says
which --nproc-per-node the plan needs.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autosp.cli import plan_main, train_main

TINY = ["--model", "llama-3.2-1b", "--layers", "1", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
        "--vocab", "97", "--sp", "1", "--ctx", "64", "--steps", "1", "--backend", "aot_eager", "--dtype", "fp32"]


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("autosp-train: error: "), err
    return err[0]


@pytest.fixture
def plan8(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert plan_main(["--model", "llama-3.2-1b", "--ctx", "8k", "--hw", "h100x8", "--no-cache", "--trials", "10",
                      "--plan-out", str(path)]) == 0
    capsys.readouterr()
    return path


def test_a_plan_on_the_wrong_number_of_processes_fails_before_torch_is_imported(plan8):
    code = ("import sys; from autosp.cli import train_main; rc = train_main(['--plan', sys.argv[1]]); "
            "print('torch imported:', 'torch' in sys.modules, file=sys.stderr); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, str(plan8)], capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")})
    assert out.returncode == 2, out.stderr
    error, imported = out.stderr.strip().splitlines()
    assert "needs 8 processes" in error and "--nproc-per-node 8" in error
    assert imported == "torch imported: False"


def test_under_a_launcher_only_rank_0_says_it_and_names_the_launch_to_use(plan8, capsys, monkeypatch):
    for rank in ("1", "0"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        assert train_main(["--plan", str(plan8)]) == 2
    error = _error(capsys)  # rank 1 printed nothing
    assert "needs 8 processes" in error and "torchrun --nproc-per-node 8" in error


@pytest.mark.parametrize("values, dtype, needle", [
    ([0.5] * 200, "float32", "float32 values"),       # item 10: used to train silently
    ([-1] + [1] * 199, "int64", "token id -1"),        # item 6: used to train silently
    ([500] + [1] * 199, "int64", "token id 500"),
])
def test_token_files_are_checked_before_building(tmp_path, capsys, values, dtype, needle):
    path = tmp_path / "tokens.npy"
    np.save(path, np.asarray(values, dtype=dtype))
    assert train_main([*TINY, "--data", str(path)]) == 2
    assert needle in _error(capsys)


@pytest.mark.parametrize("flag, value, needle", [
    ("--data", "DIR", "is a directory"), ("--lr", "nan", "--lr must be a positive finite"),
    ("--log-json", "FILE/log.jsonl", "Not a directory"), ("--log-json", "DIR", "is a directory"),
])
def test_bad_paths_and_numbers_fail_before_building(tmp_path, capsys, flag, value, needle):
    (tmp_path / "file").write_text("x")
    value = value.replace("DIR", str(tmp_path)).replace("FILE", str(tmp_path / "file"))
    assert train_main([*TINY, flag, value]) == 2
    assert needle in _error(capsys)


def test_heads_that_do_not_divide_over_sp_fail_before_building(capsys):
    argv = [a for a in TINY]
    argv[argv.index("--sp") + 1] = "2"
    assert train_main([*argv, "--nproc-per-node", "2", "--heads", "3", "--kv-heads", "3", "--hidden", "63"]) == 2
    assert "3 attention heads do not divide over 2" in _error(capsys)


@pytest.mark.slow
def test_nproc_per_node_starts_the_processes_itself(tmp_path):
    """The README's training command: no launcher, no activated venv (the console script by its path)."""
    log = tmp_path / "steps.jsonl"
    argv = [a for a in TINY]
    argv[argv.index("--sp") + 1] = "2"
    argv[argv.index("--steps") + 1] = "2"
    script = Path(sys.executable).with_name("autosp-train")
    out = subprocess.run([str(script), *argv, "--nproc-per-node", "2", "--log-json", str(log)], capture_output=True,
                         text=True, timeout=900, env={k: v for k, v in os.environ.items() if k != "RANK"})
    assert out.returncode == 0, out.stderr[-3000:]
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and all(s["loss"] > 0 for s in steps)
    assert out.stdout.count("autosp-train: llama-3.2-1b") == 1 and "world 2" in out.stdout


def test_a_plan_names_the_config_it_was_made_from_also_when_traced(tmp_path):
    """A config priced from its traced graph records ``graph profile <fp> of <path>``: autosp-train must still
    build THAT model (and find its tokenizer beside it), not autosp's reference Llama."""
    from autosp.compiler.preflight import _planned_config

    config = str(tmp_path / "config.json")
    assert _planned_config(config) == config
    assert _planned_config(f"graph profile 0123abcd of {config}") == config
    assert _planned_config(str(tmp_path)) == config  # a model directory
    assert _planned_config("https://huggingface.co/meta-llama/Llama-3.1-8B") is None  # a preset's source
    assert _planned_config("graph profile 0123abcd of relative/config.json") is None


@pytest.mark.parametrize("config, words", [
    ({"model_type": "jamba", "architectures": ["JambaForCausalLM"]}, "JambaForCausalLM is a hybrid model with"),
    ({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "is_encoder_decoder": True},
     "T5ForConditionalGeneration is an encoder-decoder"),
    ({"model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"], "vision_config": {}},
     "Qwen2_5_VLForConditionalGeneration is a vision-language"),
])
def test_unsupported_architectures_are_one_line_exit_2_before_building(tmp_path, capsys, config, words):
    # issue 22: the list autosp-plan and autosp.compile share (cost_models/architectures.py), named by architecture
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_size": 64, "num_hidden_layers": 2,
                                                      "num_attention_heads": 4, "intermediate_size": 128,
                                                      "vocab_size": 97}))
    assert train_main(["--model", str(tmp_path), "--sp", "1", "--ctx", "64", "--steps", "1", "--backend", "aot_eager",
                       "--dtype", "fp32"]) == 2
    assert words in _error(capsys)


def test_without_backend_a_run_compiles_as_its_plan_was_priced(tmp_path):
    """The plan's compile_backend prices an untiled loss (fused by Inductor, op by op otherwise): autosp-train without
    --backend compiles that way, so the memory it was planned for is the memory it uses."""
    import dataclasses

    from autosp.compiler.train_cli import build_parser, default_backend
    from autosp.planner.api import plan_for
    from autosp.planner.request import PlanRequest

    plan = plan_for(PlanRequest(model="llama-3.2-1b", ctx="4k", hw="h100", search="exhaustive"), cache=False)
    assert plan.workload.compile_backend == "inductor" and default_backend(plan) == "inductor"
    for priced, runs in (("aot_eager", "aot_eager"), ("eager", "aot_eager")):
        other = dataclasses.replace(plan, workload=dataclasses.replace(plan.workload, compile_backend=priced))
        assert default_backend(other) == runs
    assert default_backend(None) == "inductor"
    assert build_parser().parse_args(["--model", "llama-3.2-1b"]).backend is None  # resolved after the plan loads


def test_launch_flags_against_torchrun_and_deepspeed_environments(monkeypatch):
    """Under a launcher the environment decides (deepspeed names the per-node count LOCAL_SIZE, torchrun
    LOCAL_WORLD_SIZE); --nnodes/--node-rank that contradict it are one line; the ranks autosp-train starts get
    the launch flags removed."""
    from autosp.compiler.preflight import launch_from_env
    from autosp.compiler.train_launch import without_launch_flags
    from autosp.errors import UsageError

    monkeypatch.setenv("RANK", "9")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_SIZE", "8")  # the deepspeed launcher's
    launch = launch_from_env(None, nnodes=2, node_rank=1)
    assert (launch.world, launch.local_world, launch.nnodes, launch.launcher) == (16, 8, 2, "env")
    with pytest.raises(UsageError, match="--nnodes/--node-rank disagree"):
        launch_from_env(None, nnodes=4)
    monkeypatch.delenv("RANK")
    launch = launch_from_env(4, nnodes=2, node_rank=1, master_addr="node0", master_port=1234, rdzv_timeout=5)
    assert (launch.world, launch.rank, launch.local_world, launch.launcher) == (8, 4, 4, "spawn")
    assert launch.nodes.endpoint == "node0:1234" and launch.shape() == "--nnodes 2 x --nproc-per-node 4"
    assert launch_from_env(2, nnodes=1).nodes is None  # one node: as before, a free loopback port
    argv = ["--plan", "p.json", "--nnodes", "2", "--node-rank=1", "--nproc-per-node", "4", "--master-addr", "h",
            "--master-port=5", "--rdzv-timeout", "9", "--steps", "3"]
    assert without_launch_flags(argv) == ["--plan", "p.json", "--steps", "3"]
