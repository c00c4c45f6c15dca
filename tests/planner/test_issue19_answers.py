"""Issue 19, items 5, 6, 7, 9, 10, 11 and 12 (planner side): each of them answered in one line, at its root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from autosp.errors import UsageError
from autosp.planner.api import plan_for
from autosp.planner.request import PlanRequest
from autosp.contract.plan import save_plan


def _plan_cmd(args, env=None, stdout=subprocess.PIPE):
    return subprocess.run([sys.executable, "-c", "import sys; from autosp.cli import plan_main; "
                                                 "sys.exit(plan_main(sys.argv[1:]))", *args],
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_item5_ctrl_c_during_the_optuna_search_is_one_line():
    """Ctrl-C while the Optuna trials run (raised from inside a trial, where Optuna logs failed trials): the one
    line "interrupted", exit 130, and none of Optuna's warning and traceback."""
    script = textwrap.dedent("""
        import sys
        from autosp.planner.search import evaluator
        calls = [0]
        real = evaluator.Evaluator.__call__
        def interrupted(self, cand, seq_len=None):
            calls[0] += 1
            if calls[0] == 3:
                raise KeyboardInterrupt
            return real(self, cand, seq_len)
        evaluator.Evaluator.__call__ = interrupted
        from autosp.cli import plan_main
        sys.exit(plan_main(["--model", "llama-3.1-8b", "--ctx", "1M", "--hw", "h100x8", "--no-cache"]))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 130, out.stderr
    assert out.stderr.strip() == "autosp-plan: interrupted", out.stderr


def test_item6_explain_and_check_share_one_validation(tmp_path):
    plan = plan_for(PlanRequest(model="llama-3.2-1b", ctx="16k", hw="h100x8", search="exhaustive"))
    path = tmp_path / "plan.json"
    save_plan(plan, str(path))
    data = json.loads(path.read_text())
    data["candidate"]["dp"] = 3  # edited by hand: 8 GPUs are not sp x 3
    path.write_text(json.dumps(data))
    explain = _plan_cmd(["explain", str(path)])
    check = _plan_cmd(["check", str(path), "--no-cache", "--json"])
    assert explain.returncode == 2 and check.returncode == 3
    reason = json.loads(check.stdout)["now"]["invalid_reason"]
    assert reason.startswith("sp x dp = ") and reason in explain.stderr and explain.stderr.count("\n") == 1


@pytest.mark.parametrize("text, needle", [
    ('base = "h100"\nmemory_gib = 81920\n', "memory_bytes = 8.796e+13 bytes (81,920 GiB) is outside the plausible"),
    ('base = "h100"\nintra_node_bandwidth = 450\n', "intra_node_bandwidth = 450 bytes/s"),
    ('base = "h100"\ninter_node_bandwidth = 50\n', "inter_node_bandwidth = 50 bytes/s"),
    ('base = "h100"\nhost_bandwidth = 64\n', "host_bandwidth = 64 bytes/s"),
    ('base = "h100"\nmemory_bandwidth = 3350\n', "memory_bandwidth = 3350 bytes/s"),
    ('base = "h100"\nintra_node_latency = 3\n', "intra_node_latency = 3 s"),
    ('base = "h100"\ninter_node_latency = 10\n', "inter_node_latency = 10 s"),
    ('base = "h100"\npeak_flops = 989\n', "peak_flops = 989 FLOP/s"),
    ('base = "h100"\nhost_memory_gib = 2097152\n', "host_memory_bytes = "),
])
def test_item7_every_cluster_figure_has_a_unit_check(tmp_path, text, needle):
    from autosp.cost_models.catalog.hardware import resolve_hardware

    path = tmp_path / "cluster.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as err:
        resolve_hardware(str(path))
    message = str(err.value)
    assert needle in message and "is the unit right?" in message and "plausible range" in message
    assert "\n" not in message


def test_item7_every_catalog_cluster_passes():
    from autosp.cost_models.catalog.hardware import list_hardware

    assert len(list_hardware()) >= 7  # each one validated on the way


CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 300,
          "max_position_embeddings": 65536, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu"}


@pytest.mark.slow  # one trace (torch, transformers): ~15 s
def test_item9_a_config_plan_is_named_after_the_path_given_now(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOSP_CACHE_DIR", str(tmp_path / "profiles"))
    paths = []
    for name in ("ex", "other"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(CONFIG))
        paths.append(str(tmp_path / name / "config.json"))
    cache = str(tmp_path / "plans.sqlite")
    first = plan_for(PlanRequest(model=paths[0], ctx="16k", hw="h100x8", search="fast"), cache=cache)
    # the same content: no new trace
    second = plan_for(PlanRequest(model=paths[1], ctx="16k", hw="h100x8", search="fast"), cache=cache)
    assert (first.model.name, second.model.name) == ("ex", "other")
    assert first.search["model_profile"] == second.search["model_profile"]  # one content-keyed profile
    from autosp.planner.sweep import plan_one

    row = plan_one(PlanRequest(model=paths[1], ctx="16k", hw="h100x8", search="fast"), cache)
    assert row["plan"] == second.candidate.short() and row["cache"] == "hit"
    # a plan made from a config records its path: explain needs no --model
    plan_path = tmp_path / "plan.json"
    save_plan(second, str(plan_path))
    explained = _plan_cmd(["explain", str(plan_path)], env={"AUTOSP_CACHE_DIR": str(tmp_path / "profiles")})
    assert explained.returncode == 0, explained.stderr


def test_item10_transient_trace_failures_are_never_cached(tmp_path, monkeypatch):
    from autosp.profiling import graph as graph_profile
    from autosp.planner import profile_fallback, profiles

    monkeypatch.setenv("AUTOSP_CACHE_DIR", str(tmp_path / "profiles"))
    config = tmp_path / "m" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(CONFIG))
    key = graph_profile.fingerprint(str(config))
    for error in (BrokenPipeError(32, "Broken pipe"), OSError(28, "No space left on device"), MemoryError(),
                  KeyboardInterrupt()):
        def failing(arg, error=error):
            raise error

        monkeypatch.setattr(profiles, "_load", failing)
        with pytest.raises(type(error)):
            profiles.resolve_model_and_profile(str(config))
        assert not (graph_profile.cache_dir() / f"{key}.failed.json").exists()
    # a deterministic verdict carries the judge's version: another autosp judges again
    record = {"fingerprint": key, "verdict": "fallback", "reason": "r", "message": "m",
              "transformers_available": profile_fallback.transformers_available(),
              "judge_version": profile_fallback.judge_version()}
    profile_fallback._write_record(record)
    assert profile_fallback.cached_verdict(key) is not None
    profile_fallback._write_record(dict(record, judge_version="0.0.0+old"))
    assert profile_fallback.cached_verdict(key) is None
    profile_fallback._write_record({k: v for k, v in record.items() if k != "judge_version"})
    assert profile_fallback.cached_verdict(key) is None


def test_item11_small_ones(tmp_path):
    from autosp.cost_models.catalog.hardware import resolve_hardware
    from autosp.contract.specs import Candidate

    with pytest.raises(ValueError, match="zero_stage must be"):
        Candidate(sp=8, zero_stage=True)
    with pytest.raises(UsageError, match="one cluster per plan"):
        resolve_hardware("h100x8,h200x8")
    with pytest.raises(UsageError) as err:
        resolve_hardware("h1000x8")
    assert str(err.value).count("'h100'") == 1
    assert resolve_hardware("h100x4", nodes=2).name == "h100x8(2x4)" != resolve_hardware("h100x8").name
    assert resolve_hardware("h100x8", nodes=2).name == "h100x16"
    a100 = _plan_cmd(["--model", "llama-3.2-1b", "--ctx", "8k", "--hw", "a100x8", "--no-cache", "--json"])
    assert a100.returncode == 0 and "means a100-40g" in a100.stderr and "a100-80g" in a100.stderr
    for url, needle in (("postgres://u@h/db", "write postgresql+psycopg://"), ("http://x/y", "not a database")):
        out = _plan_cmd(["--model", "llama", "--ctx", "8k", "--hw", "h100x8"], env={"AUTOSP_CACHE": url})
        assert out.returncode == 2 and needle in out.stderr and "$AUTOSP_CACHE" in out.stderr
    home = tmp_path / "no-such-home"
    out = _plan_cmd(["--model", "llama-3.2-1b", "--ctx", "8k", "--hw", "h100x8", "--json"],
                    env={"HOME": str(home), "XDG_CACHE_HOME": "", "AUTOSP_CACHE": "", "AUTOSP_CACHE_DIR": ""})
    # (a long temporary path may cut the end of the one-line warning: its start names the cause)
    assert out.returncode == 0 and not home.exists() and "the home directory" in out.stderr
    with open("/dev/full", "w") as full:
        out = _plan_cmd(["--model", "llama-3.2-1b", "--ctx", "8k", "--hw", "h100x8", "--no-cache"], stdout=full)
    assert out.returncode == 1 and "cannot write standard output: No space left" in out.stderr
    assert "bug" not in out.stderr and out.stderr.count("\n") == 1


def test_item11_a_pinned_micro_batch_gets_a_hint_that_holds():
    """The what-would-fit hint prices bigger clusters with the pins: it does not recede as the user follows it."""
    from autosp.errors import InfeasibleError

    with pytest.raises(InfeasibleError) as err:
        plan_for(PlanRequest(model="llama-3.2-1b", ctx="128k", hw="h100x8", search="fast", fix=["micro_batch=100000"]))
    assert "would fit" not in str(err.value) and "mb100000" in str(err.value)


def test_item11_tables_never_run_columns_together():
    from autosp.planner.cli.sweep_output import aligned

    rows = [["model", "GPUs"], ["/a/very/long/path/to/a/model/config.json", "8"], ["x", "123456"]]
    lines = aligned(rows, right={1})
    assert all("  " in line for line in lines) and lines[1].endswith("     8")


def test_item12_autosp_plan_uses_the_plan_cache(tmp_path, monkeypatch):
    import autosp

    monkeypatch.setenv("AUTOSP_CACHE", str(tmp_path / "plans.sqlite"))
    first = autosp.plan("llama-3.2-1b", "16k", "h100x2", search="exhaustive")
    again = autosp.plan("llama-3.2-1b", "16k", "h100x2", search="exhaustive")
    off = autosp.plan("llama-3.2-1b", "16k", "h100x2", search="exhaustive", cache=False)
    assert (first.search["cache"], again.search["cache"], off.search["cache"]) == ("miss", "hit", "off")
