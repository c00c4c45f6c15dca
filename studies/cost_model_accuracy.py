"""How far the cost model is from measurements: the published accuracy table (issue 5).

    python -m studies.cost_model_accuracy            # the full grid: about 30 minutes on 2 cores
    python -m studies.cost_model_accuracy --quick    # one (model, length): 12 rows, about 10 minutes
    python -m studies.cost_model_accuracy --plot     # also studies/results/cost_model_accuracy.png

A grid of small Llama-style (model, sequence length) pairs x SP in {1, 2, 4} x (ZeRO stage,
checkpointing policy) pairs -- 36 rows -- runs for real on this CPU (gloo ranks, the compiled SP step under DeepSpeed, fp32) and
is predicted by the cost model with the calibrated hardware file of this machine for that rank count
(studies/results/calibrated-cpux{1,2,4}.json, made by ``autosp-calibrate --quick --ranks N`` when
missing). Per row: predicted and measured per-rank allocated peak memory (the cost model's total minus
its GPU-only reserve; measured as static census + the step's dynamic peak, see studies/measure) and
step time (median of the timed steps, slowest rank), and the signed error of each. The summary gives
the median and maximum absolute % error, overall and per SP degree.

Writes studies/results/cost_model_accuracy.{json,txt} (and .png with --plot).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from autosp.contract.specs import ModelSpec

MODELS = [
    ModelSpec(name="acc-llama-2l-h256", n_layers=2, hidden=256, n_heads=8, n_kv_heads=4, head_dim=32,
              ffn_hidden=704, vocab=8192),
    ModelSpec(name="acc-llama-4l-h384", n_layers=4, hidden=384, n_heads=8, n_kv_heads=4, head_dim=48,
              ffn_hidden=1024, vocab=8192),
]
# (model, sequence length) pairs: the small model at two lengths, the larger one at the longer
SHAPES = ((MODELS[0], 2048), (MODELS[0], 4096), (MODELS[1], 4096))
SPS = (1, 2, 4)
# one pair per ZeRO stage, each with another checkpointing policy (a full product would take hours here)
ZERO_CKPT = ((0, "none"), (1, "selective"), (2, "full"), (3, "sequence"))


def grid(quick: bool, steps: int, backend: str):
    from studies.measure import RunConfig

    shapes = SHAPES[1:2] if quick else SHAPES
    out = {}
    for sp in SPS:
        out[sp] = [RunConfig(model=m, seq_len=s, sp=sp, zero_stage=z, checkpointing=c, warmup=2, steps=steps,
                             backend=backend, label=f"{m.name} S={s} sp{sp} z{z} {c}")
                   for m, s in shapes for z, c in ZERO_CKPT]
    return out


def render(rows: list[dict], summaries: dict) -> str:
    from studies.measure.compare import MIB, fmt_pct

    head = (f"{'model':<20}{'S':>6}{'sp':>3}{'z':>2} {'ckpt':<10}{'peak MiB':>9}{'pred':>8}{'err':>8} "
            f"{'step ms':>8}{'pred':>8}{'err':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        c = r["config"]
        lead = f"{c['model']['name']:<20}{c['seq_len']:>6}{c['sp']:>3}{c['zero_stage']:>2} {c['checkpointing']:<10}"
        if r["status"] != "ok":
            lines.append(f"{lead}{r['status']}: {r.get('error')}")
            continue
        m, p = r["measured"], r["predicted"]
        lines.append(f"{lead}{m['peak'] / MIB:9.1f}{p['peak'] / MIB:8.1f}{fmt_pct(r['err_peak']):>8} "
                     f"{m['step'] * 1e3:8.0f}{p['step'] * 1e3:8.0f}{fmt_pct(r['err_step']):>8}")
    lines.append("")
    lines.append(f"{'absolute % error':<22}{'rows':>5}{'memory median':>15}{'max':>8}{'step median':>13}{'max':>8}")
    for name, s in summaries.items():
        mem, step = s["memory"], s["step"]
        if not mem["n"]:
            continue
        lines.append(f"{name:<22}{mem['n']:>5}{mem['median_abs_pct']:>14.1f}%{mem['max_abs_pct']:>7.1f}%"
                     f"{step['median_abs_pct']:>12.1f}%{step['max_abs_pct']:>7.1f}%")
    return "\n".join(lines)


def plot(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    for ax, key, unit, scale in ((axes[0], "peak", "MiB", 2 ** -20), (axes[1], "step", "s", 1.0)):
        for sp, marker in zip(SPS, "o^s"):
            pts = [(r["measured"][key] * scale, r["predicted"][key] * scale) for r in ok if r["config"]["sp"] == sp]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, label=f"SP={sp}", alpha=0.8)
        lo = min(min(r["measured"][key], r["predicted"][key]) for r in ok) * scale * 0.8
        hi = max(max(r["measured"][key], r["predicted"][key]) for r in ok) * scale * 1.2
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="exact")
        for band, style in ((0.05 if key == "peak" else 0.10, "--"),):
            ax.plot([lo, hi], [lo * (1 + band), hi * (1 + band)], "k" + style, lw=0.5,
                    label=f"±{band:.0%}")
            ax.plot([lo, hi], [lo * (1 - band), hi * (1 - band)], "k" + style, lw=0.5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured ({unit})")
        ax.set_ylabel(f"predicted ({unit})")
        ax.set_title("per-rank peak memory" if key == "peak" else "step time")
        ax.legend(fontsize=8)
    fig.suptitle("autosp cost model vs measurement (CPU, gloo, calibrated hardware file)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.cost_model_accuracy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one (model, sequence length) pair: 12 rows")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per row (default 3)")
    parser.add_argument("--backend", default="aot_eager", choices=("aot_eager", "inductor"))
    parser.add_argument("--recalibrate", action="store_true", help="measure this CPU again first")
    parser.add_argument("--plot", action="store_true", help="write studies/results/cost_model_accuracy.png")
    parser.add_argument("--repredict", action="store_true",
                        help="measure nothing: re-predict the rows of results/cost_model_accuracy.json with the "
                             "current cost model (the measurements do not depend on it)")
    args = parser.parse_args(argv)

    from studies.measure import RunConfig, measure_many
    from studies.measure.compare import (RESULTS, calibrated_cpu, environment, measured, pct_error, predicted,
                                         summary, write_json)

    if args.repredict:
        import json

        old = json.loads((RESULTS / "cost_model_accuracy.json").read_text())["rows"]
        groups = {}
        for r in old:
            groups.setdefault(r["config"]["sp"], []).append((RunConfig.from_dict(r["config"]), r))
        measure = lambda cfgs, sp: [r.get("raw") or r for _, r in groups[sp]]  # noqa: E731
        plan = {sp: [c for c, _ in pairs] for sp, pairs in groups.items()}
    else:
        measure = lambda cfgs, sp: measure_many(cfgs, hardware=None)  # noqa: E731
        plan = grid(args.quick, args.steps, args.backend)

    rows = []
    hardware = {}
    for sp, cfgs in plan.items():
        hw = calibrated_cpu(sp, args.recalibrate)
        hardware[sp] = hw.name
        print(f"SP={sp}: {'re-predicting' if args.repredict else 'measuring'} {len(cfgs)} rows ...",
              file=sys.stderr, flush=True)
        for cfg, row in zip(cfgs, measure(cfgs, sp)):
            out = {"label": cfg.label, "status": row["status"], "config": cfg.to_dict(), "hardware": hw.name}
            if row["status"] == "ok":
                m, p = measured(row), predicted(cfg, hw)
                out.update(measured=m, predicted=p, err_peak=pct_error(p["peak"], m["peak"]),
                           err_step=pct_error(p["step"], m["step"]), raw=row)
            else:
                out["error"] = row.get("error")
            rows.append(out)
            print(f"  {cfg.label}: {row['status']}", file=sys.stderr, flush=True)

    def summarise(selected):
        return {"memory": summary([r.get("err_peak") for r in selected]),
                "step": summary([r.get("err_step") for r in selected])}

    summaries = {"all": summarise(rows)}
    for sp in SPS:
        summaries[f"SP={sp}"] = summarise([r for r in rows if r["config"]["sp"] == sp])
    for z, _ in ZERO_CKPT:
        summaries[f"ZeRO-{z}"] = summarise([r for r in rows if r["config"]["zero_stage"] == z])
    contention = max(((r["measured"]["other_cpu"] or 0) for r in rows if r["status"] == "ok"), default=0)
    text = (f"cost model accuracy on this CPU ({environment()['cores']} cores), fp32, {args.backend}, "
            f"{args.steps} timed steps per row; predictions with {', '.join(hardware.values())}\n"
            f"peak = per-rank allocated peak (cost model: total minus its GPU reserve); err = (predicted - "
            f"measured) / measured; other processes used up to {100 * contention:.0f}% of the CPUs while timing\n\n"
            f"{render(rows, summaries)}\n")
    print(text)
    write_json(RESULTS / "cost_model_accuracy.json", {"environment": environment(), "hardware": hardware,
                                                      "models": [asdict(m) for m in MODELS], "rows": rows,
                                                      "summary": summaries})
    (RESULTS / "cost_model_accuracy.txt").write_text(text, encoding="utf-8")
    if args.plot:
        plot(rows, RESULTS / "cost_model_accuracy.png")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
