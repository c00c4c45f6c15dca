"""``autosp-train``: train a causal LM sequence-parallel under a plan, printing loss, step time and peak
memory per optimizer step.

One process per device; autosp-train starts them itself, on one machine or on each of several (the
rendezvous flags are torchrun's), or a launcher does (every process gets the same arguments)::

    autosp-train --nproc-per-node 4 --plan plan.json --steps 20
    autosp-train --nnodes 2 --node-rank 0 --master-addr HOST --nproc-per-node 4 --plan plan.json   # on HOST
    autosp-train --nnodes 2 --node-rank 1 --master-addr HOST --nproc-per-node 4 --plan plan.json   # on the other
    torchrun --nnodes 2 --nproc-per-node 4 ... -m autosp.compiler.train_cli --plan plan.json --steps 20
    deepspeed --hostfile hosts --num_gpus 4 $(which autosp-train) --plan plan.json --steps 20
    autosp-train --model llama-3.2-1b --layers 2 --sp 1 --ctx 2k      # one process

``autosp-plan ... --emit slurm job.sbatch`` writes the Slurm job of a plan (``srun`` running the
``--nnodes`` form on every node), ``--emit hostfile hosts`` the deepspeed launcher's hostfile.

Everything that can be checked without the model (the plan's process count against the launch, heads
against the SP degree, the data file, the log path, host memory for the weights) is checked first, once
(:mod:`autosp.compiler.preflight`); bad input is one line on stderr, printed by rank 0 only.

What is trained:

- ``--model PRESET`` (see ``autosp-plan --list-models``) builds the project's reference Llama
  (:mod:`autosp.compiler.models.llama`) from the preset's shape; ``--model path/config.json`` (or its
  directory) builds the Hugging Face model of that config with ``transformers`` (SDPA attention); with
  ``--plan`` and no ``--model`` the plan's model is used. ``--layers/--hidden/--heads/--kv-heads/--ffn/
  --vocab`` shrink a preset (e.g. to try a plan on CPU).
- Weights are random (``--seed``) unless ``--checkpoint`` names a ``torch.save``d state dict, an autosp
  checkpoint (its weights) or, for a Hugging Face model, a directory ``from_pretrained`` can read.

Checkpoints (:mod:`autosp.compiler.training`): ``--save-dir DIR --save-every N --keep-last K`` save the whole
training state atomically (also at the last step and on SIGTERM/SIGINT, which finish the step, save and exit
0); ``--resume`` continues from the newest complete one under this run's plan, which may differ from the saved
one; ``--export-hf HF_DIR`` writes a Hugging Face model directory at the end (``autosp-export`` does it later).

Text data: ``--data`` a ``.jsonl`` (``--text-field``, default ``text``), ``.txt`` (paragraphs), ``.parquet``
or a ``datasets`` ``save_to_disk`` directory: tokenized once with ``--tokenizer DIR`` (default: the model
directory's) and cached, each document ended by EOS, packed into ``--ctx`` sequences trained document by
document, shuffled by ``--seed`` (:mod:`autosp.compiler.data`). Optimizer: AdamW, ``--lr --min-lr --warmup
--lr-schedule --weight-decay --grad-clip`` (:mod:`autosp.compiler.training.schedule`); ``--eval-data
--eval-every [--eval-steps]``: held-out loss under the same plan; ``--tensorboard DIR``
(:mod:`autosp.compiler.training.logging` says what each logged figure means).

Token data: ``--data synthetic`` (random tokens) or a file of token ids: ``.npy`` / ``.pt`` (1-D array or
tensor) or ``.bin`` (raw uint16 tokens, the nanoGPT format; ``--data-dtype`` for others). Each micro-step
takes dp x micro_batch windows of ``--ctx`` tokens at seeded random offsets; every rank reads the same
full batch and the engine keeps its shard. Labels are the input ids (the model shifts them).

Packed documents: ``--doc-sep ID`` (or ``--doc-sep eos``: the Hugging Face config's ``eos_token_id``) says
the token file is documents each ended by that separator; every sequence of ``--ctx`` tokens then starts at
a document start and packs the documents that follow with Hugging Face's ``position_ids`` (restarting at 0
per document) and labels (-100 at each document's first token), and the engine trains every document on
its own (attention never crosses a document): :mod:`autosp.compiler.packing`.

The plan's SP degree (Ulysses x ring), DP degree, ZeRO stage, micro-batch, gradient accumulation and optimizer
offload are applied; ``--sp`` (and ``--ring``, ``--zero``, ``--micro-batch``, ``--grad-accum``) make a plan by
hand. Output: one line per optimizer step on rank 0 (``--log-json`` also writes them as JSON lines).
"""

