"""``autosp-train``: train a causal LM sequence-parallel under a plan, printing loss, step time and peak
memory per optimizer step.

Launch one process per device (every process gets the same arguments)::

    torchrun --nproc-per-node 4 $(which autosp-train) --plan plan.json --steps 20
    deepspeed --num_gpus 4 $(which autosp-train) --plan plan.json --steps 20
    autosp-train --model llama-3.2-1b --layers 2 --sp 1 --ctx 2k      # one process

What is trained:

- ``--model PRESET`` (see ``autosp-plan --list-models``) builds the project's reference Llama
  (:mod:`autosp.compiler.models.llama`) from the preset's shape; ``--model path/config.json`` (or its
  directory) builds the Hugging Face model of that config with ``transformers`` (SDPA attention); with
  ``--plan`` and no ``--model`` the plan's model is used. ``--layers/--hidden/--heads/--kv-heads/--ffn/
  --vocab`` shrink a preset (e.g. to try a plan on CPU).
- Weights are random (``--seed``) unless ``--checkpoint`` names a ``torch.save``d state dict or, for a
  Hugging Face model, a directory ``from_pretrained`` can read.

Data: ``--data synthetic`` (random tokens) or a file of token ids: ``.npy`` / ``.pt`` (1-D array or
tensor) or ``.bin`` (raw uint16 tokens, the nanoGPT format; ``--data-dtype`` for others). Each micro-step
takes dp x micro_batch windows of ``--ctx`` tokens at seeded random offsets; every rank reads the same
full batch and the engine keeps its shard. Labels are the input ids (the model shifts them).

The plan's SP degree (Ulysses x ring), DP degree, ZeRO stage, micro-batch, gradient accumulation and optimizer
offload are applied; ``--sp`` (and ``--ring``, ``--zero``, ``--micro-batch``, ``--grad-accum``) make a plan by
hand. Output: one
line per optimizer step on rank 0 (``--log-json`` also writes them as JSON lines).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from autosp.errors import UsageError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autosp-train",
        description="Train a causal LM sequence-parallel (Ulysses x Ring) under DeepSpeed, as a plan says. Launch one "
                    "process per device with torchrun or the deepspeed launcher.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  torchrun --nproc-per-node 8 $(which autosp-train) --plan plan.json --steps 50\n"
               "  torchrun --nproc-per-node 2 $(which autosp-train) --model llama-3.2-1b --layers 2 --sp 2 "
               "--ctx 4k --dtype fp32 --backend aot_eager\n")
    what = parser.add_argument_group("what to train")
    what.add_argument("--plan", help="plan JSON from autosp-plan --plan-out")
    what.add_argument("--model", help="preset name or a Hugging Face config.json (or its directory); default: the "
                                      "plan's model")
    what.add_argument("--checkpoint", help="state dict (torch.save) or Hugging Face model directory to start from")
    for flag, field in (("--layers", "n_layers"), ("--hidden", "hidden"), ("--heads", "n_heads"),
                        ("--kv-heads", "n_kv_heads"), ("--ffn", "ffn_hidden"), ("--vocab", "vocab")):
        what.add_argument(flag, type=int, dest=field, help=f"override the preset's {field}")
    plan = parser.add_argument_group("hand-made plan (without --plan)")
    plan.add_argument("--sp", type=int, help="sequence-parallel degree; dp = processes / sp")
    plan.add_argument("--ring", type=int, help="ring attention ranks inside the SP group (must divide --sp; Ulysses "
                                               "all-to-alls over sp / ring ranks; default 1, --ring = --sp: pure ring)")
    plan.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="ZeRO stage (default 0)")
    plan.add_argument("--micro-batch", type=int, help="sequences per data-parallel rank per micro-step (default 1)")
    plan.add_argument("--grad-accum", type=int, help="micro-steps per optimizer step (default 1)")
    run = parser.add_argument_group("run")
    run.add_argument("--ctx", help="tokens per sequence, e.g. 4k, 128Ki (default: the plan's)")
    run.add_argument("--steps", type=int, default=10, help="optimizer steps (default 10)")
    run.add_argument("--data", default="synthetic", help="'synthetic' or a token file (.npy, .pt, .bin)")
    run.add_argument("--data-dtype", default="uint16", help="element type of a .bin token file (default uint16)")
    run.add_argument("--dtype", choices=("bf16", "fp32"), help="default: the plan's (bf16 without a plan on GPU, "
                                                                "fp32 on CPU)")
    run.add_argument("--backend", choices=("inductor", "aot_eager"), default="inductor")
    run.add_argument("--lr", type=float, default=1e-4)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--log-json", help="also write one JSON object per step to this file (rank 0)")
    run.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def _build_model(args, plan, torch):
    """(model, description, vocab)."""
    from autosp.cost_models.catalog.models import resolve_model

    hf_path = None
    if args.model and (os.path.sep in args.model or args.model.endswith(".json") or os.path.isdir(args.model)):
        hf_path = args.model
    if hf_path is not None:
        try:
            import transformers
        except ImportError:
            raise UsageError("a Hugging Face config needs transformers: pip install 'autosp[hf]'") from None
        config_dir = os.path.dirname(hf_path) if hf_path.endswith(".json") else hf_path
        try:
            config = transformers.AutoConfig.from_pretrained(config_dir)
        except (OSError, ValueError) as err:
            raise UsageError(f"cannot read the Hugging Face config {hf_path}: {err}") from None
        config.use_cache = False
        for field, key in (("n_layers", "num_hidden_layers"), ("hidden", "hidden_size"),
                           ("n_heads", "num_attention_heads"), ("n_kv_heads", "num_key_value_heads"),
                           ("ffn_hidden", "intermediate_size"), ("vocab", "vocab_size")):
            if getattr(args, field) is not None:
                setattr(config, key, getattr(args, field))
        if args.hidden is not None or args.n_heads is not None:
            config.head_dim = config.hidden_size // config.num_attention_heads
        if args.checkpoint and os.path.isdir(args.checkpoint):
            model = transformers.AutoModelForCausalLM.from_pretrained(args.checkpoint, config=config,
                                                                      attn_implementation="sdpa")
        else:
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        return model, f"{config.model_type} ({hf_path})", config.vocab_size
    if args.model:
        spec = resolve_model(args.model)
    elif plan is not None:
        spec = plan.model
    else:
        raise UsageError("say what to train: --model PRESET or CONFIG.json, or --plan")
    changes = {f: getattr(args, f) for f in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab")
               if getattr(args, f) is not None}
    if "hidden" in changes or "n_heads" in changes:
        changes["head_dim"] = changes.get("hidden", spec.hidden) // changes.get("n_heads", spec.n_heads)
    try:
        spec = dataclasses.replace(spec, **changes)
    except ValueError as err:
        raise UsageError(f"invalid model override: {err}") from None
    from autosp.compiler.models import Llama

    model = Llama.from_spec(spec)
    return model, f"{spec.name} (reference Llama, {spec.n_params() / 1e6:.1f}M parameters)", spec.vocab


def _load_checkpoint(model, path, torch):
    if not path or os.path.isdir(path):
        return
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError) as err:
        raise UsageError(f"cannot read checkpoint {path}: {err}") from None
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise UsageError(f"checkpoint {path} does not match the model: {len(missing)} missing, "
                         f"{len(unexpected)} unexpected keys (first: {(list(missing) + list(unexpected))[0]})")


class TokenSource:
    """Full batches of token windows, identical on every rank (seeded by step)."""

    def __init__(self, spec: str, vocab: int, seq: int, seed: int, data_dtype: str, torch):
        self.torch, self.vocab, self.seq, self.seed = torch, vocab, seq, seed
        self.tokens = None
        if spec != "synthetic":
            self.tokens = self._load(spec, data_dtype)
            if self.tokens.numel() < seq + 1:
                raise UsageError(f"{spec} holds {self.tokens.numel()} tokens, fewer than one sequence of {seq}")
            top = int(self.tokens.max())
            if top >= vocab:
                raise UsageError(f"{spec} has token id {top} but the model's vocabulary is {vocab}")

    def _load(self, path, data_dtype):
        import numpy as np

        torch = self.torch
        if not os.path.exists(path):
            raise UsageError(f"no data file {path} (or use --data synthetic)")
        if path.endswith(".npy"):
            array = np.load(path, mmap_mode="r")
        elif path.endswith(".pt"):
            tensor = torch.load(path, map_location="cpu", weights_only=True)
            return tensor.reshape(-1).long()
        else:
            try:
                array = np.memmap(path, dtype=np.dtype(data_dtype), mode="r")
            except TypeError:
                raise UsageError(f"unknown --data-dtype {data_dtype}") from None
        return torch.from_numpy(np.asarray(array).reshape(-1).astype(np.int64))

    def batch(self, step: int, rows: int):
        torch = self.torch
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        if self.tokens is None:
            return torch.randint(0, self.vocab, (rows, self.seq), generator=gen)
        starts = torch.randint(0, self.tokens.numel() - self.seq, (rows,), generator=gen)
        return torch.stack([self.tokens[s:s + self.seq] for s in starts.tolist()])


def _peak_memory(torch) -> tuple[float, str]:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30, "GiB device"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "GiB host RSS"


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 1:
        raise UsageError("--steps must be at least 1")
    import warnings

    import torch
    import torch.distributed as dist

    from autosp.compiler.api import compile_model, load_plan
    from autosp.units import parse_ctx

    # DeepSpeed 0.19.8 calls torch's deprecated all_gather_into_tensor on every ZeRO-3 gather.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)

    plan = load_plan(args.plan) if args.plan else None
    if plan is None and args.sp is None:
        raise UsageError("give --plan or --sp")
    if plan is not None and args.ring is not None and args.ring != plan.candidate.ring:
        raise UsageError(f"--ring {args.ring} contradicts the plan's ring={plan.candidate.ring}")
    seq = parse_ctx(args.ctx) if args.ctx else (plan.workload.seq_len if plan is not None else None)
    if seq is None:
        raise UsageError("give --ctx (the sequence length)")
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", args.local_rank or 0)))
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model, description, vocab = _build_model(args, plan, torch)
    _load_checkpoint(model, args.checkpoint, torch)
    dtype = args.dtype or (plan.workload.dtype if plan is not None else ("bf16" if cuda else "fp32"))
    options = dict(dtype=dtype, backend=args.backend, lr=args.lr)
    if plan is None:
        options.update(sp_size=args.sp, ring_size=args.ring, zero_stage=args.zero, micro_batch=args.micro_batch or 1,
                       grad_accum=args.grad_accum)
    engine = compile_model(model, plan=plan, **options)
    c = engine.candidate
    data = TokenSource(args.data, vocab, seq, args.seed, args.data_dtype, torch)
    rows = c.dp * c.micro_batch
    log = open(args.log_json, "w", encoding="utf-8") if args.log_json and rank == 0 else None
    if rank == 0:
        print(f"autosp-train: {description}; {c.short()}; {seq} tokens x {rows} sequences per micro-step, "
              f"{c.grad_accum} micro-steps per step; {dtype}, {args.backend}; world {dist.get_world_size()}",
              flush=True)
    try:
        for step in range(args.steps):
            start = time.perf_counter()
            losses = []
            for micro in range(c.grad_accum):
                ids = data.batch(step * c.grad_accum + micro, rows)
                loss = engine(input_ids=ids, labels=ids)
                engine.backward(loss)
                engine.step()
                losses.append(loss.item())
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            peak, unit = _peak_memory(torch)
            record = {"step": step + 1, "loss": sum(losses) / len(losses), "step_time_s": seconds,
                      "tokens_per_s": rows * seq * c.grad_accum / seconds, "peak_memory_gib": peak,
                      "memory": unit}
            if rank == 0:
                print(f"step {step + 1:>4}  loss {record['loss']:.4f}  step time {seconds:.3f} s  "
                      f"{record['tokens_per_s']:.0f} tokens/s  peak memory {peak:.2f} {unit}", flush=True)
                if log:
                    log.write(json.dumps(record) + "\n")
                    log.flush()
    finally:
        if log:
            log.close()
    return 0


if __name__ == "__main__":
    from autosp.cli import train_main

    sys.exit(train_main())
