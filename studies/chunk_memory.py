"""Memory of sequence-chunked layers against the sequence length, at a fixed chunk size (issue 13's table).

    python -m studies.chunk_memory                      # about 3 minutes on 2 cores
    python -m studies.chunk_memory --seqs 512 1024 2048 --chunk 64

One world-2 gloo job (SP=2, ZeRO-1, fp32, aot_eager, the project's reference Llama with 4 layers, logits+loss
tiled so the vocabulary does not dominate) trains every row's setting: the layers unchunked, chunked with
``--chunk`` tokens per rank-chunk (``sequence_chunks`` = S / (2 x chunk)), and chunked with ``offload_chunks``.
Per rank (the worse rank reported), in one measured step after a compiling one:

- ``saved dev`` / ``saved host``: the bytes the step's forward keeps for backward, de-duplicated by storage
  (saved-tensor hooks, :func:`autosp.compiler.saved_memory.measure_saved`), split into device memory and the
  host copies offload made;
- ``peak``: the bytes the step allocated on top of what existed when it began, at their peak: saved
  activations + the transient working set + gradients (studies/measure/memory.py ``attributed_peak``, the
  harness's profiler of c10's CPU allocator); ``act peak``: the most bytes alive at once, over the forward and
  backward, among the blocks they allocate, gradients and ZeRO buckets left out (``before_step``'s
  ``activation_peak`` of the harness): the saved + transient activation bytes.

How host copies are counted on CPU: host and device are the same memory here, so "host" is made a separate
allocation: the chunks' host copies are numpy-allocated buffers (real copies), registered as host copies.
The saved-tensor hooks count them under ``saved host``; the allocator profiler does not see numpy's
allocations, so ``peak`` is what a GPU would hold. Reloading a chunk for the backward allocates through torch
and counts as device memory.

:func:`measure_rows` returns the measured rows (for a predicted column next to them).
Writes studies/results/chunk_memory.{json,txt}.
"""

from __future__ import annotations

import argparse
import sys

from autosp.contract.specs import ModelSpec

MODEL = ModelSpec(name="chunk-llama-4l", n_layers=4, hidden=128, n_heads=4, n_kv_heads=2, head_dim=32,
                  ffn_hidden=352, vocab=512)
SP = 2
MIB = 1024 ** 2


def settings(seqs, chunk: int) -> list[dict]:
    """Every row: (seq, label, candidate knobs)."""
    rows = []
    for seq in seqs:
        chunks = seq // (SP * chunk)
        rows.append(dict(seq=seq, label="unchunked", knobs={}))
        rows.append(dict(seq=seq, label=f"chunks {chunks}", knobs=dict(sequence_chunks=chunks)))
        rows.append(dict(seq=seq, label=f"chunks {chunks} + offload",
                         knobs=dict(sequence_chunks=chunks, offload_chunks=True)))
    return rows


def _run(rank, world, rows):
    import copy

    import torch
    import torch._dynamo

    from autosp.compiler.api import compile_model
    from autosp.compiler.models import Llama
    from autosp.compiler.options import CompileOptions
    from autosp.compiler.saved_memory import measure_saved
    from autosp.contract.specs import Candidate
    from studies.measure import memory

    torch.manual_seed(0)
    base = Llama.from_spec(MODEL)
    out = []
    for row in rows:
        torch._dynamo.reset()
        plan = Candidate(sp=SP, zero_stage=1, loss_chunks=4, **row["knobs"])
        engine = compile_model(copy.deepcopy(base), plan, options=CompileOptions(
            backend="aot_eager", optimizer=lambda p: torch.optim.SGD(p, lr=1e-3)))
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(0, MODEL.vocab, (1, row["seq"]), generator=gen)

        def forward():
            return engine(input_ids=ids, labels=ids.clone())

        loss = forward()                                 # compiles
        engine.backward(loss)
        engine.step()
        with measure_saved(engine.module) as saved:
            loss = forward()
        engine.backward(loss)
        engine.step()
        dyn = memory.attributed_peak(forward, engine.backward, engine.step, engine.module, engine.optimizer,
                                     MODEL.vocab, torch.device("cpu"), memory.zero_bucket_bytes(MODEL.n_params()))
        out.append({**row, "saved_device": saved.device_bytes, "saved_host": saved.host_bytes,
                    "peak": dyn["peak"], "activation_peak": dyn["before_step"]["activation_peak"]})
        del engine
    gathered = [None] * world
    import torch.distributed as dist

    dist.all_gather_object(gathered, out)
    return [max((r[i] for r in gathered), key=lambda x: x["activation_peak"]) for i in range(len(rows))]


def measure_rows(seqs=(1024, 2048, 4096), chunk: int = 64) -> list[dict]:
    """The measured rows, one per (sequence length, setting): ``seq``, ``label``, ``knobs``, ``saved_device``,
    ``saved_host``, ``activation_peak`` and ``peak`` in bytes (the worse of the two ranks)."""
    from autosp.compiler.testing import spawn

    return spawn(_run, SP, settings(seqs, chunk))


def render(rows: list[dict], chunk: int) -> str:
    head = f"{'seq':>6} {'setting':<22}{'saved dev MiB':>14}{'saved host MiB':>15}{'act peak MiB':>13}{'peak MiB':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['seq']:>6} {r['label']:<22}{r['saved_device'] / MIB:14.2f}{r['saved_host'] / MIB:15.2f}"
                     f"{r['activation_peak'] / MIB:13.2f}{r['peak'] / MIB:10.2f}")
    growth = []
    for label in ("unchunked", "chunks", "offload"):
        picked = [r for r in rows if (label in r["label"]) and (label != "chunks" or "offload" not in r["label"])]
        if len(picked) >= 2:
            a, b = picked[0], picked[-1]
            growth.append(f"{label}: activation peak x{b['activation_peak'] / a['activation_peak']:.2f}, saved dev "
                          f"x{b['saved_device'] / max(a['saved_device'], 1):.2f}, saved host "
                          f"x{b['saved_host'] / max(a['saved_host'], 1):.2f} for seq x{b['seq'] / a['seq']:.0f}")
    return "\n".join(lines) + "\n\n" + "\n".join(growth)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.chunk_memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096], help="sequence lengths")
    parser.add_argument("--chunk", type=int, default=64, help="tokens per rank in one chunk (default 64)")
    args = parser.parse_args(argv)
    if args.chunk < 1 or any(s % (SP * args.chunk) or s < SP * args.chunk for s in args.seqs):
        print(f"error: every --seqs value must be a positive multiple of {SP} x --chunk", file=sys.stderr)
        return 2
    rows = measure_rows(args.seqs, args.chunk)
    text = (f"chunked-layer memory: {MODEL.name} ({MODEL.n_layers} layers, hidden {MODEL.hidden}), SP={SP}, ZeRO-1, "
            f"fp32, loss_chunks 4, {args.chunk} tokens per rank-chunk; per rank (worse rank), one measured step\n"
            f"saved dev/host = bytes kept for backward in device memory / in host copies (saved-tensor hooks); "
            f"peak = bytes the step allocated at their peak (CPU allocator profiler; numpy-allocated host copies "
            f"not included)\n\n{render(rows, args.chunk)}\n")
    print(text)
    from studies.measure.compare import RESULTS, environment, write_json

    write_json(RESULTS / "chunk_memory.json", {"environment": environment(), "model": MODEL.name, "sp": SP,
                                               "chunk": args.chunk, "rows": rows})
    (RESULTS / "chunk_memory.txt").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
