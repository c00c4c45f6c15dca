"""Packed documents at one sequence length: measured step time next to the cost model's (issue 12's evidence).

    python -m studies.packed_costs                    # measure and predict (about 10 minutes on 2 cores)
    python -m studies.packed_costs --predict-only     # the predicted rows alone (no torch run)

One world-2 gloo job (SP=2, ZeRO-1, fp32, the project's reference Llama, aot_eager) trains the same S-token
sequences unpacked and packed into documents of S, S/4, S/16 and S/64 tokens (``position_ids`` restarting
at every document, each document's first label -100: the Hugging Face convention), with pure Ulysses and
with a ring of 2. Per row: the measured step time (median of the timed steps, slowest rank), the cost
model's prediction with the calibrated CPU profile of this machine (studies/results/calibrated-cpux2.json,
made by ``autosp-calibrate --quick --ranks 2`` when missing), predicted / measured, and each row's step
time relative to the unpacked row of its layout, measured and predicted: the saving the cost model
promises must be the saving the run shows. The share column is the predicted attention FLOPs over the
S x S causal triangle's (exact here: equal documents dividing S fill every sequence the same way).

Writes studies/results/packed_costs.{json,txt}.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from autosp.contract.specs import ModelSpec

# the model of studies/knob_costs.py: matmuls, not per-op overheads, dominate a CPU step at 4k tokens
MODEL = ModelSpec(name="study-llama-4l", n_layers=4, hidden=256, n_heads=8, n_kv_heads=4, head_dim=32,
                  ffn_hidden=704, vocab=8192)

DOCS_PER_SEQUENCE = (None, 1, 4, 16, 64)
"""None: unpacked (no position_ids); k: k equal documents per sequence."""


def configs(seq: int, steps: int, backend: str):
    from studies.measure import RunConfig

    out = []
    for ring in (1, 2):
        for k in DOCS_PER_SEQUENCE:
            docs = () if k is None else (seq // k,) * k
            label = f"{'ring 2' if ring > 1 else 'ulysses'} " + ("unpacked" if k is None else f"{k} x {seq // k}")
            out.append(RunConfig(model=MODEL, seq_len=seq, sp=2, ring=ring, zero_stage=1, warmup=2, steps=steps,
                                 backend=backend, doc_lens=docs, label=label))
    return out


def attention_share(cfg) -> float:
    from autosp.cost_models.estimate import attention_share as share

    return share(cfg.model, cfg.workload(), cfg.candidate())["fraction"]


def render(rows: list[dict]) -> str:
    from studies.measure.compare import fmt_ratio

    head = (f"{'layout / documents':<26}{'att share':>10}{'meas ms':>9}{'pred ms':>9}{'p/m':>6}   "
            f"{'vs unpacked: meas':>17}{'pred':>7}")
    lines = [head, "-" * len(head)]
    base = {}
    for r in rows:
        layout = r["label"].split()[0]
        if r["label"].endswith("unpacked"):
            base[layout] = r
        b = base.get(layout)
        pred = r["predicted"]["step"]
        share = f"{100 * r['share']:9.2f}%"
        if r["status"] != "ok":
            rel = f"{'-':>17}{pred / b['predicted']['step'] if b else 0:7.2f}"
            lines.append(f"{r['label']:<26}{share}{'-':>9}{pred * 1e3:9.0f}{'-':>6}   {rel}   "
                         f"{r['status']}: {str(r.get('error', ''))[:80]}")
            continue
        meas = r["measured"]["step"]
        if b and b["status"] == "ok":
            rel = f"{meas / b['measured']['step']:17.2f}{pred / b['predicted']['step']:7.2f}"
        else:
            rel = f"{'-':>17}{pred / b['predicted']['step'] if b else 0:7.2f}"
        lines.append(f"{r['label']:<26}{share}{meas * 1e3:9.0f}{pred * 1e3:9.0f}{fmt_ratio(pred, meas):>6}   {rel}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.packed_costs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=4096, help="tokens per sequence (default 4096)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per row (default 4)")
    parser.add_argument("--backend", default="aot_eager", choices=("aot_eager", "inductor"))
    parser.add_argument("--predict-only", action="store_true", help="print the predicted rows; measure nothing")
    parser.add_argument("--recalibrate", action="store_true", help="measure this CPU again first")
    args = parser.parse_args(argv)

    from studies.measure.compare import RESULTS, calibrated_cpu, measured, predicted

    hw = calibrated_cpu(2, args.recalibrate)
    cfgs = configs(args.seq, args.steps, args.backend)
    if args.predict_only:
        raw = [{"status": "not_run", "error": "--predict-only"} for _ in cfgs]
    else:
        from studies.measure import measure_many

        print(f"measuring {len(cfgs)} rows at SP=2, {args.seq} tokens, {MODEL.name} ...", file=sys.stderr, flush=True)
        raw = measure_many(cfgs, hardware=None)
    rows = []
    for cfg, row in zip(cfgs, raw):
        out = {"label": cfg.label, "status": row["status"], "config": cfg.to_dict(), "share": attention_share(cfg),
               "predicted": predicted(cfg, hw)}
        if row["status"] == "ok":
            out.update(measured=measured(row), raw=row)
        else:
            out["error"] = row.get("error")
        rows.append(out)
    table = render(rows)
    ok = [r for r in rows if r["status"] == "ok"]
    contention = max(((r["measured"]["other_cpu"] or 0) for r in ok), default=0.0)
    text = (f"packed documents: {MODEL.name} ({MODEL.n_layers} layers, hidden {MODEL.hidden}, {MODEL.n_heads} heads), "
            f"{args.seq} tokens per sequence, SP=2 (Ulysses 2, or ring 2), ZeRO-1, fp32, {cfgs[0].backend}, "
            f"{cfgs[0].steps} timed steps; predictions with {hw.name}\n"
            f"att share = predicted attention FLOPs / the S x S causal triangle's; p/m = predicted / measured step; "
            f"vs unpacked = step / the unpacked step of the same layout\n"
            + (f"other processes used up to {100 * contention:.0f}% of the CPUs while timing\n" if ok else
               "predicted rows only (--predict-only, or the packed runtime was not available)\n")
            + f"\n{table}\n")
    print(text)
    if not args.predict_only:
        from studies.measure.compare import environment, write_json

        write_json(RESULTS / "packed_costs.json", {"environment": environment(), "hardware": hw.name, "seq": args.seq,
                                                   "model": asdict(MODEL), "rows": rows})
        (RESULTS / "packed_costs.txt").write_text(text, encoding="utf-8")
    return 0 if all(r["status"] == "ok" for r in rows) or args.predict_only else 1


if __name__ == "__main__":
    sys.exit(main())
