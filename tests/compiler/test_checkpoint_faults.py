"""Faults around checkpoints and the launcher: kill -9 in the middle of a save leaves the previous checkpoint
loadable; SIGTERM and SIGKILL to ``autosp-train --nproc-per-node 2`` leave no rank alive after 10 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from autosp.compiler.testing import alive as _alive
from autosp.compiler.testing import child_pids as _children

SAVE_AND_DIE = r"""
import os, signal, sys
import torch, transformers
import autosp
from autosp.compiler.testing import free_port
from autosp.compiler.training import checkpoint, save_dir

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
directory = sys.argv[1]
config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa",
                                  use_cache=False)
torch.manual_seed(0)
options = autosp.CompileOptions(dtype="fp32", backend="aot_eager",
                                optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2))
engine = autosp.compile(transformers.LlamaForCausalLM(config), sp_size=1, options=options)
ids = torch.randint(0, 64, (1, 16))
for step in (1, 2):
    loss = engine(input_ids=ids, labels=ids)
    engine.backward(loss)
    engine.step()
    if step == 1:
        save_dir.write_latest(directory, engine.save_checkpoint(save_dir.step_dir(directory, 1)))
from torch.distributed.checkpoint import FileSystemWriter

class WriteThenDie(FileSystemWriter):  # the rank's data file of step 2 is on disk when the process is killed
    def write_data(self, plan, planner):
        super().write_data(plan, planner).wait()
        os.kill(os.getpid(), signal.SIGKILL)

checkpoint.storage_writer = WriteThenDie
engine.save_checkpoint(save_dir.step_dir(directory, 2))
"""


@pytest.mark.slow
def test_kill_9_during_a_save_leaves_the_previous_checkpoint(tmp_path):
    import transformers

    from autosp.compiler.training.checkpoint import read_meta
    from autosp.compiler.training.export import export_hf
    from autosp.compiler.training.save_dir import find_resume

    directory = str(tmp_path / "ckpt")
    os.makedirs(directory)
    proc = subprocess.run([sys.executable, "-c", SAVE_AND_DIE, directory], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    partial = os.path.join(directory, ".step-00000002.partial")
    assert "__0_0.distcp" in os.listdir(partial)  # the save was under way
    newest = find_resume(directory)
    assert newest == os.path.join(directory, "step-00000001")
    assert read_meta(newest)["step"] == 1
    hf = transformers.AutoModelForCausalLM.from_pretrained(export_hf(newest, str(tmp_path / "hf")))
    assert type(hf).__name__ == "LlamaForCausalLM"


def _launch(tmp_path):
    args = ["--model", "llama-3.2-1b", "--layers", "1", "--hidden", "32", "--heads", "4", "--kv-heads", "2",
            "--ffn", "64", "--vocab", "64", "--sp", "2", "--ctx", "32", "--dtype", "fp32", "--backend", "aot_eager",
            "--steps", "100000", "--nproc-per-node", "2"]
    launcher = subprocess.Popen([sys.executable, "-c", "import sys; from autosp.cli import train_main; "
                                 "sys.exit(train_main())", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.time() + 300
    ranks = []
    while time.time() < deadline and launcher.poll() is None:
        ranks = [pid for pid in _children(launcher.pid) if _spawned(pid)]
        if len(ranks) >= 2:
            break
        time.sleep(0.1)
    assert len(ranks) >= 2, "the ranks did not start"
    time.sleep(3)  # past the start of the ranks (their parent-death request), into torch's import
    return launcher, ranks


def _spawned(pid):
    """A rank: a multiprocessing spawn child (not its resource tracker)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"spawn_main" in f.read()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the ranks")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_no_rank_outlives_its_launcher(tmp_path, sig):
    launcher, ranks = _launch(tmp_path)
    launcher.send_signal(sig)
    start = time.time()
    while _alive(ranks) and time.time() < start + 10:
        time.sleep(0.1)
    assert not _alive(ranks), f"ranks {_alive(ranks)} alive 10 s after {sig.name} to the launcher"
    launcher.wait(timeout=60)
    if sig == signal.SIGTERM:
        assert launcher.returncode == 128 + signal.SIGTERM
