"""The examples/ scripts run as written: each launched with torchrun on 2 CPU processes, the tiny model built
from docs/examples/tiny-llama/config.json, one optimizer step; the Trainer example's saved model loads with
from_pretrained."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _torchrun(script: str, out: Path) -> None:
    from autosp.compiler.testing import free_port

    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(free_port()), str(ROOT / "examples" / script), "--steps", "1", "--seq", "48", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"


def test_examples_run_as_written(tmp_path):
    from transformers import AutoModelForCausalLM

    for script in ("hf_trainer.py", "sft_packed.py", "lora.py"):
        _torchrun(script, tmp_path / script)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf_trainer.py")
    assert model.config.num_hidden_layers == 2
    assert (tmp_path / "lora.py" / "adapter_config.json").exists()
