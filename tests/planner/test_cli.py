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


# --- --emit slurm / hostfile: the job that runs a plan on its nodes (issue 34 item 2) -------------------------

FAKE_SRUN = """#!/bin/bash
# stands in for Slurm's srun on one machine: runs its command as each node's task, with that node's SLURM_NODEID
while [[ $1 == --* ]]; do shift; done
for ((node = 0; node < SLURM_NNODES; node++)); do SLURM_NODEID=$node "$@" || exit $?; done
"""
FAKE_SCONTROL = """#!/bin/bash
[ "$1 $2" = "show hostnames" ] && printf 'gpu01\\ngpu02\\ngpu03\\ngpu04\\n'
"""


def _executable(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_emit_slurm_and_hostfile_write_a_job_that_runs_the_plan_on_every_node(tmp_path):
    job, hosts = tmp_path / "job.sbatch", tmp_path / "hosts"
    out = run("--model", "llama-3.1-8b", "--ctx", "4M", "--hw", "h100x32", "--no-cache", "--emit", "slurm", str(job),
              "--emit", "hostfile", str(hosts), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    plan_path = tmp_path / "job.plan.json"  # no --plan-out: the plan the job reads is written beside it
    plan = plan_from_dict(json.loads(plan_path.read_text()))
    world = plan.candidate.sp * plan.candidate.dp
    assert world == 32 and "job.plan.json" in out.stdout and "job.sbatch" in out.stdout
    script = job.read_text()
    assert subprocess.run(["bash", "-n", str(job)], capture_output=True).returncode == 0
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8", "#SBATCH --exclusive",
                 f"PLAN={plan_path}", "srun ", '--master-addr "$1"', '--node-rank "$SLURM_NODEID"'):
        assert line in script, line
    lead = int(script.split("#SBATCH --signal=TERM@")[1].split()[0])  # the step in progress and a save fit
    assert lead >= plan.estimate.time.step + 60 and lead % 60 == 0

    # run it as Slurm would on 4 nodes (srun and scontrol stand-ins): each node's autosp-train gets its rank
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "srun", FAKE_SRUN)
    _executable(bin_dir / "scontrol", FAKE_SCONTROL)
    capture = tmp_path / "argv.jsonl"
    train = _executable(tmp_path / "train", f"#!{sys.executable}\nimport json, os, sys\n"
                        "open(os.environ['CAPTURE'], 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_NNODES": "4",
           "SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_JOB_ID": "123456", "SLURM_CPUS_ON_NODE": "64",
           "AUTOSP_TRAIN": str(train), "CAPTURE": str(capture)}
    ran = subprocess.run(["bash", str(job), "--steps", "7", "--save-dir", "ckpt dir"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert ran.returncode == 0, ran.stderr
    from autosp.compiler.train_cli import build_parser

    nodes = [build_parser().parse_args(json.loads(line)) for line in capture.read_text().splitlines()]
    assert [a.node_rank for a in nodes] == [0, 1, 2, 3]
    for a in nodes:
        assert (a.nnodes, a.nproc_per_node, a.master_addr, a.master_port) == (4, 8, "gpu01", 20000 + 123456 % 20000)
        assert a.nnodes * a.nproc_per_node == world and a.plan == str(plan_path)
        assert (a.steps, a.save_dir) == (7, "ckpt dir")  # sbatch's arguments reach autosp-train intact

    from deepspeed.launcher.runner import _parse_hostfile  # the deepspeed launcher reads it as written

    text = hosts.read_text()
    assert _parse_hostfile(text.splitlines()) == {f"node-{i}": 8 for i in range(4)}
    assert f"deepspeed --hostfile {hosts}" in text and f"--plan {plan_path}" in text


@pytest.mark.parametrize("emit, needle", [
    (("slurm", "DIR"), "is a directory"),
    (("slurm", "/proc/autosp/job.sbatch"), "cannot write"),
    (("pbs", "OUT/job.pbs"), "unknown kind"),
    (("slurm", "OUT/plan.json"), "name the same file"),
])
def test_emit_refuses_a_bad_path_in_one_line_before_any_search(tmp_path, emit, needle):
    kind, path = emit[0], emit[1].replace("DIR", str(tmp_path)).replace("OUT", str(tmp_path / "out"))
    code = ("import sys; from autosp.cli import plan_main; rc = plan_main(sys.argv[1:]); "
            "print('SEARCHED', 'autosp.planner.api' in sys.modules, file=sys.stderr); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, "--model", "llama-3.1-8b", "--ctx", "4M", "--hw", "h100x32",
                          "--no-cache", "--emit", kind, path, "--plan-out", str(tmp_path / "out" / "plan.json")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    error, searched = out.stderr.strip().splitlines()
    assert error.startswith("autosp-plan: error: ") and needle in error and "Traceback" not in out.stderr
    assert searched == "SEARCHED False" and not (tmp_path / "out").exists()
