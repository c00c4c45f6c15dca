"""The attention kernel a plan assumes: named in its JSON, pinned by --attention-kernel (and so in the cache key),
defaulting to the kernel the compiler runs on the accelerator."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autosp.errors import UsageError
from autosp.planner.api import plan_for
from autosp.planner.request import PlanRequest, resolve

SCRIPT = Path(sys.executable).with_name("autosp-plan")


def test_the_plan_json_names_its_kernel_and_the_flag_pins_it():
    base = ("--model", "mistral-7b", "--ctx", "8k", "--hw", "h100x2", "--no-cache", "--json")
    default = json.loads(subprocess.run([str(SCRIPT), *base], capture_output=True, text=True, check=True).stdout)
    pinned = json.loads(subprocess.run([str(SCRIPT), *base, "--attention-kernel", "flash2"], capture_output=True,
                                       text=True, check=True).stdout)
    assert default["hardware"]["attention_kernel"] == default["search"]["attention_kernel"] == "cudnn"
    assert pinned["hardware"]["attention_kernel"] == pinned["search"]["attention_kernel"] == "flash2"
    assert pinned["hardware"]["attention_efficiency"] < default["hardware"]["attention_efficiency"]
    bad = subprocess.run([str(SCRIPT), *base, "--attention-kernel", "flash3", "--hw", "a100-80gx2"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "flash3" in bad.stderr


def test_the_kernel_is_in_the_cache_key_and_in_the_price():
    a = resolve(PlanRequest(model="mistral-7b", ctx="8k", hw="h100x2"))
    b = resolve(PlanRequest(model="mistral-7b", ctx="8k", hw="h100x2", attention_kernel="flash3"))
    assert a.key_material(60, "v") != b.key_material(60, "v")
    fast = plan_for(PlanRequest(model="llama-3.1-8b", ctx="256k", hw="h100x8", attention_kernel="flash3"))
    slow = plan_for(PlanRequest(model="llama-3.1-8b", ctx="256k", hw="h100x8", attention_kernel="flash2"))
    assert fast.estimate.tokens_per_second > slow.estimate.tokens_per_second
    assert plan_for(PlanRequest(model="llama-3.1-8b", ctx="32k", hw="a100-80gx8")).hardware.attention_kernel == "flash2"
    with pytest.raises(UsageError, match="--attention-kernel"):
        PlanRequest(model="llama", ctx="8k", hw="h100", attention_kernel="fa9")
