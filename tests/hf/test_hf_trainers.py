"""autosp.hf.Trainer under SP == the plain transformers.Trainer in one process, fp32, relative 1e-5.

One spawned world-2 job (gloo, aot_eager, tiny Llama built from a config), eight cases against one process:

- autosp.hf.Trainer, SP=2 (DDP underneath), gradient accumulation 2, 5 optimizer steps, batches of uneven odd
  lengths with right padding: every logged loss (the first also against the step's objective computed
  directly: tokens counted once), evaluate() before and after training (the one before must not leave the
  model without DDP), the final weights, and the saved checkpoint loaded with from_pretrained;
- autosp.hf.SFTTrainer, packing=True / padding-free, 6 steps over two epochs in the Trainer's random order,
  then evaluate(), with the loss untiled and tiled (``loss_chunks=2``): every log (loss, gradient norm, TRL's
  entropy, mean_token_accuracy and num_tokens, their eval_ forms, eval_loss), the final weights, and no
  attention across documents;
- PEFT LoRA through autosp.hf.Trainer and through autosp.compile, at ZeRO 0 and ZeRO 3: adapter gradients
  and weights, base weights untouched;
- the loss tiled (``loss_chunks=2``) at ZeRO 3 inside the Trainer's own DeepSpeed engine, tied embeddings:
  the logged losses, the final weights and the shared matrix's change;
- a tiny Qwen3-MoE with its router's load-balancing loss, gradient accumulation 2, right-padded batches, SGD:
  through autosp.hf.Trainer against transformers.Trainer (which adds coef x aux at every micro-step) and through
  autosp.hf.SFTTrainer against trl.SFTTrainer (coef x aux / accumulation; TRL's default gradient checkpointing,
  full checkpointing in autosp's graph): every log (loss, gradient norm, TRL's aux_loss and token metrics) and
  the final weights; the load-balancing statistics leave out the attention_mask's pads on both sides.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from hf_tiny import examples, pad_collate, tiny_llama, tiny_moe, tokenizer

from autosp.compiler.testing import rel_err, run_cases, spawn

TOL = 1e-5
pytestmark = pytest.mark.slow


# -- the runs (the same code runs SP in the spawned ranks and the references here) -----------------------
def _training_args(cls, out, **kw):
    base = dict(output_dir=out, learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True, seed=0,
                disable_tqdm=True, train_sampling_strategy="sequential", save_strategy="no")
    return cls(**{**base, **kw})


class _Recorder:
    def __new__(cls):
        from transformers import TrainerCallback

        class Recorder(TrainerCallback):
            def __init__(self):
                self.losses, self.grad_norms, self.epochs, self.logs = [], [], [], []

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "loss" in logs:
                    self.losses.append(logs["loss"])
                    self.grad_norms.append(logs.get("grad_norm"))
                    self.epochs.append(logs.get("epoch"))
                if logs and ("loss" in logs or "eval_loss" in logs):  # every step's and evaluation's logs
                    self.logs.append(dict(logs))

        return Recorder()


def _weights(trainer) -> dict:
    from autosp.compiler.testing import full_weight

    if trainer.is_deepspeed_enabled:
        return {n: full_weight(p) for n, p in trainer.model.named_parameters()}
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def run_trainer(trainer_cls, out, **sp):
    from transformers import TrainingArguments

    rec = _Recorder()
    args = _training_args(TrainingArguments, out, per_device_train_batch_size=2, per_device_eval_batch_size=2,
                          gradient_accumulation_steps=2, max_steps=5, save_strategy="steps", save_steps=5,
                          save_only_model=True, include_num_input_tokens_seen="all")
    trainer = trainer_cls(model=tiny_llama(), args=args, train_dataset=examples(20, 1), eval_dataset=examples(5, 2),
                          data_collator=pad_collate, callbacks=[rec], **sp)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    return {"losses": rec.losses, "eval": [before, after], "weights": _weights(trainer),
            "tokens": trainer.state.num_input_tokens_seen}


def _chat_dataset(n=24, seed=3):
    """Pre-tokenized conversations of uneven lengths (TRL packs them, best-fit decreasing)."""
    from datasets import Dataset

    return Dataset.from_list([{"input_ids": e["input_ids"]} for e in examples(n, seed, low=5, high=20)])


def run_sft(trainer_cls, out, **sp):
    """6 optimizer steps of 2 packed rows over the 8 rows TRL packs: the Trainer's random order (reshuffled at
    the second epoch, as the one-process Trainer does) and SGD, whose steps keep fp32 rounding at its size
    (Adam divides each gradient element by its own size + 1e-8, so an element near 1e-8, measured on one
    embedding row, turns its rounding into a lr-sized weight difference: docs/hf-trainers.md); then one
    evaluation (its packed rows in batches of 2, the last one shorter). Every log is kept: TRL's metrics."""
    from trl import SFTConfig

    rec = _Recorder()
    args = _training_args(SFTConfig, out, per_device_train_batch_size=2, per_device_eval_batch_size=2,
                          gradient_accumulation_steps=1, max_steps=6, packing=True, padding_free=True, max_length=40,
                          bf16=False, train_sampling_strategy="random", optim="sgd", learning_rate=0.5)
    trainer = trainer_cls(model=tiny_llama(), args=args, train_dataset=_chat_dataset(),
                          eval_dataset=_chat_dataset(9, 8), processing_class=tokenizer(), callbacks=[rec], **sp)
    assert trainer.args.padding_free
    first = next(iter(trainer.get_train_dataloader()))
    trainer.train()
    trainer.evaluate()
    return {"losses": rec.losses, "grad_norms": rec.grad_norms, "epochs": rec.epochs, "weights": _weights(trainer),
            "logs": rec.logs, "first": {k: first[k].clone() for k in ("input_ids", "position_ids", "labels")}}


