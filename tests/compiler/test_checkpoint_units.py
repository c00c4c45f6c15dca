"""Fast checks of the pieces around checkpoints: which checkpoint --resume takes, export names and configs,
the stop request's handling of repeated signals, and the model a config-made plan trains (issue 19 item 3)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import pytest

from autosp.errors import UsageError


def _checkpoint(save_dir, step, complete=True):
    path = os.path.join(save_dir, f"step-{step:08d}")
    os.makedirs(path)
    if complete:
        with open(os.path.join(path, "meta.json"), "w") as f:
            json.dump({}, f)
    return path


def test_resume_takes_the_newest_complete_checkpoint(tmp_path):
    from autosp.compiler.training.save_dir import find_resume, prune, write_latest

    d = str(tmp_path)
    with pytest.raises(UsageError, match="no complete checkpoint"):
        find_resume(d)
    four = _checkpoint(d, 4)
    write_latest(d, four)
    assert find_resume(d) == four
    eight = _checkpoint(d, 8)  # renamed into place, killed before `latest` was updated
    assert find_resume(d) == eight
    _checkpoint(d, 12, complete=False)  # no meta.json: its save was interrupted
    os.makedirs(os.path.join(d, ".step-00000016.partial"))
    assert find_resume(d) == eight
    prune(d, keep_last=1)
    assert sorted(os.listdir(d)) == ["latest", "step-00000008", "step-00000012"]


def test_reference_llama_names_and_config():
    from autosp.compiler.training.export import hf_config_for_reference, reference_name

    assert reference_name("model.layers.3.attn.q_proj.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert reference_name("model.layers.0.input_norm.weight") == "model.layers.0.input_layernorm.weight"
    assert reference_name("model.layers.1.post_attention_norm.weight") == \
        "model.layers.1.post_attention_layernorm.weight"
    assert reference_name("model.layers.1.mlp.up_proj.weight") == "model.layers.1.mlp.up_proj.weight"
    assert reference_name("lm_head.weight") == "lm_head.weight"
    spec = dict(name="t", n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, head_dim=8, ffn_hidden=64, vocab=96,
                gated_mlp=True, tied_embeddings=False, qkv_bias=True, rope_theta=5e5, max_position=0)
    assert hf_config_for_reference(spec, "float32")["model_type"] == "qwen2"  # q/k/v biases, no o_proj bias
    with pytest.raises(UsageError, match="GELU"):
        hf_config_for_reference({**spec, "gated_mlp": False}, "float32")


def test_a_repeated_signal_is_one_request_and_a_later_one_stops_now(monkeypatch):
    from autosp.compiler.training import signals

    stop = signals.StopRequest().install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # the same request delivered twice (launcher and scheduler)
        assert stop.agreed() and stop.name == "SIGTERM"
        killed = []
        monkeypatch.setattr(signals.os, "kill", lambda pid, sig: killed.append(sig))
        stop._at = time.monotonic() - signals.DUPLICATE_S - 1  # the user insists, later
        stop._handle(signal.SIGINT, None)
        assert killed == [signal.SIGINT] and signal.getsignal(signal.SIGINT) == signal.SIG_DFL
    finally:
        stop.uninstall()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_a_plan_made_from_a_config_trains_that_model(tmp_path):
    """Issue 19 item 3: the plan records its config.json, and autosp-train builds that model (not the reference
    Llama); a plan whose config is gone is one line."""
    from autosp.compiler import preflight
    from autosp.cost_models.catalog.models import model_from_hf_config

    config = {"model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100, "rms_norm_eps": 1e-5}
    path = tmp_path / "cfg" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    plan = argparse.Namespace(model=model_from_hf_config(str(path)))
    args = argparse.Namespace(model=None, **{field: None for field, _ in preflight.OVERRIDES})
    facts = preflight.model_facts(args, plan)
    assert facts.hf_path == str(path) and facts.hf_config["model_type"] == "mistral"
    path.unlink()
    with pytest.raises(UsageError, match="no longer exists"):
        preflight.model_facts(args, plan)


def test_the_checkpoint_names_the_tokenizer_the_text_was_tokenized_with(tmp_path):
    """Text data tokenized with the model directory's tokenizer (no --tokenizer): the checkpoint still names that
    directory, so an export carries the tokenizer files (the README walk-through loads them)."""
    import argparse

    from autosp.compiler.training.run_checkpoints import _tokenizer_used

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    loaded = argparse.Namespace(name_or_path=str(model_dir))
    assert _tokenizer_used(argparse.Namespace(tokenizer=None, _tokenizer=loaded)) == str(model_dir)
    assert _tokenizer_used(argparse.Namespace(tokenizer=str(model_dir))) == str(model_dir)
    assert _tokenizer_used(argparse.Namespace(tokenizer=None)) is None  # token files: no tokenizer


def test_a_directory_that_is_not_a_checkpoint_is_named_so(tmp_path):
    """Issue 36 item 6: autosp-export (and --resume, --checkpoint) on a directory that holds no checkpoint said it
    was "incomplete (its save was interrupted)"; only a directory a save began in is incomplete."""
    from autosp.cli import export_main
    from autosp.compiler.training.checkpoint import read_meta

    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("x")
    for directory in (empty, tmp_path / "notes"):
        with pytest.raises(UsageError, match="is not an autosp checkpoint") as info:
            read_meta(str(directory))
        assert "incomplete" not in str(info.value) and "\n" not in str(info.value)
    interrupted = tmp_path / "step-00000004"  # a save wrote DCP's files, then died before meta.json
    interrupted.mkdir()
    (interrupted / "__0_0.distcp").write_bytes(b"x")
    with pytest.raises(UsageError, match="incomplete"):
        read_meta(str(interrupted))
    assert export_main([str(empty), "--out", str(tmp_path / "hf")]) == 2
    assert not (tmp_path / "hf").exists()
