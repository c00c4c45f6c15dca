"""Side by side on CPU: autosp vs DeepSpeed's AutoSP compile pass vs ALST's UlyssesSPAttentionHF.

Same tiny Hugging Face Llama (same initial weights), same batch, same sequence length, same SP degree,
gloo on P local processes. For each implementation the script records

- the loss it reports, against the true loss of one process on the full sequence (the loss a user
  would log: the value on rank 0, and for per-shard losses also their mean over the SP group);
- the relative error of every parameter gradient after DeepSpeed's reduction (the worst tensor);
- the step time (forward + backward + optimizer step), median over the timed steps after warm-up,
  and its ratio to autosp's, all measured in this one run.

The labels ignore the first ``--prompt-frac`` of the sequence (an SFT prompt), so the SP shards hold
different numbers of valid targets: that is what separates a token-weighted global loss from an average
of per-shard means. The optimizer is SGD with lr=0 so every step sees the same weights (the timings are
of real steps; only the update is zero).

How each baseline is driven follows its public documentation in DeepSpeed 0.19.8:

- DeepSpeed AutoSP: config ``compile: {deepcompile: true, passes: [autosp]}``, ``sequence_parallel_size``,
  ZeRO 1 (AutoSP composes with ZeRO 0/1 only), ``engine.compile()``; every rank passes the full batch
  through ``prepare_autosp_inputs`` (with the 2-D attention mask, which its pass needs to rebuild masks)
  and the model computes its own loss on the sharded labels.
- ALST: ``UlyssesSPAttentionHF.register_with_transformers(model, 'sdpa', ...)`` and its mpu passed to
  ``deepspeed.initialize``; each rank gets its shard of ``input_ids``, global ``position_ids`` and
  ``shift_labels`` (labels shifted over the full sequence, as its ``UlyssesSPDataLoaderAdapter`` does);
  the loss is the per-shard mean, then (as the ALST tutorial recommends) the good-token weighted
  average over the SP group through a differentiable all-gather. Both values are reported.
- autosp: ``autosp.compile(model, autosp.Candidate(sp=P, zero_stage=1))``; every rank passes the full batch. With
  ``--rings`` also its 2-D layouts, ``Candidate(..., ring=R)``: Ulysses over P/R ranks x ring
  attention over R ranks (R = P: pure ring), which neither baseline has; each is a row of its own.

- autosp's memory-lean plan (row ``autosp_lean``, unless ``--lean-tiles 0``): the same compile with the plan
  ``Candidate(sp=P, zero_stage=1, checkpointing="sequence", mlp_chunks=T, loss_chunks=T)`` (T = ``--lean-tiles``):
  sequence checkpointing and MLP and logits+loss tiling, the knobs that trade step time for activation memory.

Besides the step time, each row reports the bytes its forward saves for the backward on rank 0
(:func:`autosp.compiler.saved_memory.measure_saved`, parameters left out), measured on one extra step after the
timed ones, and the ratios of both to ALST's (``x alst``): the memory-lean plan's target is at most 0.9x ALST's
step time with at most 0.3x its saved activations. On a shared machine compare the ratios of one run (its rows
ran minutes apart at most), and repeat the run for their spread: ALST's registration is process-global, so one
launch cannot run it twice.

Run:  .venv/bin/python studies/compare_sp_implementations.py [--sp 4] [--rings 1,2,4] [--seq 256] [--steps 6]
Writes a JSON summary (default studies/results/compare_sp_implementations.json) and prints a table.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist

IGNORE = -100


def tiny_llama(args):
    import transformers

    config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                      num_key_value_heads=args.kv_heads, max_position_embeddings=4 * args.seq,
                                      attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def make_batch(args):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (1, args.seq), generator=gen)
    labels = ids.clone()
    labels[:, : int(args.prompt_frac * args.seq)] = IGNORE  # SFT-style: no loss on the prompt
    return ids, labels


def rel_err(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).norm() / b.norm()).item() if b.norm() > 0 else (a - b).norm().item()


def worst_grad_error(engine_module, ref_grads):
    from deepspeed.utils import safe_get_full_grad

    worst = (0.0, "")
    for name, param in engine_module.named_parameters():
        grad = safe_get_full_grad(param)
        if grad is None or name not in ref_grads:
            continue
        worst = max(worst, (rel_err(grad.float(), ref_grads[name]), name), key=lambda t: t[0])
    return worst


def sp_mean(value: float, group) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, group=group)
    return t.item() / dist.get_world_size(group)


def timed_training(engine, loss_fn, steps):
    """Train ``steps`` steps: ``loss_fn()`` returns (the loss to back-propagate, what to report); the first
    step's gradients are compared with the single-process reference. Returns (first step's report,
    median step time of the others, their times, worst gradient error, bytes saved for the backward by the
    forward of one more step)."""
    state = {}

    def step():
        loss, reported = loss_fn()
        engine.backward(loss)
        if "grad" not in state:
            state["grad"] = worst_grad_error(engine.module, REF_GRADS)
        engine.step()
        return reported

    first, median, times = timed_steps(step, steps)
    from autosp.compiler.saved_memory import measure_saved

    with measure_saved(engine.module) as saved:  # one more step: what its forward keeps for the backward
        loss, _ = loss_fn()
    engine.backward(loss)
    engine.step()
    return first, median, times, state["grad"], saved.total_bytes


def timed_steps(step_fn, steps):
    times, first = [], None
    for i in range(steps):
        dist.barrier()
        start = time.perf_counter()
        out = step_fn()
        dist.barrier()
        elapsed = time.perf_counter() - start
        if i == 0:
            first = out
        else:
            times.append(elapsed)
    return first, statistics.median(times), times


def sgd0(params):
    return torch.optim.SGD(params, lr=0.0)


def run_reference(model, ids, labels, args):
    ref = copy.deepcopy(model)
    out = ref(input_ids=ids, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in ref.named_parameters() if p.grad is not None}
    times = []
    for _ in range(3):
        start = time.perf_counter()
        ref.zero_grad()
        ref(input_ids=ids, labels=labels).loss.backward()
        times.append(time.perf_counter() - start)
    return out.loss.item(), grads, statistics.median(times)


def run_autosp(model, ids, labels, args, rank, ring=1):
    import autosp

    engine = autosp.compile(copy.deepcopy(model), autosp.Candidate(sp=args.sp, ring=ring, zero_stage=1, micro_batch=1),
                            options=autosp.CompileOptions(optimizer=sgd0, backend=args.backend))
    def loss_fn():
        loss = engine(input_ids=ids, labels=labels)
        return loss, loss.item()

    loss, median, times, grad, saved = timed_training(engine, loss_fn, args.steps)
    return {"loss_reported": loss, "grad_error": grad, "step_time_s": median, "times": times, "saved_bytes": saved}


def lean_plan(args):
    """The memory-lean plan of row autosp_lean: sequence checkpointing, MLP and logits+loss tiling."""
    from autosp.contract.specs import Candidate

    return Candidate(sp=args.sp, zero_stage=1, micro_batch=1, checkpointing="sequence", mlp_chunks=args.lean_tiles,
                     loss_chunks=args.lean_tiles, overlap=args.lean_overlap)


def run_autosp_lean(model, ids, labels, args, rank):
    """autosp with the memory-lean plan: sequence checkpointing, MLP and logits+loss tiling (module docstring)."""
    import autosp

    engine = autosp.compile(copy.deepcopy(model), lean_plan(args),
                            options=autosp.CompileOptions(optimizer=sgd0, backend=args.backend))

    def loss_fn():
        loss = engine(input_ids=ids, labels=labels)
        return loss, loss.item()

    loss, median, times, grad, saved = timed_training(engine, loss_fn, args.steps)
    return {"loss_reported": loss, "grad_error": grad, "step_time_s": median, "times": times, "saved_bytes": saved}


def run_deepspeed_autosp(model, ids, labels, args, rank):
    import deepspeed
    from deepspeed.compile.passes.sp_compile import prepare_autosp_inputs

    world = dist.get_world_size()
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "train_batch_size": world // args.sp,
        "sequence_parallel_size": args.sp,
        "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True,
        "compile": {"deepcompile": True, "passes": ["autosp"]},
        "steps_per_print": 10**9,
    }
    module = copy.deepcopy(model)
    engine, *_ = deepspeed.initialize(model=module, optimizer=sgd0(module.parameters()), config=config)
    engine.compile()
    positions = torch.arange(args.seq).unsqueeze(0)
    mask = torch.ones_like(ids)

    def loss_fn():
        i, lab, pos, am = prepare_autosp_inputs(ids.clone(), labels.clone(), positions.clone(), mask.clone())
        loss = engine(input_ids=i, labels=lab, position_ids=pos, attention_mask=am).loss
        return loss, loss.item()

    loss, median, times, grad, saved = timed_training(engine, loss_fn, args.steps)
    sp_group = None  # the whole world is one SP group here
    return {"loss_reported": loss, "loss_sp_mean": sp_mean(loss, sp_group), "grad_error": grad,
            "step_time_s": median, "times": times, "saved_bytes": saved}


def alst_engine(model, ids, labels, args):
    """(engine, loss_fn, SP group): ALST's engine on a copy of ``model`` and its loss function (module docstring):
    ``loss_fn()`` returns (the good-token weighted loss to back-propagate, (this rank's shard mean, the weighted
    loss) as floats). Registers ALST's attention in transformers' ALL_ATTENTION_FUNCTIONS['sdpa'], which is
    process-global: the caller restores it."""
    import deepspeed
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    module = copy.deepcopy(model)
    mpu = UlyssesSPAttentionHF.register_with_transformers(module, "sdpa", args.sp, 1, seq_length=args.seq,
                                                          seq_length_is_variable=False)
    config = {"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": args.sp,
              "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True,
              "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=module, optimizer=sgd0(module.parameters()), config=config, mpu=mpu)
    group = mpu.get_sequence_parallel_group()
    sp_rank, sp_world = mpu.get_sequence_parallel_rank(), mpu.get_sequence_parallel_world_size()
    chunk = args.seq // sp_world
    local = slice(sp_rank * chunk, (sp_rank + 1) * chunk)
    shift = torch.nn.functional.pad(labels, (0, 1), value=IGNORE)[..., 1:]  # over the full sequence
    positions = torch.arange(args.seq).unsqueeze(0)

    def loss_fn():
        # HF computes no loss without `labels`, so (as ALST's tutorial does) call the model's loss
        # function on the local logits and the pre-shifted local labels
        logits = engine(input_ids=ids[:, local].clone(), position_ids=positions[:, local].clone()).logits
        loss = module.loss_function(logits=logits, labels=None, shift_labels=shift[:, local].clone(),
                                    vocab_size=module.config.vocab_size)
        # ALST tutorial: weight each shard's mean by its good tokens, differentiably, over the SP group
        good = (shift[:, local] != IGNORE).sum().to(loss.dtype).reshape(1)
        losses = torch.distributed.nn.functional.all_gather(loss.reshape(1), group=group)
        goods = torch.distributed.nn.functional.all_gather(good, group=group)
        total = sum(l * g for l, g in zip(losses, goods)) / torch.clamp(sum(goods), min=1)
        return total, (loss.item(), total.item())

    return engine, loss_fn, group


def run_alst(model, ids, labels, args, rank):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    original_sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    try:
        engine, loss_fn, group = alst_engine(model, ids, labels, args)
        (local_loss, weighted), median, times, grad, saved = timed_training(engine, loss_fn, args.steps)
        return {"loss_reported": local_loss, "loss_sp_mean": sp_mean(local_loss, group), "loss_weighted": weighted,
                "grad_error": grad, "step_time_s": median, "times": times, "saved_bytes": saved}
    finally:
        ALL_ATTENTION_FUNCTIONS["sdpa"] = original_sdpa


REF_GRADS: dict = {}


def autosp_name(sp: int, ring: int) -> str:
    """The result key of autosp's row with ring degree ``ring`` ("autosp" for pure Ulysses, as before)."""
    return "autosp" if ring == 1 else f"autosp_u{sp // ring}xr{ring}"


