"""engine.save_checkpoint / load_checkpoint and autosp-export, through the Python API on 2 gloo processes.

One spawned run: tiny Hugging Face Llama and Qwen2 and the reference Llama trained 2 steps at ZeRO-0 and ZeRO-3,
saved, exported to a Hugging Face directory; ``from_pretrained`` gives the engine's loss on a batch (fp32, 1e-5);
the checkpoint loaded into an engine under another plan continues with the same losses; a full disk (writes that
fail with ENOSPC) is one error on every rank, nothing published, the earlier checkpoint intact.
"""

from __future__ import annotations

import errno
import os

import pytest

TOL = 1e-5
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


def _engine(model, **plan):
    import torch

    import autosp

    return autosp.compile(model, dtype="fp32", backend="aot_eager",
                          optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2), **plan)


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
        engine = _engine(model, sp_size=2, zero_stage=zero, micro_batch=2)
        _train(engine, batches[:2])
        path = engine.save_checkpoint(os.path.join(tmp, f"{family}-z{zero}"))
        engine_loss = engine(input_ids=batches[2], labels=batches[2]).item()
        if rank == 0:
            import transformers

            hf_dir = export_hf(path, os.path.join(tmp, f"hf-{family}-z{zero}"))
            hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="sdpa")
            with torch.no_grad():
                hf_loss = hf(input_ids=batches[2], labels=batches[2]).loss.item()
            out[f"export {family} z{zero}"] = (abs(hf_loss - engine_loss) / abs(engine_loss), type(hf).__name__)
        dist.barrier()

    # Save under SP=2 ZeRO-0 after 2 steps, keep training (steps 3-4); load into SP=2 ring 2 at ZeRO-3 and
    # into SP=1 x DP=2 at ZeRO-1 (both micro-batches give the same 2 sequences per step): the same losses.
    saved = os.path.join(tmp, "llama-z0")
    engine = _engine(_hf_model("llama", 1), sp_size=2, zero_stage=0, micro_batch=2)
    _train(engine, batches[:2])
    reference = _train(engine, batches[2:4])
    for name, plan in (("ring2 z3", dict(sp_size=2, ring_size=2, zero_stage=3, micro_batch=2)),
                       ("sp1 dp2 z1", dict(sp_size=1, zero_stage=1, micro_batch=1))):
        other = _engine(_hf_model("llama", 99), **plan)  # other initial weights: all must come from the checkpoint
        meta = other.load_checkpoint(saved)
        losses = _train(other, batches[2:4])
        out[f"resume {name}"] = (max(abs(a - b) / abs(b) for a, b in zip(losses, reference)), meta["step"])

    # A full disk while saving: every rank raises the same one-line error, nothing is published, the checkpoint
    # saved before is intact.
    real_write = checkpoint.write_file

    def full(path, data):
        if rank == 0 and "shard" in os.path.basename(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(path, data)

    checkpoint.write_file = full
    try:
        engine.save_checkpoint(os.path.join(tmp, "full"))
        out["enospc"] = "no error"
    except AutospError as err:
        out["enospc"] = str(err)
    finally:
        checkpoint.write_file = real_write
    dist.barrier()
    out["enospc left"] = sorted(n for n in os.listdir(tmp) if "full" in n)
    out["intact"] = checkpoint.read_meta(saved)["step"]
    return out


@pytest.mark.slow
def test_checkpoint_roundtrip_export_and_full_disk(tmp_path):
    from autosp.compiler.testing import spawn

    result = spawn(_checks, 2, str(tmp_path))
    for family in ("llama z0", "llama z3", "qwen2 z0", "qwen2 z3", "reference z0"):
        err, cls = result[f"export {family}"]
        assert err <= TOL, (family, err)
    assert result["export reference z0"][1] == "LlamaForCausalLM"
    assert result["export qwen2 z3"][1] == "Qwen2ForCausalLM"
    for name in ("ring2 z3", "sp1 dp2 z1"):
        err, step = result[f"resume {name}"]
        assert step == 2 and err <= TOL, (name, err)
    assert "No space left on device" in result["enospc"] and "\n" not in result["enospc"]
    assert result["enospc left"] == []
    assert result["intact"] == 2
