"""``autosp-train``'s flags for text data, the optimizer schedule, evaluation and logging; their checks
(before any model is built) and what they build (data sources, :class:`OptimizerOptions`).

Kept out of :mod:`autosp.compiler.train_cli` so that module stays the wiring of one run.
"""

from __future__ import annotations

import math
import os

from autosp.errors import UsageError


def default_data_workers() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def add_arguments(parser) -> None:
    data = parser.add_argument_group("text data (--data FILE.jsonl | .txt | .parquet | save_to_disk DIR)")
    data.add_argument("--text-field", default="text",
                      help="the field (.jsonl) or column (.parquet, save_to_disk) holding each document's text "
                           "(default: text); a .txt file's documents are its paragraphs (separated by blank or "
                           "whitespace-only lines)")
    data.add_argument("--tokenizer", metavar="DIR",
                      help="Hugging Face tokenizer directory for text data (default: the --model directory's)")
    data.add_argument("--data-workers", type=int, default=default_data_workers(), metavar="N",
                      help="processes that tokenize text data the first time it is read (datasets' map num_proc; "
                           f"default min(8, CPUs): {default_data_workers()} here); later runs read the token cache")
    optim = parser.add_argument_group("optimizer (AdamW) and learning-rate schedule")
    optim.add_argument("--min-lr", type=float, default=0.0, help="the rate linear and cosine decay to by the last "
                                                                 "step (default 0)")
    optim.add_argument("--warmup", type=int, default=0, metavar="N",
                       help="linear warmup over the first N steps: step k (from 0) trains at lr (k+1)/N (default 0)")
    optim.add_argument("--lr-schedule", choices=("constant", "linear", "cosine"), default="constant",
                       help="after warmup: constant lr, or linear / cosine decay from lr to --min-lr at the last "
                            "step (default constant)")
    optim.add_argument("--weight-decay", type=float, default=None,
                       help="AdamW's decoupled weight decay (default 0.01, torch's)")
    optim.add_argument("--grad-clip", type=float, default=None,
                       help="clip the global gradient norm to this (default 1.0; 0: no clipping)")
    ev = parser.add_argument_group("evaluation and logging")
    ev.add_argument("--eval-data", metavar="FILE",
                    help="held-out data (text as --data, or a token file) evaluated under the same SP plan")
    ev.add_argument("--eval-every", type=int, metavar="N", help="evaluate every N steps and after the last")
    ev.add_argument("--eval-steps", type=int, metavar="K",
                    help="evaluate the first K batches of --eval-data only (default: all of it)")
    ev.add_argument("--tensorboard", metavar="DIR", help="also write every step's scalars as TensorBoard event "
                                                         "files in DIR (rank 0)")


def check(args) -> None:
    """Flag values no run can use (one line each)."""
    if not math.isfinite(args.min_lr) or args.min_lr < 0:
        raise UsageError(f"--min-lr must be a finite number >= 0, got {args.min_lr!r}")
    if args.min_lr > args.lr:
        raise UsageError(f"--min-lr {args.min_lr:g} is above --lr {args.lr:g}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be a number of steps >= 0, got {args.warmup}")
    if args.warmup > args.steps:
        raise UsageError(f"--warmup {args.warmup} is longer than the run's --steps {args.steps}")
    for flag, value in (("--weight-decay", args.weight_decay), ("--grad-clip", args.grad_clip)):
        if value is not None and (not math.isfinite(value) or value < 0):
            raise UsageError(f"{flag} must be a finite number >= 0, got {value!r}")
    for flag, value in (("--eval-every", args.eval_every), ("--eval-steps", args.eval_steps),
                        ("--data-workers", getattr(args, "data_workers", 1))):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be a positive integer, got {value}")
    if (args.eval_every is not None or args.eval_steps is not None) and args.eval_data is None:
        raise UsageError("--eval-every / --eval-steps evaluate --eval-data FILE: give it")
    if args.eval_data is not None and args.eval_every is None:
        raise UsageError("--eval-data needs --eval-every N (evaluate every N steps)")
    from autosp.compiler.training.logging import check_tensorboard

    check_tensorboard(args.tensorboard)


