"""engine.save_checkpoint / load_checkpoint and autosp-export, through the Python API on 2 gloo processes.

One spawned run: tiny Hugging Face Llama and Qwen2 and the reference Llama trained 2 steps at ZeRO-0 and ZeRO-3,
saved (DCP's layout: ``.metadata`` and one ``__R_0.distcp`` per rank), exported to a Hugging Face directory;
``from_pretrained`` gives the engine's loss on a batch (fp32, 1e-5). Checkpoints loaded into engines under other
plans continue with the losses of the uninterrupted run (<= 1e-6 relative): SP=2 ZeRO-0 (saved asynchronously
while the run went on) into SP=2 ring 2 ZeRO-3 and SP=1 x DP=2 ZeRO-1, SP=2 ZeRO-3 into SP=1 x DP=2 ZeRO-0, bf16
ZeRO-0 (fp32 master copies beside the parameters) into bf16 ZeRO-3. A
checkpoint of format version 1 (safetensors, what autosp wrote before DCP) loads and continues a plain torch run.
A full disk (a rank's writes fail with ENOSPC) is one error on every rank, nothing published, the earlier
checkpoint intact.
"""

from __future__ import annotations

import errno
import os

import pytest

from autosp.contract.specs import Candidate

TOL = 1e-5
RESUME_TOL = 1e-6
SEQ = 32


def _hf_model(family: str, seed: int):
    import torch
    import transformers

    config_cls, model_cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                             "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[family]
    config = config_cls(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa",
                        use_cache=False)
    torch.manual_seed(seed)
    return model_cls(config)


def _reference_model(seed: int):
    import torch

    from autosp.compiler.models import Llama
    from autosp.contract.specs import ModelSpec

    torch.manual_seed(seed)
    return Llama.from_spec(ModelSpec(name="tiny", n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, head_dim=8,
                                     ffn_hidden=64, vocab=96))


def _batches(n, rows=2, vocab=96):
    import torch

    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab, (rows, SEQ), generator=gen) for _ in range(n)]


def _engine(model, plan, dtype="fp32"):
    import torch

    import autosp

    return autosp.compile(model, plan, options=autosp.CompileOptions(
        dtype=dtype, backend="aot_eager", optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2)))


def _train(engine, batches):
    losses = []
    for ids in batches:
        loss = engine(input_ids=ids, labels=ids)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def _checks(rank, world, tmp):
    import torch
    import torch.distributed as dist

    from autosp.compiler.training import checkpoint
    from autosp.compiler.training.export import export_hf
    from autosp.errors import AutospError

    out = {}
    batches = _batches(5)
    # Export from ZeRO-0 and ZeRO-3 checkpoints of HF Llama and Qwen2 and of the reference Llama (as LlamaForCausalLM)
    for family, zero in (("llama", 0), ("llama", 3), ("qwen2", 0), ("qwen2", 3), ("reference", 0)):
        model = _reference_model(1) if family == "reference" else _hf_model(family, 1)
        engine = _engine(model, Candidate(sp=2, zero_stage=zero, micro_batch=2))
        _train(engine, batches[:2])
        path = engine.save_checkpoint(os.path.join(tmp, f"{family}-z{zero}"))
        out[f"files {family} z{zero}"] = sorted(os.listdir(path))
        engine_loss = engine(input_ids=batches[2], labels=batches[2]).item()
        if (family, zero) == ("llama", 3):  # the uninterrupted run that the ZeRO-0 resume below must match
            out["z3 reference"] = _train(engine, batches[2:4])
        if rank == 0:
            import transformers

            hf_dir = export_hf(path, os.path.join(tmp, f"hf-{family}-z{zero}"))
            hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="sdpa")
            with torch.no_grad():
                hf_loss = hf(input_ids=batches[2], labels=batches[2]).loss.item()
            out[f"export {family} z{zero}"] = (abs(hf_loss - engine_loss) / abs(engine_loss), type(hf).__name__)
        dist.barrier()

    # Save under SP=2 ZeRO-0 after 2 steps, asynchronously: the run trains steps 3-4 while the files are written
    # (what was saved is step 2's state). Load into SP=2 ring 2 at ZeRO-3 and into SP=1 x DP=2 at ZeRO-1 (both
    # micro-batches give the same 2 sequences per step): the same losses.
    saved = os.path.join(tmp, "resume-z0")
    engine = _engine(_hf_model("llama", 1), Candidate(sp=2, zero_stage=0, micro_batch=2))
    _train(engine, batches[:2])
    pending = checkpoint.save_engine_checkpoint(engine, saved, asynchronous=True)
    reference = _train(engine, batches[2:4])
    pending.wait()
    for name, plan, source, ref in (
            ("ring2 z3", Candidate(sp=2, ring=2, zero_stage=3, micro_batch=2), saved, reference),
            ("sp1 dp2 z1", Candidate(sp=1, dp=2, zero_stage=1, micro_batch=1), saved, reference),
            ("z3 -> sp1 dp2 z0", Candidate(sp=1, dp=2, zero_stage=0, micro_batch=1), os.path.join(tmp, "llama-z3"),
             out["z3 reference"])):
        other = _engine(_hf_model("llama", 99), plan)  # other initial weights: all must come from the checkpoint
        meta = other.load_checkpoint(source)
        losses = _train(other, batches[2:4])
        out[f"resume {name}"] = (max(abs(a - b) / abs(b) for a, b in zip(losses, ref)), meta["step"])

    # bf16 at ZeRO-0 (DeepSpeed keeps an fp32 copy of each parameter, the optimizer's states under it) into
    # bf16 at ZeRO-3
    bf16 = _engine(_hf_model("llama", 1), Candidate(sp=2, zero_stage=0, micro_batch=2), dtype="bf16")
    _train(bf16, batches[:2])
    path = bf16.save_checkpoint(os.path.join(tmp, "bf16-z0"))
    ref = _train(bf16, batches[2:4])
    other = _engine(_hf_model("llama", 99), Candidate(sp=2, zero_stage=3, micro_batch=2), dtype="bf16")
    other.load_checkpoint(path)
    losses = _train(other, batches[2:4])
    out["resume bf16 z0 -> z3"] = (max(abs(a - b) / abs(b) for a, b in zip(losses, ref)), 2)

    out["version 1"] = _version_1_checkpoint(rank, tmp, batches)

    # A full disk on rank 0 while saving: every rank raises the same one-line error, nothing is published, the
    # checkpoint saved before is intact.
    from torch.distributed.checkpoint import FileSystemWriter

    class FullDisk(FileSystemWriter):
        def write_data(self, plan, planner):
            if rank == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write_data(plan, planner)

    real_writer = checkpoint.storage_writer
    checkpoint.storage_writer = lambda path: FullDisk(path)
    try:
        engine.save_checkpoint(os.path.join(tmp, "full"))
        out["enospc"] = "no error"
    except AutospError as err:
        out["enospc"] = str(err)
    finally:
        checkpoint.storage_writer = real_writer
    dist.barrier()
    out["enospc left"] = sorted(n for n in os.listdir(tmp) if "full" in n)
    out["intact"] = checkpoint.read_meta(saved)["step"]
    return out