from __future__ import annotations

import argparse
import os
import sys

from autosp.errors import UsageError


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one UsageError line (exit 2) instead of the usage text."""

    def error(self, message):
        raise UsageError(f"{message} (see autosp-train --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="autosp-train",
        description="Train a causal LM sequence-parallel (Ulysses x Ring) under DeepSpeed, as a plan says: one process "
                    "per device, started by --nproc-per-node N on one machine, by --nnodes K --node-rank R "
                    "--master-addr HOST on each of K machines, or by torchrun or the deepspeed launcher.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  autosp-train --nproc-per-node 8 --plan plan.json --steps 50\n"
               "  autosp-train --nproc-per-node 2 --model llama-3.2-1b --layers 2 --sp 2 --ctx 4k --dtype fp32 "
               "--backend aot_eager\n"
               "  autosp-train --nnodes 2 --node-rank 0 --master-addr HOST --nproc-per-node 8 --plan plan.json   # on "
               "HOST\n"
               "  autosp-train --nnodes 2 --node-rank 1 --master-addr HOST --nproc-per-node 8 --plan plan.json   # on "
               "the other node\n"
               "  autosp-plan --model llama-3.1-8b --ctx 4M --hw h100x32 --emit slurm job.sbatch && sbatch job.sbatch"
               "   # Slurm\n"
               "  torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 -m autosp.compiler.train_cli "
               "--plan plan.json\n"
               "  autosp-train --nproc-per-node 8 --plan plan.json --steps 1000 --data corpus.jsonl --tokenizer ./model "
               "--lr 3e-4 --warmup 100 --lr-schedule cosine --eval-data heldout.jsonl --eval-every 100 --tensorboard tb\n"
               "\nEach step rank 0 prints loss (the token-weighted mean over every target of the step), lr, gradient "
               "norm, tokens/s (real tokens, each counted once), MFU (with a plan: the cost model's FLOPs per token over "
               "the plan's hardware peak) next to the plan's prediction, peak memory and an ETA.\n")
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
    run.add_argument("--data", default="synthetic", help="'synthetic', a token file (.npy, .pt, .bin) or text (.jsonl, "
                                                         ".txt, .parquet, a save_to_disk directory)")
    run.add_argument("--data-dtype", default="uint16", help="element type of a .bin token file (default uint16)")
    run.add_argument("--doc-sep", metavar="ID|eos",
                     help="the token file holds documents ended by this separator id ('eos': the Hugging Face "
                          "config's eos_token_id): pack them into --ctx sequences, each document trained on its own")
    run.add_argument("--dtype", choices=("bf16", "fp32"), help="default: the plan's (bf16 without a plan on GPU, "
                                                                "fp32 on CPU)")
    run.add_argument("--backend", choices=("inductor", "aot_eager"),
                     help="torch.compile backend (default: the one the plan was priced for, its compile_backend, "
                          "aot_eager for a plan of an uncompiled step; inductor without a plan)")
    run.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (the peak of a schedule; default 1e-4)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--log-json", help="also write one JSON object per step to this file (rank 0)")
    run.add_argument("--nproc-per-node", type=int, metavar="N",
                     help="start N training processes on this machine (one per GPU; the plan's sp x dp); not "
                          "needed under torchrun or the deepspeed launcher")
    run.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    nodes = parser.add_argument_group(
        "several machines (torchrun's static rendezvous: run the same command on every node, each with its own "
        "--node-rank; the nodes check that they agree before any model is built)")
    nodes.add_argument("--nnodes", type=int, metavar="K", help="machines in the run (default 1)")
    nodes.add_argument("--node-rank", type=int, metavar="R", help="this machine's number, 0..K-1 (0: the one at "
                                                                  "--master-addr); under Slurm $SLURM_NODEID")
    nodes.add_argument("--master-addr", metavar="HOST", help="node 0's address, reachable from every node")
    nodes.add_argument("--master-port", type=int, metavar="P", help="a free TCP port on node 0 (default 29500)")
    nodes.add_argument("--rdzv-timeout", type=int, metavar="S",
                       help="seconds the nodes wait for each other at the start before giving up with one line "
                            "(default 600)")
    from autosp.compiler.training import options  # text data, schedule, evaluation, TensorBoard

    options.add_arguments(parser)
    from autosp.compiler.training import run_checkpoints

    run_checkpoints.add_arguments(parser)  # --save-dir --save-every --keep-last --resume --export-hf
    return parser


def _attn_implementation(config) -> str:
    """What transformers builds the model with: SDPA, or eager attention for soft-capped Gemma 2 and gpt-oss's
    attention sinks (transformers has no SDPA path for them), which autosp replaces by its own ops
    (compiler/softcapping.py, compiler/sinks.py)."""
    from autosp.cost_models.architectures import ATTENTION_SINK_TYPES

    if getattr(config, "attn_logit_softcapping", None) or getattr(config, "model_type", "") in ATTENTION_SINK_TYPES:
        return "eager"
    return "sdpa"


def _build_model(args, facts, torch):
    """(model, description, vocab) of the checked :class:`~autosp.compiler.preflight.ModelFacts`."""
    if facts.hf_path is not None:
        from autosp.compiler.preflight import hf_model_class

        _, config = hf_model_class(facts)
        import transformers

        config.use_cache = False
        spec = facts.spec
        for field, key in (("n_layers", "num_hidden_layers"), ("hidden", "hidden_size"),
                           ("n_heads", "num_attention_heads"), ("n_kv_heads", "num_key_value_heads"),
                           ("ffn_hidden", "intermediate_size"), ("vocab", "vocab_size")):
            if getattr(args, field) is not None:
                setattr(config, key, getattr(spec, field))
        if args.hidden is not None or args.n_heads is not None:
            config.head_dim = spec.head_dim
        if args.checkpoint and os.path.isdir(args.checkpoint) and not args.warm_start:
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    args.checkpoint, config=config, attn_implementation=_attn_implementation(config))
            except (OSError, ValueError, RuntimeError) as err:
                raise UsageError(f"cannot load the checkpoint {args.checkpoint}: {str(err).splitlines()[0][:200]}") from None
        else:
            model = transformers.AutoModelForCausalLM.from_config(
                config, attn_implementation=_attn_implementation(config))
        return model, f"{config.model_type} ({facts.hf_path})", config.vocab_size
    from autosp.compiler.models import Llama

    spec = facts.spec
    model = Llama.from_spec(spec)
    return model, f"{spec.name} (reference Llama, {spec.n_params() / 1e6:.1f}M parameters)", spec.vocab


def _load_checkpoint(model, path, torch, warm_start=None):
    if warm_start:  # an autosp checkpoint (autosp.compiler.training.run_checkpoints)
        from autosp.compiler.training.run_checkpoints import load_warm_start

        return load_warm_start(model, warm_start)
    if not path or os.path.isdir(path):
        return
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - not a torch file, truncated, pickled objects: all the same to the user
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        raise UsageError(f"cannot read checkpoint {path} (a torch.save'd state dict of tensors): {first}") from None
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise UsageError(f"checkpoint {path} holds a {type(state).__name__}, not a state dict")
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # a tensor of the wrong shape
        raise UsageError(f"checkpoint {path} does not match the model: {str(err).splitlines()[-1].strip()[:200]}") from None
    if missing or unexpected:
        raise UsageError(f"checkpoint {path} does not match the model: {len(missing)} missing, "
                         f"{len(unexpected)} unexpected keys (first: {(list(missing) + list(unexpected))[0]})")


class TokenSource:
    """Full batches of token windows, identical on every rank (seeded by step). ``tokens`` is the checked
    array of :func:`autosp.compiler.preflight.open_tokens` (memory-mapped: only the windows are read)."""

    def __init__(self, tokens, vocab: int, seq: int, seed: int, torch):
        self.torch, self.vocab, self.seq, self.seed, self.tokens = torch, vocab, seq, seed, tokens

    def fingerprint(self) -> dict:
        """What decides every batch besides the micro-step index (a checkpoint records it)."""
        from autosp.compiler.data.identity import token_array_key

        return {"kind": "token-file" if self.tokens is not None else "synthetic", "tokens_key":
                token_array_key(self.tokens), "seq": self.seq, "seed": self.seed, "vocab": self.vocab}

    def batch(self, step: int, rows: int):
        import numpy as np

        torch = self.torch
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        if self.tokens is None:
            return torch.randint(0, self.vocab, (rows, self.seq), generator=gen)
        starts = torch.randint(0, self.tokens.size - self.seq, (rows,), generator=gen)
        return torch.from_numpy(np.stack([np.asarray(self.tokens[s:s + self.seq], dtype=np.int64)
                                          for s in starts.tolist()]))


def _preflight(args, argv):
    """Everything checked before torch builds anything (autosp.compiler.preflight); returns what main
    needs: (launch, plan, candidate, facts, seq, tokens)."""
    from autosp.compiler import preflight
    from autosp.compiler.api import hand_made_candidate, load_plan, resolve_candidate
    from autosp.units import parse_ctx

    preflight.check_numbers(args)
    from autosp.compiler.data import is_text_data
    from autosp.compiler.training import options

    options.check(args)
    launch = preflight.launch_from_env(args.nproc_per_node, args.nnodes, args.node_rank, args.master_addr,
                                       args.master_port, args.rdzv_timeout)
    if args.log_json:
        from autosp.files import check_output

        check_output(args.log_json, "--log-json")
    if args.checkpoint and not os.path.exists(args.checkpoint):
        raise UsageError(f"--checkpoint {args.checkpoint} does not exist")
    plan = load_plan(args.plan) if args.plan else None
    if plan is None and args.sp is None:
        raise UsageError("give --plan or --sp")
    if plan is not None and args.ring is not None and args.ring != plan.candidate.ring:
        raise UsageError(f"--ring {args.ring} contradicts the plan's ring={plan.candidate.ring}")
    seq = parse_ctx(args.ctx) if args.ctx else (plan.workload.seq_len if plan is not None else None)
    if seq is None:
        raise UsageError("give --ctx (the sequence length)")
    facts = preflight.model_facts(args, plan)
    if plan is None and launch.world % args.sp:
        how = (f"--nproc-per-node {args.sp} (or a multiple) on one machine" if launch.nnodes == 1 else
               f"an --nnodes x --nproc-per-node that is a multiple of {args.sp}")
        raise UsageError(f"--sp {args.sp} needs a multiple of {args.sp} processes and this launch has {launch.world}"
                         f"{f' ({launch.shape()})' if launch.nnodes > 1 else ''}: use {how}")
    if plan is not None:
        candidate, _ = resolve_candidate(plan, args.sp, launch.world)
    else:  # --sp and the knob flags: a hand-made plan
        candidate = hand_made_candidate(args.sp, launch.world, zero_stage=args.zero,
                                        micro_batch=args.micro_batch or 1, grad_accum=args.grad_accum, ring=args.ring)
    preflight.check_parallel(candidate, facts, launch, args.plan)
    if facts.hf_path is not None:
        preflight.hf_model_class(facts)  # transformers knows it, and its attention is SDPA
    preflight.check_host_memory(facts, launch, candidate, seq)
    tokens = None
    if args.data != "synthetic" and not is_text_data(args.data):
        tokens = preflight.open_tokens(args.data, args.data_dtype, facts.spec.vocab, seq)
    if args.doc_sep is not None:
        from autosp.compiler import packing

        if tokens is None:
            raise UsageError("--doc-sep packs the documents of a token file: give --data FILE")
        args.separators = packing.separators(args.doc_sep, facts.hf_config, facts.spec.vocab)
        packing.check_separators(tokens, args.data, args.separators)
    show = (launch.rank == 0 or launch.launcher == "spawn") and not os.environ.get("AUTOSP_TRAIN_DATA_SAID")
    args.prepared = options.prepare_data(args, facts, seq, show=show)  # text tokenized (or read from the cache)
    from autosp.compiler.training import run_checkpoints

    args.resume_from = run_checkpoints.preflight(args, argv, facts)  # --save-dir, --resume, --export-hf
    args.warm_start = run_checkpoints.warm_start_checkpoint(args.checkpoint, facts) if args.checkpoint else None
    return launch, plan, candidate, facts, seq, tokens


def _first_run_notice(what: str, *, cuda: bool = False, offload: bool = False, backend: str = "") -> None:
    """Rank 0 says what a first run spends minutes on before it does (autosp.compiler.training.first_run)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    from autosp.compiler.training import first_run

    line = first_run.op_notice(cuda, offload) if what == "op" else first_run.compile_notice(backend)
    if line:
        print(line, flush=True)


