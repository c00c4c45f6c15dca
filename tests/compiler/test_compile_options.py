"""``autosp.compile``'s signature (issue 36): the model, what runs (a plan, or ``sp_size=`` alone) and how it runs
(one :class:`~autosp.compiler.options.CompileOptions`). The knobs have one spelling, the Candidate's fields; the 21
keywords the function once took are refused in one line that names the call to write, and that call works."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path
from dataclasses import FrozenInstanceError, fields

import pytest

import autosp
from autosp.compiler.api import compile_model, resolve_candidate
from autosp.compiler.options import CompileOptions
from autosp.compiler.training.schedule import OptimizerOptions
from autosp.contract.specs import Candidate
from autosp.errors import UsageError

OPTION_FIELDS = ["optimizer", "optim", "lr_scheduler", "dtype", "backend", "ds_config", "gradient_clipping",
                 "ignore_index", "pad_token_id", "pad_to_multiple_of", "dist_backend", "z3_leaf_modules", "packed"]

FORMER_KEYWORDS = {  # compile_model's keywords before issue 36, beside model, plan and sp_size
    "ring_size": 2, "dp_size": 2, "zero_stage": 3, "micro_batch": 2, "grad_accum": 2, "offload_optimizer": True,
    "optimizer": None, "lr": 1e-3, "dtype": "bf16", "backend": "aot_eager", "ds_config": None, "ignore_index": -1,
    "pad_token_id": 0, "pad_to_multiple_of": 8, "dist_backend": "gloo", "z3_leaf_modules": None,
    "gradient_clipping": 0.5, "packed": True, "optim": None, "lr_scheduler": None, "ep_size": 2}


def test_compile_takes_the_model_a_plan_or_sp_size_and_options():
    compiled = inspect.signature(compile_model).parameters
    assert list(compiled) == ["model", "plan", "sp_size", "options"]
    assert [p.kind for p in compiled.values()][2:] == [inspect.Parameter.KEYWORD_ONLY] * 2
    facade = inspect.signature(autosp.compile).parameters
    assert list(facade)[:4] == ["model", "plan", "sp_size", "options"]
    assert len(FORMER_KEYWORDS) + 3 == 24  # model, plan, sp_size and these: the count issue 36 shrank to 4


def test_options_are_one_frozen_dataclass_with_a_default_and_a_docstring_per_field():
    options = CompileOptions()
    assert [f.name for f in fields(CompileOptions)] == OPTION_FIELDS
    assert (options.optim, options.dtype, options.backend, options.gradient_clipping, options.ignore_index,
            options.pad_to_multiple_of, options.packed) == (None, None, "inductor", None, -100, 1, False)
    source = inspect.getsource(CompileOptions)
    for name in OPTION_FIELDS:  # each field is followed by its docstring
        assert re.search(rf"\n    {name}: [^\n]*\n    \"\"\"", source), name
    with pytest.raises(FrozenInstanceError):
        options.dtype = "bf16"
    assert CompileOptions(z3_leaf_modules=["model.layers.0"]).z3_leaf_modules == ("model.layers.0",)
    assert autosp.CompileOptions is CompileOptions and autosp.Candidate is Candidate


@pytest.mark.parametrize("bad,words", [
    (dict(dtype="fp16"), "dtype must be one of bf16, fp32, got 'fp16'"),
    (dict(backend="eager"), "backend must be one of inductor, aot_eager"),
    (dict(optim={"lr": 1e-3}), "optim must be an autosp.OptimizerOptions"),
    (dict(optimizer="adamw"), "optimizer must be a torch optimizer or a callable"),
    (dict(lr_scheduler=3), "lr_scheduler must be a torch LR scheduler or a callable"),
    (dict(ds_config=[("zero_optimization", {})]), "ds_config must be a dict"),
    (dict(gradient_clipping=-1.0), "gradient_clipping must be a number >= 0"),
    (dict(gradient_clipping=float("nan")), "gradient_clipping must be a number >= 0"),
    (dict(ignore_index=True), "ignore_index must be an integer"),
    (dict(pad_token_id=-1), "pad_token_id must be a token id >= 0"),
    (dict(pad_to_multiple_of=0), "pad_to_multiple_of must be a positive integer"),
    (dict(dist_backend=""), "dist_backend must be a torch.distributed backend name"),
    (dict(z3_leaf_modules="model.layers"), "z3_leaf_modules must be a list of module names"),
    (dict(packed="yes"), "packed must be true or false"),
])
def test_a_bad_option_is_one_line(bad, words):
    with pytest.raises(UsageError) as err:
        CompileOptions(**bad)
    assert words in str(err.value) and "\n" not in str(err.value)


def _suggested(message: str, call: str):
    """The ``call(...)`` the message suggests, evaluated (nested parentheses included)."""
    start = message.index(call + "(")
    depth = 0
    for end in range(start + len(call), len(message)):
        depth += {"(": 1, ")": -1}.get(message[end], 0)
        if depth == 0:
            return eval(message[start:end + 1], {"autosp": autosp})  # noqa: S307 - our own message
    raise AssertionError(message)


def _refusal(*args, **kwargs) -> str:
    with pytest.raises(UsageError) as err:
        autosp.compile(None, *args, **kwargs)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_former_knob_keyword_names_the_candidate_to_pass():
    message = _refusal(sp_size=2, zero_stage=3)
    assert message.startswith("zero_stage= is a plan knob: pass plan=autosp.Candidate(sp=2, zero_stage=3)"), message
    message = _refusal(sp_size=2, ring_size=2, dp_size=2, ep_size=2, micro_batch=1, grad_accum=2)
    assert _suggested(message, "autosp.Candidate") == Candidate(sp=2, ring=2, dp=2, ep=2, micro_batch=1, grad_accum=2)
    plan = Candidate(sp=2)
    assert "plan=dataclasses.replace(plan, zero_stage=3)" in _refusal(plan, zero_stage=3)


def test_a_former_option_keyword_names_the_options_to_pass():
    message = _refusal(sp_size=2, lr=1e-3)
    assert message == "lr= is an option: pass options=autosp.CompileOptions(optim=autosp.OptimizerOptions(lr=0.001))"
    message = _refusal(plan="plan.json", dtype="bf16", backend="aot_eager", gradient_clipping=0.5, lr=1e-3)
    assert _suggested(message, "autosp.CompileOptions") == CompileOptions(
        dtype="bf16", backend="aot_eager", gradient_clipping=0.5, optim=OptimizerOptions(lr=1e-3))


@pytest.mark.parametrize("name", list(FORMER_KEYWORDS))
def test_every_former_keyword_is_answered(name):
    message = _refusal(sp_size=2, **{name: FORMER_KEYWORDS[name]})
    assert message.startswith(f"{name}= is a"), message
    assert ("plan=autosp.Candidate(" in message) != ("options=autosp.CompileOptions(" in message), message


def test_an_unknown_keyword_says_what_compile_takes():
    assert _refusal(sp_size=2, seq_len=4096) == ("autosp.compile has no seq_len=: it takes the model, plan= (or "
                                                 "sp_size=) and options=")


@pytest.mark.parametrize("sp,world", [(1, 1), (2, 2), (2, 4), (4, 8), (8, 8)])
def test_sp_size_alone_is_the_candidate_of_its_world(sp, world):
    assert resolve_candidate(None, sp, world) == (Candidate(sp=sp, dp=world // sp), None)
    assert resolve_candidate(Candidate(sp=sp, dp=world // sp), sp, world)[0] == Candidate(sp=sp, dp=world // sp)


def test_options_and_refusals_import_no_torch():
    code = ("import sys, autosp\n"
            "autosp.CompileOptions(dtype='bf16', optim=autosp.OptimizerOptions(lr=1e-3)); autosp.Candidate(sp=2)\n"
            "try:\n    autosp.compile(None, sp_size=2, zero_stage=3)\nexcept autosp.UsageError:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed', 'transformers')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_run_computes_in_the_plans_dtype_whether_the_plan_is_a_file_or_an_object(tmp_path):
    """A plan file's workload dtype is the default, as a Plan object's is (a path used to fall back to fp32)."""
    from autosp.compiler.api import run_dtype
    from autosp.contract.plan import load_plan

    path = tmp_path / "plan.json"
    done = subprocess.run([str(Path(sys.executable).with_name("autosp-plan")), "--model", "llama-3.2-1b", "--ctx", "8k",
                           "--hw", "h100x2", "--no-cache", "--plan-out", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert load_plan(path).workload.dtype == "bf16"
    assert run_dtype(str(path), None) == run_dtype(path, None) == run_dtype(load_plan(path), None) == "bf16"
    assert run_dtype(path, "fp32") == "fp32"  # the caller's CompileOptions(dtype=...) wins
    assert run_dtype(Candidate(sp=2), None) == "fp32"  # a Candidate carries no dtype
