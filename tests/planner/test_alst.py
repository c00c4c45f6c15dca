"""``autosp-plan --backend alst``: the plan keeps to what ALST runs, the Accelerate config it writes is
accepted by Accelerate's own loader and its DeepSpeed config by DeepSpeed's parser (after the Trainer fills
the "auto" batch sizes), and the report says what autosp's own plan gains."""

from __future__ import annotations

import json

from autosp.cli import plan_main
from autosp.planner.alst import alst_sp_sizes


def test_sp_sizes_follow_deepspeeds_head_checks():
    assert alst_sp_sizes(32, 8, 8) == [8, 4, 2, 1]
    assert alst_sp_sizes(32, 8, 16) == [16, 8, 4, 2, 1]  # 16 kv-replicated: 16 % 8 == 0
    assert alst_sp_sizes(12, 4, 8) == [4, 2, 1]  # 8 does not divide 12 heads
    assert alst_sp_sizes(28, 4, 8) == [4, 2, 1]  # Qwen2.5-7B-like: 28 heads


def test_alst_plan_accelerate_config_and_sft_arguments(tmp_path, capsys):
    from accelerate.commands.config.config_args import load_config_from_file
    from deepspeed.runtime.config import DeepSpeedConfig
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    acc, sft = tmp_path / "acc.yaml", tmp_path / "sft.json"
    code = plan_main(["--model", "llama", "--ctx", "32k", "--hw", "h100x8", "--no-cache", "--backend", "alst",
                      "--accelerate-config", str(acc), "--sft-args", str(sft), "--plan-out", str(tmp_path / "p.json")])
    assert code == 0
    out = capsys.readouterr().out
    assert "autosp's own plan:" in out
    plan = json.loads((tmp_path / "p.json").read_text())
    c = plan["candidate"]
    assert c["ring"] == 1 and c["sequence_chunks"] == 1 and c["mlp_chunks"] == 1 and c["loss_chunks"] == 1
    assert c["overlap"] == "none" and not c["offload_activations"] and c["checkpointing"] in ("none", "full")
    assert 32 % c["sp"] == 0  # Llama-3.1-8B: 32 heads, 8 KV heads

    loaded = load_config_from_file(str(acc))  # Accelerate's own loader (ClusterConfig)
    assert loaded.distributed_type == "DEEPSPEED" and loaded.num_processes == 8
    assert loaded.parallelism_config["parallelism_config_sp_backend"] == "deepspeed"
    assert loaded.parallelism_config["parallelism_config_sp_size"] == c["sp"]
    assert loaded.parallelism_config["parallelism_config_dp_shard_size"] * c["sp"] == 8

    args = json.loads(sft.read_text())
    assert args["per_device_train_batch_size"] == c["micro_batch"] and args["pad_to_multiple_of"] == c["sp"]
    ds_file = loaded.deepspeed_config["deepspeed_config_file"]
    hf = HfTrainerDeepSpeedConfig(ds_file)  # what the Trainer does with it: fill the "auto" values
    hf.trainer_config_process(TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                                per_device_train_batch_size=args["per_device_train_batch_size"],
                                                gradient_accumulation_steps=args["gradient_accumulation_steps"],
                                                bf16=False))
    config = hf.config
    assert "auto" not in json.dumps({k: v for k, v in config.items() if k != "zero_optimization"})
    assert DeepSpeedConfig(config).zero_optimization_stage == c["zero_stage"]


def test_max_ctx_gain_and_refusals(tmp_path, capsys):
    assert plan_main(["--model", "llama", "--hw", "h100x8", "--objective", "max-ctx", "--no-cache",
                      "--backend", "alst"]) == 0
    assert "longer context" in capsys.readouterr().out
    for argv, message in ((["--accelerate-config", str(tmp_path / "a")], "add --backend alst"),
                          (["--backend", "alst", "--fix", "ring=2"], "is not something ALST can run")):
        assert plan_main(["--model", "llama", "--ctx", "32k", "--hw", "h100x8", "--no-cache", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "a").exists()


def test_a_policy_under_which_nothing_fits_does_not_end_the_search(tmp_path, capsys):
    """Llama-3.1-8B at 128k tokens on h100x8: with ALST's knobs and checkpointing none nothing fits (103.4 GiB
    per GPU), with full checkpointing a plan does; the search goes on to it. At 1M tokens nothing ALST can run
    fits: exit 3 with the leanest ALST plan and the cluster it would need, and nothing written."""
    acc, out = tmp_path / "acc.yaml", tmp_path / "p.json"
    common = ["--model", "llama-3.1-8b", "--hw", "h100x8", "--no-cache", "--backend", "alst"]
    assert plan_main([*common, "--ctx", "128k", "--accelerate-config", str(acc), "--plan-out", str(out)]) == 0
    capsys.readouterr()
    plan = json.loads(out.read_text())
    assert plan["candidate"]["checkpointing"] == "full" and acc.exists()
    memory = sum(plan["estimate"]["memory"].values())
    assert memory <= plan["estimate"]["capacity_bytes"]
    assert plan["candidate"]["sp"] in alst_sp_sizes(32, 8, 8)

    far = tmp_path / "far.yaml"
    assert plan_main([*common, "--ctx", "1m", "--accelerate-config", str(far)]) == 3
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "--backend alst: no plan fits" in err and "ckpt:full" in err and "needs" in err
    assert "(--nodes 2)" in err and "autosp's own plan fits" in err
    assert not far.exists() and not far.with_suffix(".deepspeed.json").exists()
    assert plan_main([*common, "--ctx", "1m", "--nodes", "2"]) == 0  # the cluster the error named fits
