"""``python -m studies.measure``: run one configuration on N ranks and print what was measured."""

from __future__ import annotations

import argparse
import json
import sys

from autosp.contract.specs import CHECKPOINTING_POLICIES, OVERLAP_SCHEDULES, ModelSpec

TINY = dict(name="tiny-llama", n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, head_dim=32, ffn_hidden=352,
            vocab=512)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.measure", description=__doc__)
    p.add_argument("--model", default=None, help="ModelSpec as JSON (default: a tiny 2-layer Llama)")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--sp", type=int, default=2)
    p.add_argument("--ring", type=int, default=1, help="ring attention ranks inside the SP group (divides --sp)")
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3))
    p.add_argument("--ckpt", default="none", choices=CHECKPOINTING_POLICIES)
    p.add_argument("--mlp-chunks", type=int, default=1)
    p.add_argument("--loss-chunks", type=int, default=1)
    p.add_argument("--offload-activations", action="store_true")
    p.add_argument("--overlap", default="none", choices=OVERLAP_SCHEDULES)
    p.add_argument("--offload-optimizer", action="store_true")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--backend", default="inductor", choices=("inductor", "aot_eager"))
    p.add_argument("--impl", default="reference", choices=("reference", "hf", "hf-moe"),
                   help="the model: autosp's reference Llama, transformers' Llama, or transformers' Mixtral (a spec "
                        "with n_experts)")
    p.add_argument("--hw", default=None, help="hardware file (catalog name or JSON file) to predict with")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON (after the ranks' logs)")
    p.add_argument("--out", help="also write the whole result as JSON to this file")
    args = p.parse_args(argv)

    from studies.measure import RunConfig, measure

    spec = ModelSpec(**(json.loads(args.model) if args.model else TINY))
    cfg = RunConfig(model=spec, seq_len=args.seq, sp=args.sp, ring=args.ring, dp=args.dp, zero_stage=args.zero,
                    checkpointing=args.ckpt, mlp_chunks=args.mlp_chunks, loss_chunks=args.loss_chunks,
                    offload_activations=args.offload_activations, overlap=args.overlap,
                    offload_optimizer=args.offload_optimizer, dtype=args.dtype, warmup=args.warmup,
                    steps=args.steps, backend=args.backend, impl=args.impl)
    hw = None
    if args.hw:
        from autosp.cost_models.catalog.hardware import resolve_hardware

        hw = resolve_hardware(args.hw)
    row = measure(cfg, hardware=hw)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(row, f, indent=1, default=str)
    if args.json:
        json.dump(row, sys.stdout, indent=1, default=str)
        print()
        return 0 if row["status"] == "ok" else 1
    if row["status"] != "ok":
        print(f"{row['status']}: {row['error']}")
        return 1
    m, t, c = row["memory"], row["time"], row["contention"]
    mib = 1 / 2**20
    print(f"step {t['step_median'] * 1e3:.1f} ms (median of {len(t['steps'])}, spread {t['spread']:.0%}); "
          f"other processes used {100 * (c['other_cpu_share'] or 0):.0f}% of the CPUs")
    s = m["static"]
    print(f"allocated peak {m['allocated_peak'] * mib:.1f} MiB (rank {row['memory_rank']}): static "
          f"{s['total'] * mib:.1f} (params {s['parameters'] * mib:.1f}, grads {s['gradients'] * mib:.1f}, "
          f"optimizer {(s['optimizer_states'] + s['master_weights']) * mib:.1f}, ZeRO buffers "
          f"{s['zero_buffers'] * mib:.1f}, other {s['other'] * mib:.1f}) + dynamic {m['dynamic_peak'] * mib:.1f}; "
          f"saved for backward {m['saved']['activations'] * mib:.1f} (+ logits/loss {m['saved']['logits_loss'] * mib:.1f})")
    if m.get("dynamic_at_peak"):
        print("blocks the step allocated, alive at its peak (MiB): " +
              ", ".join(f"{k} {v * mib:.1f}" for k, v in m["dynamic_at_peak"].items()))
    if m.get("resident_hwm"):
        print(f"resident peak {m['resident_hwm'] * mib:.1f} MiB (runtime overhead {m['runtime_overhead'] * mib:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
