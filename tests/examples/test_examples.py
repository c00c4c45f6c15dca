"""The examples/ scripts run as written: each launched from the checkout with torchrun on 2 CPU processes, the
tiny model built from docs/examples/tiny-llama/config.json, one optimizer step; the Trainer example's saved
model loads with from_pretrained. They write nothing into the checkout: the model goes to ``--output-dir``,
by default a folder of the system's temporary one (``$TMPDIR``), which the script prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _torchrun(script: str, tmp: Path, *extra: str) -> str:
    """Run ``examples/SCRIPT`` from the checkout as the README does, with ``$TMPDIR`` at ``tmp``; its stdout."""
    from autosp.compiler.testing import free_port

    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(tmp)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(free_port()), f"examples/{script}", "--steps", "1", "--seq", "48", *extra]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done.stdout


def _checkout_files() -> set[str]:
    """The checkout's top-level entries and the examples folder's files (bytecode caches aside)."""
    return {p.name for p in ROOT.iterdir()} | {f"examples/{p.name}" for p in (ROOT / "examples").iterdir()
                                               if p.name != "__pycache__"}


def test_examples_run_as_written_and_write_nothing_into_the_checkout(tmp_path):
    from transformers import AutoModelForCausalLM

    before = _checkout_files()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    saved = tmp / "autosp-examples" / "hf_trainer"  # the default output folder
    assert f"saved the trained model to {saved}" in _torchrun("hf_trainer.py", tmp)
    for script in ("sft_packed.py", "lora.py"):
        _torchrun(script, tmp, "--output-dir", str(tmp_path / script))
    model = AutoModelForCausalLM.from_pretrained(saved)
    assert model.config.num_hidden_layers == 2
    assert (tmp_path / "lora.py" / "adapter_config.json").exists()
    assert _checkout_files() == before  # no example-out/ (or anything else) left beside the code
