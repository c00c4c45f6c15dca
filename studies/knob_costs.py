"""What each plan knob costs, measured next to the cost model's prediction (issue 4's evidence).

    python -m studies.knob_costs                 # about 5 minutes on 2 cores
    python -m studies.knob_costs --seq 4096 --steps 5

One world-2 gloo job (SP=2, ZeRO-1, fp32, the project's reference Llama) compiles and trains every
setting of every knob the planner chooses -- checkpointing none/selective/sequence/full, activation
offload, MLP tiling, logits+loss tiling, the two overlap schedules, sequence-chunked layers (their saved
tensors kept, then offloaded), and all of them at once -- and
measures per rank (the worse rank): the bytes the compiled graph saves for backward (saved-tensor
hooks, de-duplicated by storage), the allocated peak of a step, and the step time (median of the
timed steps, slowest rank). Next to each: the cost model's prediction with the calibrated CPU profile
of this machine (studies/results/calibrated-cpux2.json, made by ``autosp-calibrate --quick --ranks 2``
when missing) and the ratio predicted / measured. The "vs none" columns compare each row with the
baseline, measured and predicted: a knob must move its cost the way the cost model says.

Writes studies/results/knob_costs.{json,txt}.
"""

from __future__ import annotations

import argparse
import sys

from autosp.contract.specs import ModelSpec

# Big enough that matmuls, not per-op overheads, dominate a CPU step; 8 query heads so head_pipeline
# has 4 local heads per rank to pipeline.
MODEL = ModelSpec(name="study-llama-4l", n_layers=4, hidden=256, n_heads=8, n_kv_heads=4, head_dim=32,
                  ffn_hidden=704, vocab=8192)

SETTINGS = [  # (label, knob overrides)
    ("baseline (none)", {}),
    ("ckpt selective", dict(checkpointing="selective")),
    ("ckpt sequence", dict(checkpointing="sequence")),
    ("ckpt full", dict(checkpointing="full")),
    ("ckpt full + offload", dict(checkpointing="full", offload_activations=True)),
    ("mlp_chunks 2", dict(mlp_chunks=2)),
    ("mlp_chunks 4", dict(mlp_chunks=4)),
    ("loss_chunks 2", dict(loss_chunks=2)),
    ("loss_chunks 8", dict(loss_chunks=8)),
    ("overlap kv_async", dict(overlap="kv_async")),
    ("overlap head_pipeline", dict(overlap="head_pipeline")),
    ("sequence_chunks 4", dict(sequence_chunks=4)),
    ("sequence_chunks 4 + offload", dict(sequence_chunks=4, offload_chunks=True)),
    ("all: seq+offload+mlp4+loss8+kv_async", dict(checkpointing="sequence", offload_activations=True, mlp_chunks=4,
                                                  loss_chunks=8, overlap="kv_async")),
]


def configs(seq: int, steps: int, backend: str):
    from studies.measure import RunConfig

    return [RunConfig(model=MODEL, seq_len=seq, sp=2, zero_stage=1, warmup=2, steps=steps, backend=backend,
                      label=label, **knobs) for label, knobs in SETTINGS]


LEGEND = ("saved = bytes saved for backward per rank (cost model: kept activations); peak = allocated peak per "
          "rank (cost model: total minus reserve); p/m = predicted / measured; vs none = ratio to the baseline row, "
          "measured/predicted")
"""What the columns of :func:`render`'s table are."""


def render(rows: list[dict]) -> str:
    from studies.measure.compare import MIB, fmt_ratio

    base = rows[0]
    head = (f"{'setting':<38}{'saved MiB':>10}{'pred':>8}{'p/m':>6} {'peak MiB':>9}{'pred':>8}{'p/m':>6} "
            f"{'step ms':>8}{'pred':>8}{'p/m':>6}  {'vs none: saved m/p':>18} {'peak m/p':>11} {'step m/p':>11}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['label']:<38}{r['status']}: {r['error']}")
            continue
        m, p = r["measured"], r["predicted"]
        rel = []
        for key in ("saved", "peak", "step"):
            bm, bp = base["measured"][key], base["predicted"][key]
            rel.append(f"{m[key] / bm:5.2f}/{p[key] / bp:<5.2f}" if bm and bp else "     -     ")
        lines.append(f"{r['label']:<38}{m['saved'] / MIB:10.1f}{p['saved'] / MIB:8.1f}{fmt_ratio(p['saved'], m['saved']):>6} "
                     f"{m['peak'] / MIB:9.1f}{p['peak'] / MIB:8.1f}{fmt_ratio(p['peak'], m['peak']):>6} "
                     f"{m['step'] * 1e3:8.0f}{p['step'] * 1e3:8.0f}{fmt_ratio(p['step'], m['step']):>6}  "
                     f"{rel[0]:>18} {rel[1]:>11} {rel[2]:>11}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.knob_costs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=4096, help="tokens per sequence (default 4096)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per setting (default 4)")
    parser.add_argument("--backend", default="aot_eager", choices=("aot_eager", "inductor"))
    parser.add_argument("--recalibrate", action="store_true", help="measure this CPU again first")
    parser.add_argument("--repredict", action="store_true",
                        help="measure nothing: re-predict the rows of results/knob_costs.json with the current "
                             "cost model (the measurements do not depend on it)")
    args = parser.parse_args(argv)

    from studies.measure.compare import calibrated_cpu, save_study, study_rows

    hw = calibrated_cpu(2, args.recalibrate)
    args.seq, cfgs, rows = study_rows("knob_costs", lambda: configs(args.seq, args.steps, args.backend), hw,
                                      args.repredict)
    table = render(rows)
    contention = max((r["measured"]["other_cpu"] or 0) for r in rows if r["status"] == "ok")
    text = (f"knob costs: {MODEL.name} ({MODEL.n_layers} layers, hidden {MODEL.hidden}, vocab {MODEL.vocab}), "
            f"{args.seq} tokens, SP=2, ZeRO-1, fp32, {cfgs[0].backend}, {cfgs[0].steps} timed steps; predictions "
            f"with {hw.name}\n{LEGEND}\n"
            f"other processes used up to {100 * contention:.0f}% of the CPUs while timing\n\n{table}\n")
    return save_study("knob_costs", text, hw, args.seq, MODEL, rows)


if __name__ == "__main__":
    sys.exit(main())
