"""A config.json the graph tracer cannot profile is refused or priced loudly, never silently (issue 10, item 11).

Gemma-2 used to be planned with the Llama-block formulas without a word in the plan, with 10.16B
parameters instead of 9.24B (its config omits tie_word_embeddings, which Gemma ties by default), and was
traced again on every run. Its soft-capped attention runs outside SDPA in transformers, so it is now priced by
the formulas that describe it (cost_models/softcap.py; issue 22) without a trace; a fallback that is taken is
said in one line and recorded in the plan (shown here with the same config without soft-capping, which goes
through the trace).
"""

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from autosp.errors import UsageError
from autosp.cost_models.catalog.models import model_from_hf_config

GEMMA2_9B = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "attn_logit_softcapping": 50.0,
             "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
             "hidden_size": 3584, "intermediate_size": 14336, "max_position_embeddings": 8192,
             "num_attention_heads": 16, "num_hidden_layers": 42, "num_key_value_heads": 8,
             "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
             "vocab_size": 256000}  # google/gemma-2-9b config.json (no tie_word_embeddings key)
GEMMA2_UNCAPPED = {k: v for k, v in GEMMA2_9B.items() if "softcapping" not in k}
TINY_GEMMA2 = dict(GEMMA2_9B, head_dim=16, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                   num_hidden_layers=2, num_key_value_heads=2, vocab_size=97)


def _config(tmp_path, data, name="config.json"):
    path = tmp_path / "model" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(data))
    return str(path)


def test_gemma2_counts_its_tied_head_once(tmp_path):
    spec = model_from_hf_config(_config(tmp_path, GEMMA2_9B))
    assert spec.tied_embeddings and round(spec.n_params() / 1e9, 2) == 9.24


def _plan(config, tmp_path, *extra, block_transformers=False):
    code = ("import sys\n"
            + ("sys.modules['transformers'] = None\n" if block_transformers else "")
            + "from autosp.cli import plan_main\n"
              "rc = plan_main(sys.argv[1:])\n"
              "print('torch imported:', 'torch' in sys.modules, file=sys.stderr)\n"
              "sys.exit(rc)\n")
    return subprocess.run([sys.executable, "-c", code, "--model", config, "--ctx", "8k", "--hw", "h100x8", "--no-cache",
                           "--trials", "10", *extra], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, AUTOSP_CACHE_DIR=str(tmp_path / "cache")))


@pytest.mark.slow
def test_gemma2_is_planned_by_its_formulas_without_a_trace(tmp_path):
    config = _config(tmp_path, TINY_GEMMA2)
    out = _plan(config, tmp_path, "--json")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "tracing" not in out.stderr and out.stderr.strip().endswith("torch imported: False")
    plan = json.loads(out.stdout)
    assert plan["model"]["source"].startswith("analytic formulas (logit soft-capping, not traced)")
    assert plan["model"]["attn_logit_softcap"] == 50.0 and plan["model"]["final_logit_softcap"] == 30.0


def test_without_transformers_the_fallback_is_said_once_and_recorded_in_the_plan(tmp_path):
    config = _config(tmp_path, GEMMA2_UNCAPPED)
    out = _plan(config, tmp_path, "--json", block_transformers=True)
    assert out.returncode == 0, out.stderr
    said = [ln for ln in out.stderr.splitlines() if ln.startswith("autosp-plan:")]
    assert len(said) == 1 and "pip install -e '.[hf]'" in said[0] and "9.24B parameters" in said[0]
    plan = json.loads(out.stdout)
    assert plan["search"]["model_profile"].startswith("analytic fallback (transformers is not installed")
    assert plan["model"]["source"].startswith("analytic Llama-block formulas (fallback:")
    assert plan["model"]["tied_embeddings"] is True


def test_the_report_shows_the_fallback(tmp_path):
    out = _plan(_config(tmp_path, GEMMA2_UNCAPPED), tmp_path, block_transformers=True)
    assert out.returncode == 0, out.stderr
    assert "priced with the analytic Llama-block formulas: transformers is not installed" in out.stdout


@pytest.mark.slow
def test_formulas_that_miscount_the_parameters_are_refused(tmp_path, monkeypatch):
    """The judge builds the model on the meta device and compares its parameters with the formulas'."""
    from autosp.planner import profile_fallback

    monkeypatch.setenv("AUTOSP_CACHE_DIR", str(tmp_path / "cache"))
    config = _config(tmp_path, {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                                "vocab_size": 97, "tie_word_embeddings": False})
    parsed = model_from_hf_config(config)
    record = profile_fallback._judge(config, parsed, RuntimeError("trace failed"), "k1")
    assert record["verdict"] == "fallback" and record["n_params"] == parsed.n_params()
    wrong = profile_fallback._judge(config, replace(parsed, ffn_hidden=512), RuntimeError("trace failed"), "k2")
    assert wrong["verdict"] == "refuse" and "Llama-block formulas count" in wrong["message"]
    with pytest.raises(UsageError, match="Llama-block formulas count"):
        profile_fallback.fallback(config, replace(parsed, ffn_hidden=512), "k3", RuntimeError("trace failed"),
                                  say=lambda m: None)
