"""``autosp-train``'s checkpoint flags: ``--save-dir --save-every --keep-last --resume --export-hf``.

The hooks ``train_cli`` calls, in order: :func:`add_arguments` (the flags), :func:`preflight` (before any
model is built: the save directory, the checkpoint to resume from and whether it fits this run),
:class:`Checkpoints` (after the engine exists: :meth:`~Checkpoints.restore`, then :meth:`~Checkpoints.after_step`
once per optimizer step, which also answers SIGTERM/SIGINT, then :meth:`~Checkpoints.finish`).

What a resumed run continues from. Every data source of ``autosp-train`` makes the batch of a micro-step as a
pure function of (seed, global micro-step index), so the checkpoint records the optimizer step, the micro-step
count, the seed and the data's fingerprint (path and size); the resumed run reads exactly the batches the
uninterrupted run would have read, under any plan with the same global batch (dp x micro-batch sequences).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict

from autosp.errors import UsageError

__all__ = ["Checkpoints", "Resume", "add_arguments", "data_fingerprint", "preflight"]

# the model fields two runs must share for one's checkpoint to load into the other's model
SHAPE_FIELDS = ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn_hidden", "gated_mlp", "qkv_bias",
                "tied_embeddings")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "checkpoints (every rank writes its part; any plan resumes any other's; format: docs/checkpoints.md in "
        "the source)")
    group.add_argument("--save-dir", metavar="DIR",
                       help="save checkpoints under DIR (DIR/step-N/, DIR/latest), every --save-every steps, at the "
                            "last step and on SIGTERM/SIGINT; written atomically")
    group.add_argument("--save-every", type=int, metavar="N", help="save every N optimizer steps (default: only at "
                                                                    "the last step and when stopped)")
    group.add_argument("--keep-last", type=int, metavar="K", help="keep only the newest K checkpoints in --save-dir")
    group.add_argument("--async-save", action="store_true",
                       help="write the --save-every checkpoints in the background (torch.distributed.checkpoint's "
                            "async_save) while training goes on; costs a host-memory copy of each rank's share of "
                            "the checkpoint; the last save and a stop by a signal wait for their files")
    group.add_argument("--resume", action="store_true",
                       help="continue from the newest complete checkpoint in --save-dir (weights, optimizer, LR "
                            "schedule, data position, RNG), under this run's plan, which may differ from the saved "
                            "one (SP degree, ring, ZeRO stage, GPU count); --steps counts from the start of the run")
    group.add_argument("--export-hf", metavar="HF_DIR",
                       help="at the end, write the trained model as a Hugging Face model directory (safetensors + "
                            "config.json + tokenizer) that transformers.AutoModelForCausalLM.from_pretrained loads; "
                            "also: autosp-export CHECKPOINT --out HF_DIR")


class Resume:
    """The checkpoint a run continues from, read and checked in preflight."""

    def __init__(self, path: str, meta: dict):
        self.path, self.meta = path, meta
        self.state = meta.get("client_state", {})

    @property
    def step(self) -> int:
        return int(self.state.get("step", self.meta.get("step", 0)))


def data_fingerprint(args) -> dict:
    """What identifies the training data: its path and size (a changed file is another dataset)."""
    data = getattr(args, "data", "synthetic")
    if data == "synthetic":
        return {"path": "synthetic"}
    path = os.path.abspath(data)
    try:
        size = os.path.getsize(path) if os.path.isfile(path) else sum(
            os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)
    except OSError:
        size = None
    return {"path": path, "size": size, "doc_sep": getattr(args, "doc_sep", None)}


def _tokenizer_used(args) -> str | None:
    """The tokenizer directory the run's text data was tokenized with (``--tokenizer``, or the model directory's
    by default), which the checkpoint names so that an export carries its files."""
    loaded = getattr(args, "_tokenizer", None)  # set by the text-data preflight when text was read
    path = getattr(loaded, "name_or_path", None) or getattr(args, "tokenizer", None)
    return os.path.abspath(path) if path and os.path.isdir(path) else None


def _explicit(argv, flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def preflight(args, argv, facts) -> Resume | None:
    """The checkpoint flags, checked before anything is built; the checkpoint to resume from (or None)."""
    for flag, value in (("--save-every", args.save_every), ("--keep-last", args.keep_last)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be a positive integer, got {value}")
    if (args.save_every or args.keep_last or args.resume or args.async_save) and not args.save_dir:
        flag = ("--resume" if args.resume else "--save-every" if args.save_every else
                "--keep-last" if args.keep_last else "--async-save")
        raise UsageError(f"{flag} needs --save-dir DIR (where the checkpoints are)")
    if args.export_hf:
        from autosp.compiler.training.export import check_out_dir

        check_out_dir(args.export_hf, "--export-hf")
    resume = None
    if args.resume:
        from autosp.compiler.training.checkpoint import read_meta
        from autosp.compiler.training.save_dir import find_resume

        path = find_resume(args.save_dir)
        resume = Resume(path, read_meta(path))
        _check_compatible(resume, args, argv, facts)
    if args.save_dir:
        from autosp.compiler.training.save_dir import check_save_dir, checkpoint_bytes

        check_save_dir(args.save_dir, checkpoint_bytes(facts.spec.n_params()))
    return resume


def _check_compatible(resume: Resume, args, argv, facts) -> None:
    """One line, before anything is built or overwritten, when the checkpoint cannot continue this run."""
    where = resume.path
    saved = resume.state.get("model_spec")
    if not saved:
        raise UsageError(f"checkpoint {where} was not saved by autosp-train (no model shape in it); load it with "
                         "engine.load_checkpoint from Python")
    spec = asdict(facts.spec)
    if saved.get("vocab") != spec["vocab"]:
        raise UsageError(f"checkpoint {where} has a vocabulary of {saved.get('vocab'):,} tokens and this model "
                         f"{spec['vocab']:,}: it belongs to another model or tokenizer")
    differ = [f"{k} {saved.get(k)} vs {spec[k]}" for k in SHAPE_FIELDS if saved.get(k) != spec[k]]
    if differ:
        raise UsageError(f"checkpoint {where} holds another model ({', '.join(differ[:3])}: the checkpoint's vs "
                         "this run's); resume with the model it was saved from")
    if resume.state.get("data") != data_fingerprint(args):
        old = resume.state.get("data", {})
        raise UsageError(f"checkpoint {where} was trained on --data {old.get('path')} ({old.get('size')} bytes) and "
                         f"this run reads {data_fingerprint(args).get('path')}: a resumed run must read the same data "
                         "to see the same batches")
    seed = resume.state.get("seed")
    if seed is not None and args.seed != seed:
        if _explicit(argv, "--seed"):
            raise UsageError(f"--seed {args.seed} differs from the checkpoint's seed {seed}: the resumed run would "
                             f"see other batches; drop --seed (or pass --seed {seed})")
        args.seed = seed  # the data order is the checkpoint's
    if resume.step >= args.steps:
        raise UsageError(f"checkpoint {where} is at step {resume.step} and --steps is {args.steps}: nothing left to "
                         f"train; raise --steps (it counts from the start of the run)")


class Checkpoints:
    """Saving, resuming and stopping for one training run."""

    def __init__(self, args, facts, plan, resume: Resume | None, rank: int):
        self.args, self.facts, self.plan, self.resume, self.rank = args, facts, plan, resume, rank
        self.last_saved: str | None = None
        self.pending = None  # an asynchronous save under way (checkpoint.PendingSave)
        self.stop = None
        if args.save_dir:
            from autosp.compiler.training.signals import StopRequest

            self.stop = StopRequest().install()

    # -- start --------------------------------------------------------------------------------------
    def restore(self, engine) -> tuple[int, int]:
        """Load the checkpoint (under this run's plan) into ``engine``: (first step, next micro-step index)."""
        if self.resume is None:
            return 0, 0
        engine.load_checkpoint(self.resume.path)
        state = self.resume.state
        return int(state["step"]), int(state["micro_step"])

    def describe_resume(self) -> str:
        if self.resume is None:
            return ""
        was = self.resume.meta.get("plan", "?")
        return f"; resumed from {self.resume.path} (step {self.resume.step}, saved under {was})"

    # -- every step ----------------------------------------------------------------------------------
    def client_state(self, step: int, micro_step: int) -> dict:
        args = self.args
        state = {"step": step, "micro_step": micro_step, "seed": args.seed, "data": data_fingerprint(args),
                 "model_spec": asdict(self.facts.spec), "hf_config": self.facts.hf_path and os.path.abspath(
                     self.facts.hf_path), "ctx": getattr(args, "seq", None),
                 "tokenizer": _tokenizer_used(args),
                 "argv": getattr(args, "argv", None)}
        if self.plan is not None:
            state["plan"] = self.plan.to_dict()
        return state

    def after_step(self, engine, step: int, micro_step: int, last: bool) -> bool:
        """Save when due; True when the run must stop now (a signal arrived: saved, message printed)."""
        if self.pending is not None and self.pending.poll():  # rank 0: the background write just completed
            self._published(self.pending.directory)
        stopping = self.stop is not None and self.stop.agreed()
        due = self.args.save_dir and (last or stopping or (self.args.save_every and step % self.args.save_every == 0))
        if due:  # the last save and a stop's are waited for: the run ends right after them
            self.save(engine, step, micro_step, asynchronous=self.args.async_save and not (last or stopping))
        if stopping:
            if self.rank == 0:
                print(f"autosp-train: stopped by {self.stop.name} after step {step}; saved {self.last_saved}; to "
                      "continue, run the same autosp-train command with --resume", flush=True)
            return True
        return False

    def save(self, engine, step: int, micro_step: int, asynchronous: bool = False) -> str:
        """Save step ``step`` into --save-dir (after the previous asynchronous save is complete); with
        ``asynchronous`` the files are written in the background and published later (:meth:`after_step`,
        :meth:`wait`). Returns the checkpoint's path."""
        from autosp.compiler.training.checkpoint import save_engine_checkpoint
        from autosp.compiler.training.save_dir import step_dir

        self.wait()
        saved = save_engine_checkpoint(engine, step_dir(self.args.save_dir, step), self.client_state(step, micro_step),
                                       asynchronous=asynchronous)
        if asynchronous:
            self.pending = saved
            return saved.directory
        self._published(saved)
        return saved

    def wait(self) -> None:
        """Wait for an asynchronous save under way and publish it (collective)."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        announced = pending.published
        path = pending.wait()
        if not announced:
            self._published(path)

    def _published(self, path: str) -> None:
        """A checkpoint is complete: rank 0 points ``latest`` at it and applies --keep-last."""
        from autosp.compiler.training.checkpoint import CheckpointWriteError
        from autosp.compiler.training.save_dir import prune, write_latest

        self.last_saved = path
        if self.rank != 0:
            return
        try:
            write_latest(self.args.save_dir, path)
            prune(self.args.save_dir, self.args.keep_last)
        except OSError as err:
            raise CheckpointWriteError(f"saved {path} but cannot update {self.args.save_dir}/latest: "
                                       f"{err.strerror or err}; --resume still finds {path}") from None

    # -- end --------------------------------------------------------------------------------------------
    def finish(self, engine, step: int, micro_step: int) -> None:
        """--export-hf: the final weights as a Hugging Face model directory (from the last checkpoint, or from a
        temporary one when there is no --save-dir)."""
        if self.stop is not None:
            self.stop.uninstall()
        self.wait()
        if not self.args.export_hf:
            return
        from autosp.compiler.training.checkpoint import _barrier
        from autosp.compiler.training.export import export_hf

        source, temporary = self.last_saved, None
        if source is None:
            parent = os.path.dirname(os.path.abspath(self.args.export_hf))
            temporary = os.path.join(parent, f".{os.path.basename(self.args.export_hf)}.checkpoint")
            source = engine.save_checkpoint(temporary, self.client_state(step, micro_step))
        if self.rank == 0:
            try:
                export_hf(source, self.args.export_hf)
                print(f"autosp-train: exported {self.args.export_hf} (transformers.AutoModelForCausalLM."
                      "from_pretrained loads it)", flush=True)
            finally:
                if temporary is not None:
                    import shutil

                    shutil.rmtree(temporary, ignore_errors=True)
        _barrier()


HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def warm_start_checkpoint(path: str, facts) -> str | None:
    """``--checkpoint DIR``: the autosp checkpoint it names (a checkpoint or a --save-dir: its newest) for a
    warm start (weights only), None for a Hugging Face model directory; one line for a directory with neither
    (an empty directory must not silently mean random weights)."""
    if not os.path.isdir(path):
        return None
    from autosp.compiler.training.save_dir import complete_checkpoints, find_resume

    if os.path.isfile(os.path.join(path, "meta.json")):
        return path
    if complete_checkpoints(path):
        return find_resume(path)
    if facts.hf_path is not None:
        if any(os.path.exists(os.path.join(path, name)) for name in HF_WEIGHTS):
            return None
        raise UsageError(f"--checkpoint {path} holds no model weights ({', '.join(HF_WEIGHTS[::2])} or an autosp "
                         "checkpoint); without --checkpoint the weights are random")
    raise UsageError(f"--checkpoint {path} is a directory without an autosp checkpoint; autosp's reference Llama "
                     "starts from a torch.save'd state dict or an autosp checkpoint (a --save-dir or its step-N)")


def load_warm_start(model, path: str) -> None:
    """The weights of the autosp checkpoint ``path`` into the (not yet compiled) ``model``: same names and shapes.
    Every rank reads the whole weights on its own (no process group), a group of tensors at a time."""
    import torch

    from autosp.compiler.training.checkpoint import check_model, named_parameters, read_meta
    from autosp.compiler.training.checkpoint_read import full_weights

    meta = read_meta(path)
    check_model(meta, model, path)
    params = dict(named_parameters(model))
    try:
        with torch.no_grad():
            for name, weight in full_weights(path, meta, names=list(params)):
                params[name].copy_(weight)
    except Exception as err:  # noqa: BLE001 - a damaged data file
        raise UsageError(f"checkpoint {path} is corrupt ({type(err).__name__}: {str(err).splitlines()[0][:160]})"
                         if str(err) else f"checkpoint {path} is corrupt ({type(err).__name__})") from None