def _per_document_loss(batch) -> float:
    """A packed batch's token-mean loss with every document run through the model on its own: what
    attention restricted to documents must give."""
    model = tiny_llama()
    starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist() + [batch["input_ids"].shape[1]]
    total, count = 0.0, 0
    with torch.no_grad():
        for a, b in zip(starts[:-1], starts[1:]):
            logits = model(input_ids=batch["input_ids"][:, a:b]).logits[0, :-1]
            labels = batch["labels"][0, a + 1:b]
            total += torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum").item()
            count += int((labels != -100).sum())
    return total / count


def lora_model():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                    target_modules=["q_proj", "v_proj", "down_proj"]))
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():  # B starts at zero, which would make A's first gradients zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def run_lora_trainer(trainer_cls, out, **sp):
    from transformers import TrainingArguments

    args = _training_args(TrainingArguments, out, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                          max_steps=3)
    trainer = trainer_cls(model=lora_model(), args=args, train_dataset=examples(12, 4), data_collator=pad_collate, **sp)
    trainer.train()
    return {"weights": _weights(trainer)}


def run_tied_tiled_trainer(trainer_cls, out, **sp):
    """3 SGD steps of a tied-embedding Llama (SGD: a weight's change is lr x its clipped gradient)."""
    from transformers import TrainingArguments

    rec = _Recorder()
    args = _training_args(TrainingArguments, out, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                          max_steps=3, optim="sgd", learning_rate=0.5)
    trainer = trainer_cls(model=tiny_llama(tied=True), args=args, train_dataset=examples(12, 6),
                          data_collator=pad_collate, callbacks=[rec], **sp)
    trainer.train()
    tiled = trainer.sp_engine.stats.losses_tiled if hasattr(trainer, "sp_engine") else None
    return {"losses": rec.losses, "weights": _weights(trainer), "tiled": tiled}


def run_moe_trainer(trainer_cls, out, **sp):
    """3 SGD steps of a tiny MoE whose loss adds its router's load-balancing loss, gradient accumulation 2,
    right-padded batches with an attention_mask."""
    from transformers import TrainingArguments

    rec = _Recorder()
    args = _training_args(TrainingArguments, out, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                          max_steps=3, optim="sgd", learning_rate=0.5)
    trainer = trainer_cls(model=tiny_moe(), args=args, train_dataset=examples(12, 1), data_collator=pad_collate,
                          callbacks=[rec], **sp)
    trainer.train()
    return {"logs": rec.logs, "weights": _weights(trainer)}