def default_backend(plan) -> str:
    """The torch.compile backend a run without ``--backend`` uses: the one its plan was priced for (the plan's
    ``compile_backend``: an untiled loss costs less memory fused by Inductor; a plan of an uncompiled step is run
    op by op, by aot_eager), Inductor without a plan."""
    planned = plan.workload.compile_backend if plan is not None else "inductor"
    return "inductor" if planned == "inductor" else "aot_eager"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    launch, plan, candidate, facts, seq, tokens = _preflight(args, argv)
    args.backend = args.backend or default_backend(plan)
    if launch.launcher == "spawn":
        from autosp.compiler.train_launch import run_processes, without_launch_flags

        os.environ["AUTOSP_TRAIN_DATA_SAID"] = "1"  # the children find the data this preflight prepared: no repeat
        agree = {"nnodes": launch.nnodes, "nproc_per_node": launch.local_world,  # what the nodes must share
                 "plan": f"{candidate.short()} at {seq} tokens"}
        return run_processes(launch.local_world, main, without_launch_flags(argv), nodes=launch.nodes,
                             node_facts=agree)
    import warnings

    import torch
    import torch.distributed as dist

    from autosp.compiler.api import compile_model
    from autosp.compiler.options import CompileOptions

    # DeepSpeed 0.19.8 calls torch's deprecated all_gather_into_tensor / reduce_scatter_tensor on every ZeRO-3
    # gather and gradient reduction: two lines per rank per step that say nothing to the user.
    warnings.filterwarnings("ignore", message=".*(all_gather_into_tensor|reduce_scatter_tensor).*",
                            category=FutureWarning)

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", args.local_rank or 0)))
    owns_group = not dist.is_initialized()  # then it is ours to destroy at the end (NCCL warns otherwise)
    if owns_group:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:  # one process, no launcher: any free port (29500 may be taken)
            from autosp.compiler.train_launch import free_port

            os.environ["MASTER_PORT"] = str(free_port())
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        import deepspeed

        _first_run_notice("op", cuda=cuda, offload=candidate.offload_optimizer)
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model, description, vocab = _build_model(args, facts, torch)
    _load_checkpoint(model, args.checkpoint, torch, args.warm_start)
    dtype = args.dtype or (plan.workload.dtype if plan is not None else ("bf16" if cuda else "fp32"))
    from autosp.compiler.training import options as training_options

    text_source, eval_source = training_options.text_sources(args.prepared, seq, args.seed, torch)
    packed = args.doc_sep is not None or text_source is not None
    options = CompileOptions(dtype=dtype, backend=args.backend, optim=training_options.optimizer_options(args),
                             gradient_clipping=args.grad_clip, packed=packed or eval_source is not None)
    engine = compile_model(model, plan if plan is not None else candidate, options=options)
    c = engine.candidate
    if text_source is not None:
        data = text_source
    elif packed:
        from autosp.compiler.packing import PackedTokenSource

        data = PackedTokenSource(tokens, seq, args.seed, args.separators, torch)
    else:
        data = TokenSource(tokens, vocab, seq, args.seed, torch)
    rows = c.dp * c.micro_batch
    from autosp.compiler import attention_kernel as kernels
    from autosp.compiler.training.run_checkpoints import Checkpoints

    args.seq = seq
    checkpoints = Checkpoints(args, facts, plan, args.resume_from, rank)
    first_step, micro_index = checkpoints.restore(engine)  # (0, 0) unless --resume
    planned = getattr(plan.hardware, "attention_kernel", "") if plan is not None else ""
    kernel, mismatch = kernels.choose(planned or None, kernels.machine())
    if rank == 0:
        print(f"autosp-train: {description}; {c.short()}; {seq} tokens x {rows} "
              f"{'packed ' if packed else ''}sequences per micro-step, "
              f"{c.grad_accum} micro-steps per step; {dtype}, {args.backend}; world {dist.get_world_size()}; "
              f"attention kernel {kernel}"
              + (f"; data: {data.describe()}" if hasattr(data, "describe") else "")
              + checkpoints.describe_resume(), flush=True)
        if mismatch:
            print(f"autosp-train: warning: {mismatch}", file=sys.stderr, flush=True)
    _first_run_notice("compile", backend=args.backend)
    from autosp.compiler.training.logging import StepLogger
    from autosp.compiler.training.loop import Trainer

    logger = StepLogger(steps=args.steps, seq=seq, candidate=c, plan=plan, world=dist.get_world_size(),
                        log_json=args.log_json, tensorboard=args.tensorboard, rank=rank,
                        model=facts.spec)
    if rank == 0 and logger.plan_difference:
        print(f"autosp-train: note: {logger.plan_difference}, so its steps are not compared with the plan's "
              f"predicted time and MFU (MFU is this model's FLOPs over {plan.hardware.name}'s peak)", flush=True)

    def save_or_stop(trainer, record) -> bool:  # --save-every, the last step, SIGTERM/SIGINT (saved, then stop)
        return checkpoints.after_step(engine, trainer.step_index, trainer.micro_steps,
                                      last=trainer.step_index == args.steps)

    trainer = Trainer(engine, data, logger, steps=args.steps, rows=rows, start_step=first_step,
                      start_micro=micro_index, eval_source=eval_source, eval_every=args.eval_every or 0,
                      eval_steps=args.eval_steps, hooks=[save_or_stop])
    with kernels.sdpa_context(kernel if cuda else None):  # the step's SDPA calls run on the chosen kernel first
        trainer.run()
    if not trainer.stop:  # (a stop by SIGTERM/SIGINT has saved already)
        checkpoints.finish(engine, args.steps, trainer.micro_steps)
    if owns_group:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from autosp.cli import train_main

    sys.exit(train_main())


__all__ = ["TokenSource", "build_parser", "default_backend", "main"]
