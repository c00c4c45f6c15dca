"""``autosp-plan explain``: one configuration priced as given, in the plan table, with why it fits or does not."""

import contextlib
import io
import json

from autosp import cli
from autosp.planner.api import plan_for
from autosp.contract.plan import load_plan
from autosp.planner.request import PlanRequest

TARGET = ["--model", "llama-3.1-8b", "--ctx", "128k", "--hw", "h100x8"]


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.plan_main(["explain", *argv])
    return code, out.getvalue(), err.getvalue()


def test_a_configuration_that_fits_is_priced_as_given():
    code, out, err = _run([*TARGET, "--fix", "sp=8", "--fix", "zero_stage=3", "--fix", "checkpointing=full",
                           "--fix", "loss_chunks=4"])
    assert code == 0, err
    for needle in ("sp = 8   (dp = 1, 8 GPUs)", "ZeRO stage                    3", "activation checkpointing      full",
                   "logits+loss tiling            4 chunks", "Memory per GPU", "step time", "Verdict  fits:",
                   "Search   none: this configuration priced as given", "Given    checkpointing=full loss_chunks=4"):
        assert needle in out, needle


def test_one_that_does_not_fit_says_by_how_much_and_exits_3(tmp_path):
    plan_out = tmp_path / "p.json"
    code, out, err = _run(["--model", "llama-3.1-8b", "--ctx", "1M", "--hw", "h100x8", "--fix", "sp=8",
                           "--plan-out", str(plan_out)])
    assert code == 3 and err == ""
    assert "Verdict  does not fit: needs" in out and "the largest part is activations" in out
    assert "Not written" in out and not plan_out.exists()


def test_the_json_is_the_plan_of_exactly_those_knobs():
    code, out, _ = _run(["--model", "llama-3.1-8b", "--ctx", "16k", "--hw", "h100x8", "--fix", "dp=2", "--fix",
                         "offload_optimizer=true", "--fix", "zero_stage=1", "--json"])
    cand = json.loads(out)["candidate"]
    assert code == 0
    assert (cand["sp"], cand["dp"], cand["zero_stage"], cand["offload_optimizer"], cand["checkpointing"]) == \
        (4, 2, 1, True, "none")


def test_a_plan_file_is_repriced_and_can_be_changed(tmp_path):
    path = tmp_path / "plan.json"
    plan = plan_for(PlanRequest(model="llama-3.1-8b", ctx="128k", hw="h100x8", search="fast"))
    path.write_text(plan.to_json())
    code, out, _ = _run([str(path), "--json"])
    again = json.loads(out)
    assert code == 0 and again["candidate"] == json.loads(plan.to_json())["candidate"]
    assert again["estimate"]["tokens_per_second"] == plan.estimate.tokens_per_second
    code, out, _ = _run([str(path), "--fix", "zero_stage=3", "--fix", "micro_batch=1", "--json"])
    assert code in (0, 3) and json.loads(out)["candidate"]["zero_stage"] == 3
    out_path = tmp_path / "out.json"
    code, _, _ = _run([str(path), "--plan-out", str(out_path)])
    assert code == 0 and load_plan(out_path).candidate == plan.candidate


def test_invalid_configurations_are_one_line_exit_2():
    for argv, needle in (([*TARGET], "give the SP degree"),
                         ([*TARGET, "--fix", "sp=1", "--fix", "overlap=kv_async"], "needs an all-to-all"),
                         ([*TARGET, "--fix", "sp=3"], "sp x dp"),
                         ([*TARGET, "--fix", "sp=8", "--fix", "offload_activations=true"], "checkpointing policy"),
                         (["--model", "llama", "--fix", "sp=8"], "missing --ctx, --hw")):
        code, out, err = _run(argv)
        assert code == 2 and out == "" and needle in err, (argv, err)