def run_moe_sft(trainer_cls, out, **sp):
    """The same MoE through TRL: padded (not packed) rows, gradient accumulation 2, SGD, TRL's default gradient
    checkpointing; TRL logs the aux loss."""
    from trl import SFTConfig

    rec = _Recorder()
    args = _training_args(SFTConfig, out, per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=3,
                          packing=False, padding_free=False, max_length=40, bf16=False, optim="sgd", learning_rate=0.5)
    trainer = trainer_cls(model=tiny_moe(), args=args, train_dataset=_chat_dataset(16, 3),
                          processing_class=tokenizer(), callbacks=[rec], **sp)
    assert trainer.aux_loss_enabled
    trainer.train()
    return {"logs": rec.logs, "weights": _weights(trainer)}


def lora_batches():
    rows = examples(6, 5, low=13, high=14)
    return [pad_collate(rows[i:i + 2]) for i in range(0, 6, 2)]


def _sgd(params):
    return torch.optim.SGD(params, lr=0.5)


# -- the SP side ------------------------------------------------------------------------------------------
def _sp_case(name, out):
    import autosp.hf
    from autosp.compiler.testing import sp_run
    from autosp.contract.specs import Candidate

    common = {"backend": "aot_eager", "pad_to_multiple_of": 16}
    # each case as in a fresh process: Accelerate leaves ACCELERATE_USE_DEEPSPEED=true behind once a Trainer
    # ran DeepSpeed (accelerator.py), and the next TrainingArguments would then train under a default ZeRO-2
    os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)
    if name == "trainer":
        result = run_trainer(autosp.hf.Trainer, out, sp_size=2, **common)
        result["stats"] = None
        return result
    if name == "sft":
        return run_sft(autosp.hf.SFTTrainer, out, sp_size=2, **common)
    if name == "moe_trainer":
        return run_moe_trainer(autosp.hf.Trainer, out, sp_size=2, **common)
    if name == "moe_sft":
        return run_moe_sft(autosp.hf.SFTTrainer, out, sp_size=2, **common)
    if name == "sft_tiled":  # TRL's token metrics read from the tiled loss's chunks
        return run_sft(autosp.hf.SFTTrainer, out, plan=Candidate(sp=2, micro_batch=2, grad_accum=1, loss_chunks=2),
                       **common)
    if name == "tied_tiled_trainer3":
        plan = Candidate(sp=2, zero_stage=3, micro_batch=2, grad_accum=2, loss_chunks=2)
        return run_tied_tiled_trainer(autosp.hf.Trainer, out, plan=plan, **common)
    if name.startswith("lora_trainer"):  # lora_trainer0 / lora_trainer3: the ZeRO stage
        return run_lora_trainer(autosp.hf.Trainer, out,
                                plan=Candidate(sp=2, zero_stage=int(name[-1]), micro_batch=2, grad_accum=2),
                                **common)
    stage = int(name[-1])
    result = sp_run(lora_model(), lora_batches(), _sgd, Candidate(sp=2, zero_stage=stage, micro_batch=2),
                    backend="aot_eager", gradient_clipping=0)
    return {k: result[k] for k in ("losses", "grads", "weights")}


def _sp_job(rank, world, out, names):
    return run_cases(rank, names, lambda name: _sp_case(name, os.path.join(out, name)))


# -- the test ---------------------------------------------------------------------------------------------
def _worst(got: dict, ref: dict, only=None):
    names = [n for n in ref if only is None or only in n]
    assert names
    return max((rel_err(got[n], ref[n]), n) for n in names)


def _close(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b)) <= TOL and len(a) == len(b)