def optimizer_options(args):
    from autosp.compiler.training.schedule import DEFAULT_WEIGHT_DECAY, OptimizerOptions

    return OptimizerOptions(lr=args.lr, min_lr=args.min_lr, warmup=args.warmup, schedule=args.lr_schedule,
                            total_steps=args.steps,
                            weight_decay=DEFAULT_WEIGHT_DECAY if args.weight_decay is None else args.weight_decay)


def _tokenizer_dir(args, facts) -> str | None:
    if args.tokenizer:
        return args.tokenizer
    if facts.hf_path is not None:
        return facts.hf_path if os.path.isdir(facts.hf_path) else os.path.dirname(facts.hf_path) or "."
    return None


def _text_tokens(path: str, flag: str, args, facts, show: bool):
    from autosp.compiler.data.documents import data_kind
    from autosp.compiler.data.tokens import load_tokenizer, tokenized

    data_kind(path, flag)  # a missing path or unknown type said before asking for a tokenizer

    if getattr(args, "_tokenizer", None) is None:
        tokenizer = load_tokenizer(_tokenizer_dir(args, facts))
        vocab = facts.spec.vocab
        if len(tokenizer) > vocab:
            raise UsageError(f"the tokenizer has {len(tokenizer):,} tokens and the model's vocabulary {vocab:,}: "
                             "use the model's own tokenizer (--tokenizer), or a model with a larger --vocab")
        args._tokenizer = tokenizer
    return tokenized(path, args.text_field, args._tokenizer, show=show, flag=flag,
                     workers=getattr(args, "data_workers", 1))


def _file_stream(tokens, separators):
    """A token file as a TokenizedData: documents end at the separators (one document without)."""
    import numpy as np

    from autosp.compiler.data.tokens import TokenizedData

    ends = np.nonzero(np.isin(np.asarray(tokens), np.asarray(separators or (), dtype=np.int64)))[0] + 1
    starts = np.unique(np.concatenate([[0], ends[ends < tokens.size], [tokens.size]])).astype(np.int64)
    return TokenizedData(tokens=tokens, starts=starts, key=f"token-file-{tokens.size}", cached=False, path="")


def prepare_data(args, facts, seq: int, show: bool) -> dict:
    """Text data tokenized (or read from the token cache) before any model is built: ``{"train": TokenizedData
    or None, "eval": TokenizedData or None}``; a token-file ``--eval-data`` is opened and checked."""
    from autosp.compiler import preflight
    from autosp.compiler.data import is_text_data

    out = {"train": None, "eval": None, "pad": 0}
    if args.data != "synthetic" and is_text_data(args.data):
        if args.doc_sep is not None:
            raise UsageError("--doc-sep is for token files; text documents are separated by the tokenizer's EOS")
        out["train"] = _text_tokens(args.data, "--data", args, facts, show)
    if args.eval_data is not None:
        if is_text_data(args.eval_data) or not os.path.splitext(args.eval_data)[1].lower() in preflight.TOKEN_SUFFIXES:
            out["eval"] = _text_tokens(args.eval_data, "--eval-data", args, facts, show)
        else:
            tokens = preflight.open_tokens(args.eval_data, args.data_dtype, facts.spec.vocab, 1)
            out["eval"] = _file_stream(tokens, getattr(args, "separators", None))
    tokenizer = getattr(args, "_tokenizer", None)
    if tokenizer is not None:
        out["pad"] = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return out


def text_sources(prepared: dict, seq: int, seed: int, torch):
    """(train source or None, eval source or None) over the prepared token streams."""
    from autosp.compiler.data.sources import PackedTextSource

    train = PackedTextSource(prepared["train"], seq, seed, prepared["pad"], torch) if prepared["train"] else None
    evaluation = (PackedTextSource(prepared["eval"], seq, seed, prepared["pad"], torch, shuffle=False)
                  if prepared["eval"] else None)
    return train, evaluation


__all__ = ["add_arguments", "check", "optimizer_options", "prepare_data", "text_sources"]
