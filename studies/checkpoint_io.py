"""Checkpoint save and load time and bytes written per rank: the DCP writer (every rank its own shards) against the
previous rank-0 writer, side by side on the same engine (issue 34).

The previous writer is loaded from git history, not kept in the product: ``compiler/training/checkpoint.py`` at
commit ``d2af092`` (the last version of the format-1 writer: every parameter's full fp32 weight and Adam states
gathered one tensor at a time, a collective per tensor under ZeRO-1..3, written by rank 0 alone as safetensors
shards), imported as a temporary module. The current writer is ``autosp.compiler.training.checkpoint``.

Per world size (``--ranks``, CPU gloo processes on this machine), one engine: a Hugging Face Llama of about 112 M
parameters (fp32, hidden 1024, 4 layers, vocab 32,000; a 1.35 GB checkpoint with AdamW's two states) compiled
with ``autosp.compile`` at SP = world and ``--zero`` (default 3), one training step so the optimizer states exist.
Then ``--repeats`` rounds, the two writers taking turns (old first in odd rounds, new first in even ones): save
(timed between barriers: every rank done), one more training step (so the weights differ from the saved ones),
load into the same engine (timed likewise), and a check that the loss on a fixed batch is the one before the save
(the load restored the saved state; "moved": how far the extra step had taken it). Bytes written per rank are the sizes of the files each rank wrote (DCP: its
``__R_0.distcp``, and rank 0 ``.metadata``, ``meta.json``, ``config.json``; the old format: rank 0 all but the
other ranks' ``rng/rank-R.pt``). Medians over the rounds.

    .venv/bin/python -m studies.checkpoint_io --repeats 5   # ~7 min on 2 busy cores; results/checkpoint_io.{txt,json}
    .venv/bin/python -m studies.checkpoint_io --ranks 2 --repeats 1 --layers 1 --vocab 4096   # a quick look

Runs from a bare checkout (:mod:`studies.bootstrap`); needs ``git`` and the repository's history for the old writer.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from studies.bootstrap import ROOT, ensure_autosp

ensure_autosp()

OLD_WRITER_COMMIT = "d2af092d005e987db0c9f4e203cfc6ac5bff483d"
SEQ = 64


def old_writer_source(commit: str = OLD_WRITER_COMMIT) -> str:
    return subprocess.run(["git", "show", f"{commit}:compiler/training/checkpoint.py"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout


def _import_file(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _writer_of(name: str) -> int:
    """The rank that wrote a checkpoint file (by its name)."""
    base = os.path.basename(name)
    if base.startswith("__") and base.endswith(".distcp"):
        return int(base[2:].split("_")[0])
    if name.startswith("rng/rank-"):
        return int(base[len("rank-"):].split(".")[0])
    return 0


def bytes_per_rank(directory: str, world: int) -> list[int]:
    out = [0] * world
    for root, _, files in os.walk(directory):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), directory)
            out[_writer_of(rel)] += os.path.getsize(os.path.join(root, f))
    return out


def _model(args):
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                                      num_hidden_layers=args.layers, num_attention_heads=16, num_key_value_heads=4,
                                      max_position_embeddings=4 * SEQ, attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def _timed(fn):
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    out = fn()
    dist.barrier()
    return time.perf_counter() - t0, out


def _run(rank, world, args, old_path, workdir):
    import torch
    import torch.distributed as dist

    import autosp
    from autosp.compiler.training import checkpoint as new

    old = _import_file(old_path, "autosp_checkpoint_format1")
    options = autosp.CompileOptions(dtype="fp32", backend="aot_eager",
                                    optimizer=lambda params: torch.optim.AdamW(params, lr=1e-4))
    engine = autosp.compile(_model(args), autosp.Candidate(sp=world, zero_stage=args.zero), options=options)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, args.vocab, (1, SEQ), generator=gen) for _ in range(2)]

    def step(ids):
        loss = engine(input_ids=ids, labels=ids)
        engine.backward(loss)
        engine.step()

    step(batches[0])
    n_params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in engine.ds_engine.module.parameters())
    rows = []
    writers = {"old (rank 0)": (old.save_engine_checkpoint, old.load_engine_checkpoint),
               "DCP (every rank)": (new.save_engine_checkpoint, new.load_engine_checkpoint)}
    for round_ in range(args.repeats):
        order = list(writers) if round_ % 2 == 0 else list(writers)[::-1]
        for name in order:
            save, load = writers[name]
            directory = os.path.join(workdir, f"ckpt-{round_}-{name.split()[0]}")
            with torch.no_grad():
                expected = engine(input_ids=batches[1], labels=batches[1]).item()
            save_s, _ = _timed(lambda: save(engine, directory))
            written = bytes_per_rank(directory, world) if rank == 0 else None
            step(batches[0])  # the weights and states move away from the saved ones
            with torch.no_grad():
                moved = engine(input_ids=batches[1], labels=batches[1]).item()
            load_s, _ = _timed(lambda: load(engine, directory))
            with torch.no_grad():
                restored = engine(input_ids=batches[1], labels=batches[1]).item()
            rows.append({"writer": name, "round": round_, "save_s": save_s, "load_s": load_s,
                         "bytes_per_rank": written, "restored_rel_err": abs(restored - expected) / abs(expected),
                         "moved_rel": abs(moved - expected) / abs(expected)})
            dist.barrier()
            if rank == 0:
                shutil.rmtree(directory)
            dist.barrier()
    return {"world": world, "n_params": n_params, "rows": rows}


def summarize(run: dict) -> list[dict]:
    out = []
    for writer in dict.fromkeys(r["writer"] for r in run["rows"]):
        rows = [r for r in run["rows"] if r["writer"] == writer]
        written = rows[0]["bytes_per_rank"]
        out.append({"world": run["world"], "writer": writer,
                    "save_s": statistics.median(r["save_s"] for r in rows),
                    "load_s": statistics.median(r["load_s"] for r in rows),
                    "bytes_per_rank": written, "max_rank_bytes": max(written), "total_bytes": sum(written),
                    "restored_rel_err": max(r["restored_rel_err"] for r in rows),
                    "moved_rel": min(r["moved_rel"] for r in rows), "repeats": len(rows)})
    old, new = out
    for key in ("save_s", "load_s", "max_rank_bytes"):
        new[f"{key} vs old"] = new[key] / old[key]
    return out


def table(summaries: list[dict], n_params: int, args) -> str:
    lines = [f"checkpoint I/O: Llama {n_params / 1e6:.0f} M params fp32 + AdamW (hidden {args.hidden}, {args.layers} "
             f"layers, vocab {args.vocab}), SP = world, ZeRO-{args.zero}, CPU gloo on this machine; medians of "
             f"{args.repeats} rounds; old writer: compiler/training/checkpoint.py at {OLD_WRITER_COMMIT[:7]}",
             "",
             f"{'ranks':>5}  {'writer':<17} {'save s':>7} {'load s':>7}  {'MB written per rank':<32} "
             f"{'max rank MB':>11} {'total MB':>9}  {'save/old':>8} {'load/old':>8} {'max MB/old':>10}  restored"]
    for s in summaries:
        per_rank = " ".join(f"{b / 1e6:.0f}" for b in s["bytes_per_rank"])
        ratios = (f"{s['save_s vs old']:>8.2f} {s['load_s vs old']:>8.2f} {s['max_rank_bytes vs old']:>10.2f}"
                  if "save_s vs old" in s else f"{'':>8} {'':>8} {'':>10}")
        lines.append(f"{s['world']:>5}  {s['writer']:<17} {s['save_s']:>7.2f} {s['load_s']:>7.2f}  {per_rank:<32} "
                     f"{s['max_rank_bytes'] / 1e6:>11.0f} {s['total_bytes'] / 1e6:>9.0f}  {ratios}  "
                     f"{s['restored_rel_err']:.0e} ({s['moved_rel']:.0e})")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--zero", type=int, default=3, choices=(0, 1, 2, 3))
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--ffn", type=int, default=2816)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--workdir", default=None, help="where the checkpoints are written (default: a temp dir)")
    parser.add_argument("--out", default=str(ROOT / "studies" / "results"), help="directory for checkpoint_io.*")
    args = parser.parse_args(argv)

    from autosp.compiler.testing import spawn

    summaries, runs = [], []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        old_path = os.path.join(tmp, "checkpoint_format1.py")
        Path(old_path).write_text(old_writer_source())
        for world in args.ranks:
            t0 = time.time()
            run = spawn(_run, world, args, old_path, tmp)
            runs.append(run)
            summaries += summarize(run)
            print(f"{world} ranks: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    text = table(summaries, runs[0]["n_params"], args)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "checkpoint_io.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "checkpoint_io.json"), "w") as f:
        json.dump({"command": "python -m studies.checkpoint_io " + " ".join(argv or sys.argv[1:]),
                   "old_writer_commit": OLD_WRITER_COMMIT, "args": vars(args), "summaries": summaries,
                   "runs": runs, "load": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