def _same_logs(got: list, ref: list):
    """Every log the SP trainer wrote has the keys, in order, and the values of the one-process trainer's: the
    counts (num_tokens) exactly, the rest (loss, TRL's entropy and mean_token_accuracy, ...) within TOL; only
    the timings differ."""
    assert len(got) == len(ref), (len(got), len(ref))
    for g, r in zip(got, ref):
        assert list(g) == list(r), (list(g), list(r))
        for key, want in r.items():
            if key.endswith(("_runtime", "_per_second")):
                continue
            if key.endswith("num_tokens"):
                assert g[key] == want, (key, g[key], want)
            else:
                assert abs(g[key] - want) <= TOL * abs(want), (key, g[key], want)


def _loaded_eval_loss(path) -> float:
    """What Trainer.evaluate() computes, from a checkpoint loaded with from_pretrained: each batch's
    token-mean loss, averaged over the examples."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
    rows, total, count = examples(5, 2), 0.0, 0
    with torch.no_grad():
        for i in range(0, len(rows), 2):
            batch = pad_collate(rows[i:i + 2])
            total += model(**batch).loss.item() * batch["input_ids"].shape[0]
            count += batch["input_ids"].shape[0]
    return total / count


def _first_step_loss() -> float:
    """The first optimizer step's objective computed directly: its 4 sequences (2 per micro-batch x gradient
    accumulation 2, in order), every target token's loss summed once over the targets of the whole step."""
    model = tiny_llama()
    total, count = 0.0, 0
    with torch.no_grad():
        for row in examples(20, 1)[:4]:
            ids = torch.tensor([row["input_ids"]])
            logits = model(input_ids=ids).logits[0, :-1]
            total += torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
            count += ids.shape[1] - 1
    return total / count