def implementations(args):
    """(result key, runner) in the order they run: autosp's layouts, then the two baselines."""
    runs = [(autosp_name(args.sp, r), (lambda r: lambda *a: run_autosp(*a, ring=r))(r)) for r in args.rings]
    lean = [("autosp_lean", run_autosp_lean)] if args.lean_tiles else []
    baselines = [("deepspeed_autosp", run_deepspeed_autosp)] if not args.no_deepspeed_autosp else []
    return runs + lean + baselines + [("alst", run_alst)]


def worker(rank, world, args):
    global REF_GRADS
    import torch._dynamo

    torch._dynamo.config.recompile_limit = 64
    model = tiny_llama(args)
    ids, labels = make_batch(args)
    ref_loss, REF_GRADS, ref_time = run_reference(model, ids, labels, args)
    results = {"reference": {"loss": ref_loss, "step_time_s": ref_time}}
    for name, fn in implementations(args):
        torch._dynamo.reset()
        try:
            results[name] = fn(model, ids, labels, args, rank)
        except Exception as err:  # noqa: BLE001 - a baseline that fails is a result too
            results[name] = {"failed": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                             "traceback": traceback.format_exc(limit=6)}
        dist.barrier()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sp", type=int, default=4, help="SP degree = processes (default 4)")
    parser.add_argument("--rings", default="1,2,4",
                        help="autosp's ring degrees, one row each (1 = pure Ulysses; those not dividing --sp or "
                             "leaving more Ulysses ranks than heads are skipped; default 1,2,4)")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--prompt-frac", type=float, default=0.2,
                        help="share of the sequence whose labels are ignored (default 0.2: every one of 4 shards still holds valid targets)")
    parser.add_argument("--steps", type=int, default=6, help="steps per implementation; the first is not timed")
    parser.add_argument("--backend", default="inductor", choices=("inductor", "aot_eager"))
    parser.add_argument("--lean-tiles", type=int, default=4,
                        help="MLP and loss tiles of the memory-lean row autosp_lean (0: leave the row out; default 4)")
    parser.add_argument("--lean-overlap", default="none", choices=("none", "kv_async"),
                        help="the memory-lean row's overlap schedule (default none)")
    parser.add_argument("--no-deepspeed-autosp", action="store_true", help="leave out DeepSpeed's AutoSP row")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "compare_sp_implementations.json"))
    args = parser.parse_args()
    rings = [int(r) for r in args.rings.split(",") if r.strip()]
    args.rings = [r for r in rings if r >= 1 and args.sp % r == 0 and args.heads % (args.sp // r) == 0]
    if 1 not in args.rings:
        parser.error("--rings must include 1 (pure Ulysses is the row the others are compared with)")

    from autosp.compiler import testing

    started = time.time()
    results = testing.spawn(worker, args.sp, args)
    results["setup"] = {k: v for k, v in vars(args).items() if k != "out"}
    results["setup"].update(torch=torch.__version__, wall_time_s=round(time.time() - started, 1))
    import deepspeed
    import transformers

    results["setup"].update(deepspeed=deepspeed.__version__, transformers=transformers.__version__)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, default=str)

    true = results["reference"]["loss"]
    base = results.get("autosp", {}).get("step_time_s")
    alst = results.get("alst", {})
    print(f"true full-sequence loss {true:.6f}  (single process eager step {results['reference']['step_time_s']:.3f} s)")
    print(f"{'implementation':<18} {'reported loss':>14} {'rel. error':>11} {'worst grad err':>15} {'step s':>8} "
          f"{'x autosp':>9} {'x alst':>7} {'saved MiB':>10} {'x alst':>7}")
    names = [name for name, _ in implementations(args)]
    for name in names:
        r = results.get(name, {})
        if "failed" in r:
            print(f"{name:<18} failed: {r['failed']}")
            continue
        rows = [("", r["loss_reported"])]
        if "loss_sp_mean" in r:
            rows.append((" (SP mean)", r["loss_sp_mean"]))
        if "loss_weighted" in r:
            rows.append((" (weighted)", r["loss_weighted"]))
        for i, (tag, value) in enumerate(rows):
            extra = ""
            if i == 0 and base:
                extra = f" {r['grad_error'][0]:>15.2e} {r['step_time_s']:>8.3f} {r['step_time_s'] / base:>9.2f}"
                if "step_time_s" in alst:
                    extra += (f" {r['step_time_s'] / alst['step_time_s']:>7.2f} {r['saved_bytes'] / 2**20:>10.2f}"
                              f" {r['saved_bytes'] / alst['saved_bytes']:>7.2f}")
            print(f"{(name + tag):<18} {value:>14.6f} {abs(value - true) / abs(true):>11.2e}{extra}")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
