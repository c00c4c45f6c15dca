"""The cost model's side of the sequence-chunk memory table: predicted per-rank activation bytes of a
sequence-chunked layer stack at a fixed chunk size, for rows a measurement (the compiler's saved-tensor
harness) fills in.

    .venv/bin/python -m studies.chunk_memory_prediction             # prints the predicted grid
    .venv/bin/python -m studies.chunk_memory_prediction --measure   # measured rows (studies/chunk_memory.py) next
                                                                     # to the prediction; ~3 min on 2 cores

:func:`predict` is what a measuring script calls per row. It returns, per rank, in bytes:

- ``kept``: the saved tensors of all layers on the device (with offload_chunks: two chunks of one layer's),
  plus the final norm's;
- ``transient``: one chunked layer's backward working set on top of them (cost_models/chunks.py);
- ``device``: kept + transient, the activation peak the table compares with the measured saved + transient
  bytes;
- ``host``: what offload_chunks parks in host memory (every layer's saved set, K/V included, and the fp32
  dK/dV accumulators of the layer in its backward). On a CPU-only machine host and device are the same
  memory; the measurement counts the host copies separately, and so does this.

The claim the table checks: at a fixed chunk size, with offload (and checkpointing ``none``) the device side
grows only with the full-length tensors the model names (residual-stream gradients 2h, the final norm 2h: 4h
per token), and everything else grows on the host side.
"""

from __future__ import annotations

import math

from autosp.cost_models import memory
from autosp.cost_models.shapes import Shapes
from autosp.contract.specs import Candidate, ModelSpec, Workload

__all__ = ["predict", "TABLE_MODEL"]

TABLE_MODEL = ModelSpec(name="chunk-llama-2l-h256", n_layers=2, hidden=256, n_heads=8, n_kv_heads=4, head_dim=32,
                        ffn_hidden=704, vocab=8192)
"""A small Llama-style model a CPU runs at several thousand tokens (the accuracy study's first model)."""


def predict(model: ModelSpec, seq_len: int, sp: int = 1, chunk_tokens: int | None = None, offload: bool = False,
            checkpointing: str = "none", offload_activations: bool = False, dtype: str = "fp32") -> dict:
    """Predicted per-rank activation bytes with chunks of ``chunk_tokens`` local tokens (None: unchunked).
    ``checkpointing`` ``none`` keeps the chunked layers whole (their input, K/V, attention output per chunk);
    ``full`` keeps their inputs (``offload_activations`` moves those) and re-runs each layer in its backward."""
    local = math.ceil(seq_len / sp)
    chunks = 1 if chunk_tokens is None else max(1, math.ceil(local / chunk_tokens))
    cand = Candidate(sp=sp, checkpointing=checkpointing, sequence_chunks=chunks, offload_chunks=offload and chunks > 1,
                     offload_activations=offload_activations)
    sh = Shapes(model, Workload(seq_len=seq_len, dtype=dtype), cand)
    kept, transient, _per_layer, host = memory.activation_bytes(sh, cand)
    return {"chunks": chunks, "chunk_tokens": sh.c, "kept": kept, "transient": transient, "device": kept + transient,
            "host": host}


def predict_measured_row(model: ModelSpec, row: dict, sp: int, candidate_knobs: dict, dtype: str = "fp32") -> dict:
    """The cost model's figures for one measured row of ``studies.chunk_memory`` (its candidate: ``candidate_knobs``
    plus the row's ``knobs``): ``saved_device`` (the kept activations), ``saved_host`` (what offload parks in host
    memory) and ``activation_peak`` (activations + logits/loss + all-to-all staging at the predicted peak: the
    step's allocations less gradients, ZeRO buffers and model states, as the measurement attributes them)."""
    from autosp.cost_models import estimate
    from autosp.cost_models.catalog.hardware import resolve_hardware

    cand = Candidate(sp=sp, **candidate_knobs, **row["knobs"])
    workload = Workload(seq_len=row["seq"], dtype=dtype)
    sh = Shapes(model, workload, cand)
    kept, _transient, _per_layer, host = memory.activation_bytes(sh, cand)
    est = estimate(model, resolve_hardware(f"h100x{sp}"), workload, cand)  # memory does not depend on the device
    peak = est.memory.activations + est.memory.logits_loss + memory.a2a_buffer_bytes(sh)
    return {"saved_device": kept, "saved_host": host, "activation_peak": peak}


def table(seqs=(1024, 2048, 4096), chunk: int = 64) -> str:
    """Measure ``studies.chunk_memory``'s rows and print the prediction next to each (MiB)."""
    from studies import chunk_memory as measured_study

    rows = measured_study.measure_rows(seqs, chunk)
    knobs = dict(zero_stage=1, loss_chunks=4)
    mib = 2 ** 20
    head = (f"{'seq':>6} {'setting':<20}| {'saved dev':>9} {'pred':>7} | {'saved host':>10} {'pred':>7} | "
            f"{'act peak':>8} {'pred':>7} {'pred/meas':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        p = predict_measured_row(measured_study.MODEL, r, measured_study.SP, knobs)
        ratio = p["activation_peak"] / r["activation_peak"] if r["activation_peak"] else float("nan")
        lines.append(f"{r['seq']:>6} {r['label']:<20}| {r['saved_device'] / mib:9.2f} {p['saved_device'] / mib:7.2f} | "
                     f"{r['saved_host'] / mib:10.2f} {p['saved_host'] / mib:7.2f} | {r['activation_peak'] / mib:8.2f} "
                     f"{p['activation_peak'] / mib:7.2f} {ratio:9.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if "--measure" in argv:  # measured (studies/chunk_memory.py, ~3 min on 2 cores) next to predicted
        from pathlib import Path

        text = ("chunked-layer memory, measured (studies/chunk_memory.py: SP=2, ZeRO-1, fp32, loss/4, 64 tokens per "
                "rank-chunk, worse rank) next to the cost model's prediction, MiB\n\n" + table() + "\n")
        print(text)
        out = Path(__file__).resolve().parent / "results" / "chunk_memory_vs_model.txt"
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}")
        return 0
    print(f"{TABLE_MODEL.name}, fp32, checkpointing none (chunked layers kept whole), sp=1, chunks of 1024 tokens "
          f"(predicted, MiB; unchunked: the same policy)")
    print(f"{'seq':>7} {'N':>3} | {'unchunked':>10} | {'chunked':>9} | {'offloaded: device':>17} {'host':>8}")
    for seq in (2048, 4096, 8192, 16384):
        plain = predict(TABLE_MODEL, seq)
        chunked = predict(TABLE_MODEL, seq, chunk_tokens=1024)
        off = predict(TABLE_MODEL, seq, chunk_tokens=1024, offload=True)
        print(f"{seq:>7} {chunked['chunks']:>3} | {plain['device'] / 2**20:>10.2f} | {chunked['device'] / 2**20:>9.2f} | "
              f"{off['device'] / 2**20:>17.2f} {off['host'] / 2**20:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