def test_hf_trainers_sft_and_lora_under_sp_equal_one_process(tmp_path):
    import transformers
    import trl

    from autosp.compiler.testing import reference_run

    names = ["trainer", "sft", "sft_tiled", "lora_trainer0", "lora_compile0", "lora_trainer3", "lora_compile3",
             "tied_tiled_trainer3", "moe_trainer", "moe_sft"]
    sp = spawn(_sp_job, 2, str(tmp_path / "sp"), names)
    for name in names:
        assert "crash" not in sp[name], sp[name].get("crash")

    ref = run_trainer(transformers.Trainer, str(tmp_path / "ref"))
    got = sp["trainer"]
    assert len(got["losses"]) == 5 and _close(got["losses"], ref["losses"]), (got["losses"], ref["losses"])
    # the logged loss is the step's true token-weighted mean, each token counted once
    assert abs(got["losses"][0] - _first_step_loss()) <= TOL * got["losses"][0], (got["losses"][0], _first_step_loss())
    assert got["tokens"] == ref["tokens"]
    assert _close(got["eval"], ref["eval"]), (got["eval"], ref["eval"])
    assert _worst(got["weights"], ref["weights"])[0] <= TOL
    # the checkpoint the SP trainer saved loads with from_pretrained and gives the trained model's loss
    loaded = _loaded_eval_loss(str(tmp_path / "sp" / "trainer" / "checkpoint-5"))
    assert abs(loaded - got["eval"][1]) <= TOL * got["eval"][1], (loaded, got["eval"][1])

    # TRL's SFTTrainer, packed and padding-free: every logged loss and gradient norm and the final weights,
    # past the first epoch (the data order of every epoch is the one-process Trainer's), and documents never
    # attend across their boundaries (the first step's loss is that of every document run on its own)
    # Every log, TRL's token metrics included (entropy, mean_token_accuracy, num_tokens; eval_ too), equals the
    # one process's, with the loss untiled (the metrics read from the shard's logits) and tiled (from its chunks)
    ref_sft = run_sft(trl.SFTTrainer, str(tmp_path / "ref_sft"))
    assert {"entropy", "mean_token_accuracy", "num_tokens"} <= set(ref_sft["logs"][0])
    assert any(log.get("mean_token_accuracy") for log in ref_sft["logs"])
    for name in ("sft", "sft_tiled"):
        got = sp[name]
        assert len(got["losses"]) == 6 and ref_sft["epochs"][-1] > 1, ref_sft["epochs"]
        assert _close(got["losses"], ref_sft["losses"]), (name, got["losses"], ref_sft["losses"])
        assert _close(got["grad_norms"], ref_sft["grad_norms"]), (name, got["grad_norms"], ref_sft["grad_norms"])
        _same_logs(got["logs"], ref_sft["logs"])
        assert _worst(got["weights"], ref_sft["weights"])[0] <= TOL
    alone = _per_document_loss(ref_sft["first"])
    assert abs(sp["sft"]["losses"][0] - alone) <= TOL * alone, (sp["sft"]["losses"][0], alone)

    # PEFT LoRA, through the Trainer and through autosp.compile, at ZeRO 0 and 3 (frozen base weights
    # partitioned; the first layer's input comes from frozen embeddings): only the adapters train, exactly
    base = {n: p.detach().clone() for n, p in lora_model().named_parameters() if "lora_" not in n}
    ref_lora = run_lora_trainer(transformers.Trainer, str(tmp_path / "ref_lora"))
    ref_compile = reference_run(lora_model(), lora_batches(), _sgd, gradient_clipping=0)
    for stage in (0, 3):
        got = sp[f"lora_trainer{stage}"]
        assert _worst(got["weights"], ref_lora["weights"], only="lora_")[0] <= TOL, stage
        assert all(torch.equal(got["weights"][n], w) for n, w in base.items()), stage
        got = sp[f"lora_compile{stage}"]
        trained = sorted(n for n, g in got["grads"].items() if g is not None)
        assert trained == sorted(ref_compile["grads"]) and all("lora_" in n for n in trained), stage
        assert _worst(got["grads"], ref_compile["grads"])[0] <= TOL, stage
        assert _worst(got["weights"], ref_compile["weights"], only="lora_")[0] <= TOL, stage
        assert all(torch.equal(got["weights"][n], w) for n, w in base.items()), stage
        assert _close(got["losses"], ref_compile["losses"]), stage

    # the loss tiled at ZeRO-3 in the Trainer's DeepSpeed engine, tied embeddings: the shared matrix (resident,
    # unhooked in the embedding and the head) gets the embedding's and the tiled loss's gradients
    ref_tied = run_tied_tiled_trainer(transformers.Trainer, str(tmp_path / "ref_tied"))
    got = sp["tied_tiled_trainer3"]
    assert got["tiled"] > 0, got["tiled"]
    assert len(got["losses"]) == 3 and _close(got["losses"], ref_tied["losses"]), (got["losses"], ref_tied["losses"])
    assert _worst(got["weights"], ref_tied["weights"])[0] <= TOL
    # the shared matrix's change alone (lr x its summed gradients; its whole value would hide an error)
    shared = "model.embed_tokens.weight"
    start = dict(tiny_llama(tied=True).named_parameters())[shared].detach()
    assert sorted(got["weights"]) == sorted(ref_tied["weights"]) and shared in got["weights"]
    assert rel_err(got["weights"][shared] - start, ref_tied["weights"][shared] - start) <= TOL

    # MoE with the load-balancing loss and gradient accumulation: each trainer's own objective (the aux term per
    # micro-step for transformers.Trainer, over the accumulation for TRL), every log and the final weights
    for name, ref_moe in (("moe_trainer", run_moe_trainer(transformers.Trainer, str(tmp_path / "ref_moe"))),
                          ("moe_sft", run_moe_sft(trl.SFTTrainer, str(tmp_path / "ref_moe_sft")))):
        got = sp[name]
        assert len(got["logs"]) == 3, got["logs"]
        worst, param = _worst(got["weights"], ref_moe["weights"])
        loss_err = max(abs(g["loss"] - r["loss"]) / abs(r["loss"]) for g, r in zip(got["logs"], ref_moe["logs"]))
        print(f"{name}: worst logged-loss rel err {loss_err:.1e}, worst weight rel err {worst:.1e} ({param})")
        _same_logs(got["logs"], ref_moe["logs"])
        assert worst <= TOL, name
    assert all("aux_loss" in log for log in ref_moe["logs"])
