"""Training on text under SP on 2 gloo processes (issue 20 items 4-7), against one process.

One spawned job (world 2, fp32, aot_eager) runs:

A. ``autosp.compile`` at SP=2 with the :class:`Trainer` evaluating after every step: the held-out loss
   before training and after the last step, the training losses and the first gradient norm equal one
   process's (each document run on its own, token-weighted), so documents never attend across a
   boundary and evaluation between steps changes nothing in training;
B. ``autosp-train`` on a ``.jsonl`` at SP=2 (cosine schedule, evaluation, TensorBoard) and on a ``.parquet``
   of the same documents at SP=1 x DP=2, where one DP rank gets the stream's padded tail: the logged
   step-1 loss is the global token-weighted loss of the step's micro-batches computed by one process (and
   the objective trained: step 2's loss is one process's after one step on it),
   ``tokens`` the real tokens of those batches, tokens/s the same formula in both, the learning rates
   the schedule's, and TensorBoard's own reader finds the logged scalars.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest
import torch

from text_fixtures import TINY_FLAGS, documents, make_tokenizer, write_all_formats

SEQ, SEED, RTOL = 64, 0, 1e-5


def _spec():
    from autosp.cost_models.catalog.models import resolve_model

    return dataclasses.replace(resolve_model("llama-3.2-1b"), n_layers=2, hidden=64, n_heads=4, n_kv_heads=2,
                               head_dim=16, ffn_hidden=128, vocab=97)


def _model():
    from autosp.compiler.models import Llama

    torch.manual_seed(SEED)  # what autosp-train does before building the model
    return Llama.from_spec(_spec())


def _data(path, tokenizer_dir, field="text"):
    from autosp.compiler.data.tokens import load_tokenizer, tokenized

    return tokenized(path, field, load_tokenizer(tokenizer_dir), show=False)


def _weighted(model, batches):
    """One process: the token-weighted loss over ``batches``, every document on its own."""
    from autosp.compiler.data.sources import batch_counts
    from autosp.compiler.testing import packed_loss

    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            n = batch_counts(batch)[1]
            if n:
                total += packed_loss(model, batch).double().item() * n
                count += n
    return total / count


def _after_one_step(model, batches):
    """One process: the model after one optimizer step on the token-weighted loss of ``batches`` (AdamW lr
    1e-3, weight decay 0.01, the global norm clipped to 1 as DeepSpeed does)."""
    from autosp.compiler.data.sources import batch_counts
    from autosp.compiler.testing import packed_loss

    model = copy.deepcopy(model)
    counts = [batch_counts(b)[1] for b in batches]
    loss = sum(packed_loss(model, b) * n for b, n in zip(batches, counts)) / sum(counts)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    torch.optim.AdamW(model.parameters(), lr=1e-3).step()
    return model


def _job(rank, world, paths, tokenizer_dir, out_dir):
    import autosp
    from autosp.compiler.data.sources import PackedTextSource
    from autosp.compiler.testing import packed_loss, reference_run
    from autosp.compiler.train_cli import main
    from autosp.compiler.training.logging import StepLogger
    from autosp.compiler.training.loop import Trainer

    # A: the API at SP=2, evaluating after every step
    source = PackedTextSource(_data(paths["jsonl"], tokenizer_dir, "body"), SEQ, SEED, 1, torch)
    held_out = PackedTextSource(_data(paths["eval"], tokenizer_dir), SEQ, SEED, 1, torch, shuffle=False)
    model = _model()
    steps = 3
    ref = reference_run(model, [source.batch(m, 1) for m in range(steps)], lambda p: torch.optim.AdamW(p, lr=1e-3),
                        loss_fn=packed_loss)
    eval_batches = [held_out.eval_batch(i, 1) for i in range(held_out.eval_batches(1))]
    trained = copy.deepcopy(model)
    trained.load_state_dict(ref["weights"], strict=False)  # weights by parameter name (tied ones once)
    ref_eval = (_weighted(model, eval_batches), _weighted(trained, eval_batches))

    engine = autosp.compile(model, sp_size=2, options=autosp.CompileOptions(
        packed=True, optim=autosp.OptimizerOptions(lr=1e-3), dtype="fp32", backend="aot_eager"))
    from autosp.compiler.training.evaluate import evaluate

    rng = torch.get_rng_state()
    before = evaluate(engine, held_out, rows=1)["eval_loss"]
    untouched = (torch.equal(rng, torch.get_rng_state()) and engine.module.training
                 and all(p.grad is None for p in engine.module.parameters()))
    logger = StepLogger(steps=steps, seq=SEQ, candidate=engine.candidate, rank=rank, print_fn=lambda *a, **k: None)
    records = Trainer(engine, source, logger, steps=steps, rows=1, eval_source=held_out, eval_every=1).run()
    api = {"before": before, "untouched": untouched, "losses": [r["loss"] for r in records],
           "eval_last": records[-1]["eval_loss"], "grad_norm": records[0]["grad_norm"], "ref": ref["losses"],
           "ref_eval": ref_eval, "ref_grad_norm": ref["grad_norm"]}

    # B: autosp-train, SP=2 then SP=1 x DP=2
    common = TINY_FLAGS + ["--ctx", str(SEQ), "--steps", "3", "--grad-accum", "2", "--backend", "aot_eager",
                           "--dtype", "fp32", "--tokenizer", tokenizer_dir, "--lr", "1e-3", "--seed", str(SEED)]
    codes = [main(common + ["--sp", "2", "--data", paths["jsonl"], "--text-field", "body", "--lr-schedule", "cosine",
                            "--warmup", "1", "--min-lr", "1e-4", "--eval-data", paths["eval"], "--eval-every", "2",
                            "--eval-steps", "1", "--log-json", f"{out_dir}/sp2.jsonl",
                            "--tensorboard", f"{out_dir}/tb"]),
             main(common + ["--sp", "1", "--data", paths["parquet"], "--text-field", "body",
                            "--log-json", f"{out_dir}/dp2.jsonl"])]
    return {"api": api, "codes": codes}


@pytest.mark.slow
def test_text_training_under_sp_matches_one_process(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from autosp.compiler import testing
    from autosp.compiler.data.sources import PackedTextSource, batch_counts
    from autosp.compiler.training.schedule import OptimizerOptions, learning_rate

    monkeypatch.setenv("AUTOSP_DATA_CACHE", str(tmp_path / "cache"))
    tokenizer_dir = make_tokenizer(tmp_path / "tok")
    paths = write_all_formats(tmp_path, documents(9, seed=5, longest=30))
    (tmp_path / "eval.txt").write_text("\n\n".join(documents(6, seed=9, longest=30)) + "\n")
    paths["eval"] = str(tmp_path / "eval.txt")
    data = _data(paths["jsonl"], tokenizer_dir, "body")
    source = PackedTextSource(data, SEQ, SEED, 1, torch)
    assert 2 < source.sequences <= 4 and data.tokens.size % SEQ  # step 1 at DP=2 holds the padded tail
    out = testing.spawn(_job, 2, paths, tokenizer_dir, str(tmp_path))

    api = out["api"]
    assert api["untouched"]  # evaluation left no gradients, the RNG and the training mode as they were
    assert testing.rel_err(torch.tensor(api["before"]), torch.tensor(api["ref_eval"][0])) <= RTOL
    assert testing.rel_err(torch.tensor(api["eval_last"]), torch.tensor(api["ref_eval"][1])) <= RTOL
    assert testing.rel_err(torch.tensor(api["losses"]), torch.tensor(api["ref"])) <= RTOL
    assert testing.rel_err(torch.tensor(api["grad_norm"]), torch.tensor(api["ref_grad_norm"])) <= RTOL

    assert out["codes"] == [0, 0]
    model = _model()
    schedule = OptimizerOptions(lr=1e-3, min_lr=1e-4, warmup=1, schedule="cosine", total_steps=3)
    for name, rows in (("sp2", 1), ("dp2", 2)):
        steps = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        assert [s["step"] for s in steps] == [1, 2, 3]
        first = [source.batch(m, rows) for m in range(2)]  # the 2 micro-steps of step 1
        expected = _weighted(model, first)
        assert abs(steps[0]["loss"] - expected) <= RTOL * abs(expected), name
        # step 1 trained that same token-weighted objective: step 2's loss is one process's after that update
        second = _weighted(_after_one_step(model, first), [source.batch(m, rows) for m in (2, 3)])
        assert abs(steps[1]["loss"] - second) <= RTOL * abs(second), name
        assert steps[0]["tokens"] == sum(batch_counts(b)[0] for b in first), name
        for s in steps:
            assert s["tokens_per_s"] == pytest.approx(s["tokens"] / s["step_time_s"])
            assert s["grad_norm"] > 0 and s["mfu"] is None  # no plan: no hardware peak
        if name == "dp2":
            assert steps[0]["tokens"] < 4 * SEQ and any("attention_mask" in b for b in first)  # real tokens only
            assert [s["lr"] for s in steps] == pytest.approx([1e-3] * 3)
        else:
            assert [s["lr"] for s in steps] == pytest.approx([learning_rate(schedule, k) for k in range(3)])
            assert [s.get("eval_loss") is not None for s in steps] == [False, True, True]
    sp2 = [json.loads(line) for line in (tmp_path / "sp2.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx([s["loss"] for s in sp2])
    assert [e.value for e in events.Scalars("train/lr")] == pytest.approx([s["lr"] for s in sp2])
    assert [e.step for e in events.Scalars("eval/loss")] == [2, 3]
    assert all(math.isfinite(e.value) for e in events.Scalars("train/grad_norm"))
