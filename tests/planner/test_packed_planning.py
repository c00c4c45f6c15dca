"""Planning packed documents and sliding-window models: the request, the files, the plan and its table."""

import json

import pytest

from autosp.cost_models.catalog.models import model_from_hf_config, resolve_model
from autosp.cost_models.catalog.windows import sliding_layout
from autosp.errors import UsageError
from autosp.planner.api import plan_for
from autosp.planner.doc_lens import histogram_of, read_doc_lens
from autosp.planner.plan import plan_from_dict
from autosp.planner.cli.report import render
from autosp.planner.request import PlanRequest, resolve
from autosp.planner.search.space import SPACE_VERSION


def test_the_three_file_forms_give_one_histogram(tmp_path):
    text = tmp_path / "lengths.txt"
    text.write_text("# from the tokenizer\n900\n16000 16000\n\n40000  # a long one\n")
    listed = tmp_path / "lengths.json"
    listed.write_text(json.dumps([16000, 900, 40000, 16000]))
    hist = tmp_path / "hist.json"
    hist.write_text(json.dumps({"900": 1, "16000": 2, "40000": 1}))
    expected = ((900, 1), (16000, 2), (40000, 1))
    assert read_doc_lens(text) == read_doc_lens(listed) == read_doc_lens(hist) == expected
    assert histogram_of([[16000, 2], [900, 1], [40000, 1]]) == expected


def test_request_carries_documents_into_the_workload_and_the_key(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("16000\n")
    by_file = resolve(PlanRequest(model="llama", hw="h100x8", ctx="1M", doc_lens=str(path)))
    by_mean = resolve(PlanRequest(model="llama", hw="h100x8", ctx="1M", mean_doc_len="16k"))
    plain = resolve(PlanRequest(model="llama", hw="h100x8", ctx="1M"))
    assert by_file.workload.doc_lens == by_mean.workload.doc_lens == ((16_000, 1),)
    assert plain.workload.doc_lens == ()
    keys = [r.key_material(60, SPACE_VERSION) for r in (by_file, by_mean, plain)]
    assert keys[0]["workload"]["doc_lens"] == [[16_000, 1]] and "doc_lens" not in keys[2]["workload"]
    assert keys[0] != keys[2] and keys[1] != keys[2]
    json.dumps(keys[0])
    with pytest.raises(UsageError, match="not both"):
        PlanRequest(model="llama", hw="h100x8", ctx="1M", doc_lens=str(path), mean_doc_len=4096)


def _plan(hw="h100x2", **kw):
    return plan_for(PlanRequest(hw=hw, trials=10, top_k=1, **kw))


def test_a_packed_plan_shows_the_attention_saved_and_round_trips():
    packed = _plan(model="llama-3.2-1b", ctx="256k", mean_doc_len="16k")
    plain = _plan(model="llama-3.2-1b", ctx="256k")
    att = packed.search["attention"]
    assert att["fraction"] == pytest.approx(16_000 / 256_000) and att["documents"] == 1
    assert att["flops"] == pytest.approx(att["fraction"] * att["triangle_flops"])
    assert "attention" not in plain.search
    assert packed.estimate.tokens_per_second > 1.5 * plain.estimate.tokens_per_second
    table = " ".join(render(packed).split())
    assert "6.2% of the S×S causal triangle's FLOPs (documents of mean 16k tokens)" in table
    assert "attention " not in render(plain).split("Prediction")[1].split("Runner-ups")[0].replace("all-to-all", "")
    data = json.loads(packed.to_json())
    assert data["workload"]["doc_lens"] == [[16_000, 1]] and data["search"]["attention"]["fraction"] < 0.07
    again = plan_from_dict(data)
    assert again.workload == packed.workload and again.search["attention"] == att


def test_old_plans_without_document_or_window_fields_still_load():
    data = json.loads(_plan(model="llama-3.2-1b", ctx="16k").to_json())
    del data["workload"]["doc_lens"]
    for key in ("sliding_window", "sliding_layers"):
        del data["model"][key]
    plan = plan_from_dict(data)
    assert plan.workload.doc_lens == () and plan.model.sliding_window == 0


def test_a_sliding_window_model_is_planned_by_its_window():
    """Mistral-7B-v0.1 (4096-token window on every layer) at 64k: attention is the band, 12.1% of the
    triangle, and the plan is faster than the same widths without a window."""
    from dataclasses import replace

    mistral = resolve_model("mistral-7b-v0.1")
    windowed = _plan(model="mistral-7b-v0.1", ctx="64Ki")
    unwindowed = _plan(model=replace(mistral, sliding_window=0, sliding_layers=()), ctx="64Ki")
    S, W = 65_536, 4096
    assert windowed.search["attention"]["fraction"] == pytest.approx((2 * S * W - W * W) / S ** 2)
    assert windowed.model.sliding_window == W
    assert windowed.estimate.tokens_per_second > 1.5 * unwindowed.estimate.tokens_per_second
    table = " ".join(render(windowed).split())  # the row wraps
    assert "12.1% of the S×S causal triangle's FLOPs (a 4,096-token sliding window on every layer)" in table


def test_the_deepspeed_config_carries_documents_for_check(tmp_path):
    from autosp.planner.artifacts import load_artifact
    from autosp.planner.ds_config import deepspeed_config
    from autosp.planner.reprice import target_request

    plan = _plan(model="llama-3.2-1b", ctx="64k", mean_doc_len=4096)
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(deepspeed_config(plan)))
    art = load_artifact(str(ds))
    assert art.workload.doc_lens == ((4096, 1),)
    assert target_request(art).documents() == ((4096, 1),)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.to_json())
    assert target_request(load_artifact(str(plan_file))).documents() == ((4096, 1),)


@pytest.mark.parametrize("config,expected", [
    ({"model_type": "mistral", "sliding_window": 4096}, (4096, tuple(range(8)))),          # Mistral v0.1
    ({"model_type": "mistral", "sliding_window": None}, (0, ())),                           # Mistral v0.3
    ({"model_type": "llama"}, (0, ())),
    ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False}, (0, ())),  # Qwen2.5 as shipped
    ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 5},
     (4096, (5, 6, 7))),
    ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": True}, (0, ())),  # default 28 >= 8
    ({"model_type": "gemma2", "sliding_window": 4096}, (4096, (0, 2, 4, 6))),
    ({"model_type": "gemma3_text", "sliding_window": 512}, (512, (0, 1, 2, 3, 4, 6, 7))),
    ({"model_type": "cohere2", "sliding_window": 4096, "sliding_window_pattern": 4}, (4096, (0, 1, 2, 4, 5, 6))),
    ({"model_type": "x", "sliding_window": 128,
      "layer_types": ["full_attention", "sliding_attention"] * 4}, (128, (1, 3, 5, 7))),
])
def test_windowed_layers_follow_transformers_rules(config, expected):
    assert sliding_layout(config, 8) == expected


def test_a_config_json_with_a_window_gives_a_windowed_spec(tmp_path):
    config = {"model_type": "mistral", "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8,
              "num_hidden_layers": 2, "num_key_value_heads": 4, "vocab_size": 1000, "sliding_window": 64}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    spec = model_from_hf_config(path)
    assert (spec.sliding_window, spec.sliding_layers) == (64, (0, 1))
    path.write_text(json.dumps(dict(config, sliding_window="wide")))
    with pytest.raises(UsageError, match="sliding_window must be a positive integer"):
        model_from_hf_config(path)
