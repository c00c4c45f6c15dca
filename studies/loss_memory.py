"""The logits + loss memory under each compile backend, measured next to the cost model (``Workload.compile_backend``).

    python -m studies.loss_memory            # about 3 minutes on 2 cores (two Inductor compiles)

One spawned CPU rank (the measurement harness, :mod:`studies.measure`) trains a small Llama with a large vocabulary
(so the logits dominate the step's dynamic memory) at SP=1 in bf16, once per (backend, loss tiles): ``aot_eager``
runs the cross-entropy op by op, Inductor fuses an untiled one into one kernel; the tiled loss is one custom op
that Inductor does not look into, so its tiles run op by op under both. Per row: the bytes the graph saves for
backward (activations, and the logits kept for the loss's backward), the dynamic peak of one step (everything
allocated above the model states), the cost model's logits + loss bytes and its dynamic total (activations +
logits + loss + buffers), each with predicted / measured. The rows without loss tiling are the claim: 14 B per
bf16 logit at the loss peak op by op, 6 B (the logits and one fp32 tensor) fused.

Writes studies/results/loss_memory.{json,txt}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from studies.bootstrap import ensure_autosp

ensure_autosp()

from autosp.contract.specs import ModelSpec  # noqa: E402

MODEL = ModelSpec(name="loss-probe", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn_hidden=512,
                  vocab=32000, tied_embeddings=True)
SEQ = 2048
ROWS = [(backend, tiles) for tiles in (1, 4) for backend in ("aot_eager", "inductor")]
RESULTS = Path(__file__).resolve().parent / "results"
PROFILE = RESULTS / "calibrated-cpux1.json"
MB = 1e6


def _line(row: dict) -> dict:
    mem, pred = row["memory"], row["prediction"]["memory"]
    dynamic_pred = pred["activations"] + pred["logits_loss"] + pred["comm_buffers"]
    return {"backend": row["config"]["backend"], "loss_chunks": row["config"]["loss_chunks"],
            "saved_activations": mem["saved"]["activations"], "saved_logits": mem["saved"]["logits_loss"],
            "dynamic_peak": mem["dynamic_peak"], "dynamic_method": mem["dynamic_method"],
            "predicted_activations": pred["activations"], "predicted_logits_loss": pred["logits_loss"],
            "predicted_dynamic": dynamic_pred,
            "loss_phase_measured": mem["dynamic_peak"] - mem["saved"]["activations"],
            "bytes_per_logit_measured": (mem["dynamic_peak"] - mem["saved"]["activations"]) / (SEQ * MODEL.vocab),
            "bytes_per_logit_predicted": pred["logits_loss"] / (SEQ * MODEL.vocab)}


def main() -> int:
    from autosp.cost_models.catalog.hardware import resolve_hardware
    from studies.measure import RunConfig, measure_many

    hw = resolve_hardware(str(PROFILE))
    configs = [RunConfig(model=MODEL, seq_len=SEQ, sp=1, dtype="bf16", warmup=1, steps=1, backend=backend,
                         loss_chunks=tiles, label=f"{backend} loss/{tiles}") for backend, tiles in ROWS]
    rows = measure_many(configs, hw, device="cpu")
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        print(f"loss_memory: a row failed: {bad[0].get('error', bad[0]['status'])}", file=sys.stderr)
        return 1
    lines = [_line(r) for r in rows]
    head = (f"{'backend':<10} {'loss tiles':>10} {'saved act MB':>13} {'saved logits MB':>16} {'dyn peak MB':>12} "
            f"{'pred MB':>8} {'p/m':>5} {'loss phase B/logit':>19} {'pred':>5}")
    out = [f"# Logits + loss memory by compile backend (python -m studies.loss_memory): {MODEL.name}, "
           f"{MODEL.n_layers} layers, hidden {MODEL.hidden}, vocab {MODEL.vocab:,}, {SEQ} tokens, SP=1, bf16, CPU; "
           f"predicted with {PROFILE.name}", "", head, "-" * len(head)]
    for x in lines:
        out.append(f"{x['backend']:<10} {x['loss_chunks']:>10} {x['saved_activations'] / MB:>13.1f} "
                   f"{x['saved_logits'] / MB:>16.1f} {x['dynamic_peak'] / MB:>12.1f} {x['predicted_dynamic'] / MB:>8.1f} "
                   f"{x['predicted_dynamic'] / x['dynamic_peak']:>5.2f} {x['bytes_per_logit_measured']:>19.2f} "
                   f"{x['bytes_per_logit_predicted']:>5.2f}")
    out += ["", "dyn peak: everything allocated above the model states during one step "
            f"({lines[0]['dynamic_method']}); pred: the cost model's activations + logits/loss + buffers at its peak; "
            "loss phase B/logit: (dyn peak - saved activations) per logit, next to the cost model's logits + loss "
            "bytes per logit (untiled: the loss peak; tiled: one tile's peak plus the hidden-state gradient, over "
            "all the logits)."]
    text = "\n".join(out)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "loss_memory.txt").write_text(text + "\n")
    (RESULTS / "loss_memory.json").write_text(json.dumps({"model": MODEL.name, "seq": SEQ, "rows": lines}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