def _version_1_checkpoint(rank, tmp, batches):
    """A checkpoint in format version 1 (safetensors shards of full fp32 tensors, engine.pt, meta.json; what
    autosp wrote before DCP), made here from a plain torch AdamW run of 2 steps, loaded into an SP=2 ZeRO-1 engine:
    the next 2 losses are the torch run's (fp32, 1e-5: SP against one process)."""
    import json

    import torch
    import torch.distributed as dist
    from safetensors.torch import save_file

    model = _hf_model("llama", 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(ids):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the engine's default gradient clipping
        opt.step()
        opt.zero_grad()
        return loss.item()

    for ids in batches[:2]:
        step(ids)
    path = os.path.join(tmp, "version-1")
    if rank == 0:
        os.makedirs(path)
        tensors, params = {}, {}
        for name, p in model.named_parameters():
            tensors[f"weight/{name}"] = p.detach().clone()
            for key in ("exp_avg", "exp_avg_sq"):
                tensors[f"{key}/{name}"] = opt.state[p][key].clone()
            params[name] = {"shape": list(p.shape), "shard": "shard-00000.safetensors"}
        save_file(tensors, os.path.join(path, "shard-00000.safetensors"))
        model.config.to_json_file(os.path.join(path, "config.json"))
        group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
        torch.save({"param_groups": [group], "scalars": {"step": 2.0}, "lr_scheduler": None,
                    "counters": {"global_steps": 2, "global_samples": 4, "micro_steps": 2, "skipped_steps": 0}},
                   os.path.join(path, "engine.pt"))
        meta = {"format": "autosp-checkpoint", "version": 1, "world": 1, "plan": "torch", "step": 2,
                "model": {"kind": "hf", "model_type": "llama"}, "params": params,
                "optimizer": {"class": "AdamW", "tensor_states": ["exp_avg", "exp_avg_sq"], "scalars": {"step": 2.0}},
                "files": {f: os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)}, "client_state": {}}
        with open(os.path.join(path, "meta.json"), "w") as f:
            json.dump(meta, f)
    dist.barrier()
    exported = None
    if rank == 0:  # autosp-export reads format 1 too: the torch run's weights after its 2 steps
        import transformers

        from autosp.compiler.training.export import export_hf

        hf = transformers.AutoModelForCausalLM.from_pretrained(export_hf(path, os.path.join(tmp, "hf-version-1")))
        exported = max((a - b).abs().max().item() for a, b in zip(hf.parameters(), model.parameters()))
    expected = [step(ids) for ids in batches[2:4]]
    engine = _engine(_hf_model("llama", 99), Candidate(sp=2, zero_stage=1, micro_batch=2))
    engine.load_checkpoint(path)
    losses = _train(engine, batches[2:4])
    return max(abs(a - b) / abs(b) for a, b in zip(losses, expected)), exported


@pytest.mark.slow
def test_checkpoint_roundtrip_export_and_full_disk(tmp_path):
    from autosp.compiler.testing import spawn

    result = spawn(_checks, 2, str(tmp_path))
    for family in ("llama z0", "llama z3", "qwen2 z0", "qwen2 z3", "reference z0"):
        err, cls = result[f"export {family}"]
        assert err <= TOL, (family, err)
    assert result["export reference z0"][1] == "LlamaForCausalLM"
    assert result["export qwen2 z3"][1] == "Qwen2ForCausalLM"
    for family in ("llama z0", "llama z3", "qwen2 z0", "qwen2 z3", "reference z0"):
        # DCP's layout: its .metadata and one data file per rank, beside autosp's meta.json
        files = [f for f in result[f"files {family}"] if f != "config.json"]  # the reference Llama has none
        assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.json"], (family, files)
    for name in ("ring2 z3", "sp1 dp2 z1", "z3 -> sp1 dp2 z0", "bf16 z0 -> z3"):
        err, step = result[f"resume {name}"]
        assert step == 2 and err <= RESUME_TOL, (name, err)
    resumed, exported = result["version 1"]
    assert resumed <= TOL and exported == 0.0, result["version 1"]
    assert "No space left on device" in result["enospc"] and "\n" not in result["enospc"]
    assert result["enospc left"] == []
    assert result["intact"] == 2
