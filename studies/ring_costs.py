"""The cost model's ring terms against real runs on this CPU (issue 11's evidence for 2-D SP).

    python -m studies.ring_costs                 # about 30 minutes on 2 busy shared cores
    python -m studies.ring_costs --repredict     # re-predict the last run's rows, measure nothing

Two parts, both on 4 gloo ranks (world 4, fp32):

1. **Training rows** (``studies.measure``: the compiled SP step under DeepSpeed, the same harness as
   knob_costs and cost_model_accuracy): a tiny Llama at sp = 4 split as U x R = 4x1 (pure Ulysses), 2x2
   and 1x4 (pure ring), at one length, with full checkpointing + tiled loss, at longer lengths, with
   sequence checkpointing, at a length that 2R does not divide (padded to lcm(P, 2R)), a 2-head model (SP
   past the head count, which only a ring allows) and ZeRO-3. Per row (the worse rank): bytes saved for
   backward (saved-tensor hooks) against the cost model's kept activations, the activation working set at
   the step's peak (blocks alive at the allocation peak that are neither saved for backward, gradients
   nor ZeRO buckets) against the cost model's one-layer transient, the allocated peak against the
   prediction without its GPU-only reserve, and the step time (median of the timed steps, slowest rank),
   each with the ratio predicted / measured; then "vs ring 1": each ring row against its U x 1 row,
   measured and predicted. Predictions use the calibrated hardware file of this machine
   (studies/results/calibrated-cpux4.json, ``autosp-calibrate --quick --ranks 4``).
2. **Ring attention alone** (the ``autosp_ops::ring_attention`` op and its backward, the one the compiled
   graph calls, on the same 4 ranks): per rank, the time spent in attention kernels (the blockwise
   forward and backward, timed around each call, so the P2P waits are excluded) for the zigzag layout the
   compiler uses and, for contrast, a contiguous layout; max / min over the ranks (the cost model assumes
   1.00 for zigzag). And block efficiency: the ring's per-rank kernel time at R = 4 against the Ulysses
   kernel over the whole sequence with H/4 heads (same FLOPs), next to the cost model's
   ``ring.compute_factor``.

3. **Step time, interleaved**: one engine per layout (U x R = 4x1, 2x2, 1x4) in the same 4 processes, stepped
   in turn (A B C A B C ...) so the load other processes put on the machine falls on each alike; median step
   time (slowest rank) against the prediction, and each layout against U4xR1. ``--only-interleaved`` reruns
   just this part and keeps the rest of the results file.

Writes studies/results/ring_costs.{txt,json}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict

from autosp.contract.specs import ModelSpec

WORLD = 4
# Tiny so that long sequences run on 2 shared cores; 4 query heads so that U = 4 is possible, 2 KV heads so
# that U = 4 replicates key/value heads (what ring splits avoid).
MODEL = ModelSpec(name="ring-llama-2l-h128", n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, head_dim=32,
                  ffn_hidden=352, vocab=2048)
# Two query heads: Ulysses alone stops at sp = 2; sp = 4 needs a ring.
MODEL_2H = ModelSpec(name="ring-llama-2l-2heads", n_layers=2, hidden=64, n_heads=2, n_kv_heads=1, head_dim=32,
                     ffn_hidden=176, vocab=2048)
BASE_SEQ = 4096
LONG_SEQS = (8192, 16384)
ODD_SEQ = 4092          # divisible by P = 4, not by 2R = 8: padded to 4096 for ring 4 (and kept at 4092 for ring 1/2)

GROUPS = [  # (group title, [(label, model, seq, knob overrides)]); a group's first row is its "ring 1" baseline
    ("ring 1/2/4 at one length (ZeRO-1, no checkpointing)",
     [(f"S={BASE_SEQ} U{WORLD // r}xR{r}", MODEL, BASE_SEQ, dict(ring=r)) for r in (1, 2, 4)]),
    ("ckpt full + loss tiled 4",
     [(f"S={BASE_SEQ} U{WORLD // r}xR{r} full+loss4", MODEL, BASE_SEQ,
       dict(ring=r, checkpointing="full", loss_chunks=4)) for r in (1, 2, 4)]),
    ("longer sequences",
     [(f"S={s} U{WORLD // r}xR{r}", MODEL, s, dict(ring=r)) for s in LONG_SEQS for r in (1, 2, 4)]),
    ("ckpt sequence vs full under a ring",
     [(f"S={BASE_SEQ} U2xR2 {c}", MODEL, BASE_SEQ, dict(ring=2, checkpointing=c)) for c in ("full", "sequence")]
     + [(f"S={BASE_SEQ} U1xR4 {c}", MODEL, BASE_SEQ, dict(ring=4, checkpointing=c)) for c in ("full", "sequence")]),
    ("S not divisible by 2R (padded to lcm(P, 2R))",
     [(f"S={ODD_SEQ} U{WORLD // r}xR{r}", MODEL, ODD_SEQ, dict(ring=r)) for r in (1, 2, 4)]),
    ("2 heads at sp 4 (past the head count)",
     [(f"2 heads S={BASE_SEQ} U{WORLD // r}xR{r}", MODEL_2H, BASE_SEQ, dict(ring=r)) for r in (2, 4)]),
    ("ZeRO-3",
     [(f"S={BASE_SEQ} U{WORLD // r}xR{r} z3", MODEL, BASE_SEQ, dict(ring=r, zero_stage=3)) for r in (1, 2)]),
]


def configs(steps: int, backend: str, quick: bool):
    from studies.measure import RunConfig

    out = []
    for title, rows in GROUPS:
        for label, model, seq, knobs in rows:
            if quick and seq > BASE_SEQ:
                continue
            knobs = {"zero_stage": 1, **knobs}
            out.append((title, RunConfig(model=model, seq_len=seq, sp=WORLD, warmup=1, steps=steps, backend=backend,
                                         label=label, **knobs)))
    return out


# --- part 2: ring attention alone ---------------------------------------------------------------------

def _timed(fn, sink: list):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        sink.append(time.perf_counter() - t0)
        return out
    return wrapper


def _attention_worker(rank, world, seq, heads, kv_heads, head_dim, repeats):
    """Per-rank attention kernel seconds (forward + backward, median over ``repeats``) for the ring op with the
    zigzag and a contiguous layout over all ``world`` ranks, and for the Ulysses kernel (causal over the whole
    sequence, heads / world query heads)."""
    import torch
    import torch.distributed as dist

    from autosp.compiler.attention import kernels, layout, ring

    group = dist.group.WORLD.group_name
    gen = torch.Generator().manual_seed(rank)
    n = seq // world
    kernel_times: list = []
    ring.block_forward = _timed(ring.block_forward, kernel_times)  # this process only: a spawned rank
    ring.block_backward = _timed(ring.block_backward, kernel_times)
    layouts = {"zigzag": layout.flat_ranges(seq, world),
               "contiguous": [x for j in range(world) for x in (j * n, (j + 1) * n)]}
    out = {}
    for name, ranges in layouts.items():
        kernel, wall = [], []
        for i in range(repeats + 1):
            q = torch.randn(1, heads, n, head_dim, generator=gen, requires_grad=True)
            k = torch.randn(1, kv_heads, n, head_dim, generator=gen, requires_grad=True)
            v = torch.randn(1, kv_heads, n, head_dim, generator=gen, requires_grad=True)
            dist.barrier()
            kernel_times.clear()
            t0 = time.perf_counter()
            o, _lse = ring.ring_attention(q, k, v, None, group, ranges)
            o.backward(torch.ones_like(o))
            elapsed = time.perf_counter() - t0
            if i:  # the first call warms up
                kernel.append(sum(kernel_times))
                wall.append(elapsed)
        out[name] = {"kernel_s": statistics.median(kernel), "op_s": statistics.median(wall)}
    # Ulysses: after its all-to-all a rank holds the whole sequence for heads / world query heads (key/value
    # heads replicated up to one per rank when fewer than the ranks)
    hq, hkv = max(1, heads // world), max(1, kv_heads // world)
    times = []
    for i in range(repeats + 1):
        q = torch.randn(1, hq, seq, head_dim, generator=gen)
        k = torch.randn(1, hkv, seq, head_dim, generator=gen)
        v = torch.randn(1, hkv, seq, head_dim, generator=gen)
        dist.barrier()
        t0 = time.perf_counter()
        o, lse = kernels.sdpa_with_lse(q, k, v, True, None)
        kernels.sdpa_with_lse_backward(torch.ones_like(o), q, k, v, o, lse, True, None)
        if i:
            times.append(time.perf_counter() - t0)
    out["ulysses"] = {"kernel_s": statistics.median(times)}
    gathered = [None] * world
    dist.all_gather_object(gathered, out)
    return gathered


def attention_part(seqs, repeats: int) -> list[dict]:
    from autosp.compiler import testing
    from autosp.cost_models import ring as ring_cost
    from autosp.cost_models.shapes import Shapes
    from autosp.contract.specs import Candidate, Workload

    rows = []
    for seq in seqs:
        per_rank = testing.spawn(_attention_worker, WORLD, seq, MODEL.n_heads, MODEL.n_kv_heads, MODEL.head_dim,
                                 repeats)
        row = {"seq": seq, "per_rank": per_rank}
        for name in ("zigzag", "contiguous"):
            ks = [r[name]["kernel_s"] for r in per_rank]
            row[name] = {"kernel_s": ks, "max_over_min": max(ks) / min(ks),
                         "op_s": [r[name]["op_s"] for r in per_rank]}
        uly = statistics.median(r["ulysses"]["kernel_s"] for r in per_rank)
        ring_kernel = statistics.mean(row["zigzag"]["kernel_s"])
        sh = Shapes(MODEL, Workload(seq_len=seq), Candidate(sp=WORLD, ring=WORLD))
        row["block_efficiency"] = {"ulysses_kernel_s": uly, "ring_kernel_s": ring_kernel,
                                   "measured_factor": ring_kernel / uly,
                                   "predicted_factor": ring_cost.compute_factor(sh)}
        rows.append(row)
    return rows


# --- part 3: step time, the layouts interleaved -------------------------------------------------------

def _interleaved_worker(rank, world, model, seq, rings, rounds, backend):
    """Step seconds (slowest rank) of one engine per ring degree, stepped in turn (A B C A B C ...) so that the
    load other processes put on the machine falls on every layout alike."""
    import torch
    import torch.distributed as dist

    import autosp
    from autosp.compiler.models.llama import Llama

    torch.manual_seed(0)
    ids = torch.randint(0, model.vocab, (1, seq), generator=torch.Generator().manual_seed(1234))
    engines = [autosp.compile(Llama(model), autosp.Candidate(sp=world, ring=r, zero_stage=1, micro_batch=1),
                              options=autosp.CompileOptions(backend=backend)) for r in rings]

    def step(engine):
        loss = engine(input_ids=ids, labels=ids)
        engine.backward(loss)
        engine.step()

    for engine in engines:  # compile
        step(engine)
    times = [[] for _ in rings]
    for _ in range(rounds):
        for i, engine in enumerate(engines):
            dist.barrier()
            t0 = time.perf_counter()
            step(engine)
            mine = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            times[i].append(mine.item())
    return times


def interleaved_part(seq: int, rounds: int, backend: str, hw) -> dict:
    from autosp.compiler import testing
    from studies.measure import RunConfig
    from studies.measure.compare import predicted as base

    rings = (1, 2, 4)
    started = time.time()
    times = testing.spawn(_interleaved_worker, WORLD, MODEL, seq, rings, rounds, backend)
    rows = []
    for r, ts in zip(rings, times):
        cfg = RunConfig(model=MODEL, seq_len=seq, sp=WORLD, ring=r, zero_stage=1, backend=backend)
        rows.append({"ring": r, "times": ts, "measured": statistics.median(ts), "predicted": base(cfg, hw)["step"]})
    return {"seq": seq, "rounds": rounds, "backend": backend, "rows": rows, "wall_s": round(time.time() - started, 1)}


# --- predictions and table --------------------------------------------------------------------------

def predicted(cfg, hw) -> dict:
    """The harness's predicted figures, plus the working set at the predicted peak: in the loss phase (the
    cost model's peak when the loss is untiled here) the loss's transient tensors and the all-to-all staging,
    else one layer's backward transient (ring buffers included) and the untiled logits."""
    from autosp.cost_models import estimate
    from autosp.cost_models.memory import a2a_buffer_bytes, activation_bytes, loss_phase_bytes
    from autosp.cost_models.shapes import Shapes
    from studies.measure.compare import predicted as base

    out = base(cfg, hw)
    cand = cfg.candidate()
    sh = Shapes(cfg.model, cfg.workload(), cand)
    est = estimate(cfg.model, hw, cfg.workload(), cand)
    loss_phase = any(note.startswith("peak in the loss phase") for note in est.notes)
    if loss_phase:
        out["transient"] = loss_phase_bytes(sh, cand)[0] + a2a_buffer_bytes(sh)
    else:
        out["transient"] = activation_bytes(sh, cand)[1] + loss_phase_bytes(sh, cand)[1]
    out["peak_phase"] = "loss" if loss_phase else "bwd"
    return out


def measured(row: dict) -> dict:
    from studies.measure.compare import measured as base

    out = base(row)
    at_peak = row["memory"].get("dynamic_at_peak") or {}
    out["transient"] = at_peak.get("other", 0)
    return out


def render(rows: list[dict], attention: list[dict], interleaved: dict | None = None) -> str:
    from studies.measure.compare import MIB, fmt_ratio

    head = (f"{'setting':<30}{'saved MiB':>10}{'pred':>7}{'p/m':>6} {'work MiB':>9}{'pred':>7}{'p/m':>6}{'at':>5} "
            f"{'peak MiB':>9}{'pred':>7}{'p/m':>6} {'step ms':>8}{'pred':>7}{'p/m':>6}  "
            f"{'vs ring1 peak m/p':>17} {'step m/p':>11}")
    lines = [head, "-" * len(head)]
    def same_but_ring(a, b):
        ca, cb = dict(a["config"]), dict(b["config"])
        ca.pop("ring"), cb.pop("ring"), ca.pop("label"), cb.pop("label")
        return ca == cb

    group = None
    for r in rows:
        if r["group"] != group:
            group = r["group"]
            lines.append(f"[{group}]")
        if r["status"] != "ok":
            lines.append(f"{r['label']:<30}{r['status']}: {r.get('error')}")
            continue
        m, p = r["measured"], r["predicted"]
        rel = ""
        # vs ring 1: the row with every other setting equal (in any group), measured and predicted
        base = next((b for b in rows if b["status"] == "ok" and b["config"]["ring"] == 1 and same_but_ring(b, r)), None)
        if base is not None and r["config"]["ring"] > 1:
            bm, bp = base["measured"], base["predicted"]
            rel = (f"{m['peak'] / bm['peak']:7.2f}/{p['peak'] / bp['peak']:<9.2f} "
                   f"{m['step'] / bm['step']:5.2f}/{p['step'] / bp['step']:<5.2f}")
        lines.append(f"{r['label']:<30}{m['saved'] / MIB:10.1f}{p['saved'] / MIB:7.1f}{fmt_ratio(p['saved'], m['saved']):>6} "
                     f"{m['transient'] / MIB:9.1f}{p['transient'] / MIB:7.1f}{fmt_ratio(p['transient'], m['transient']):>6}"
                     f"{p.get('peak_phase', ''):>5} "
                     f"{m['peak'] / MIB:9.1f}{p['peak'] / MIB:7.1f}{fmt_ratio(p['peak'], m['peak']):>6} "
                     f"{m['step'] * 1e3:8.0f}{p['step'] * 1e3:7.0f}{fmt_ratio(p['step'], m['step']):>6}  {rel}")
    lines.append("")
    lines.append(f"ring attention alone, {WORLD} ranks, {MODEL.n_heads} heads / {MODEL.n_kv_heads} KV heads, "
                 f"head dim {MODEL.head_dim}, forward + backward, kernel seconds per rank (P2P waits excluded)")
    head2 = (f"{'S':>6}  {'zigzag ms per rank':<26}{'max/min':>8}  {'contiguous ms per rank':<26}{'max/min':>8}  "
             f"{'Ulysses ms':>10}{'ring4/Ulysses m':>17}{'pred':>7}")
    lines += [head2, "-" * len(head2)]
    for a in attention:
        zz = " ".join(f"{t * 1e3:5.0f}" for t in a["zigzag"]["kernel_s"])
        cc = " ".join(f"{t * 1e3:5.0f}" for t in a["contiguous"]["kernel_s"])
        be = a["block_efficiency"]
        lines.append(f"{a['seq']:>6}  {zz:<26}{a['zigzag']['max_over_min']:8.2f}  {cc:<26}"
                     f"{a['contiguous']['max_over_min']:8.2f}  {be['ulysses_kernel_s'] * 1e3:10.0f}"
                     f"{be['measured_factor']:17.2f}{be['predicted_factor']:7.2f}")
    if interleaved:
        lines.append("")
        lines.append(f"step time, U x R layouts stepped in turn ({interleaved['rounds']} rounds, median, slowest rank), "
                     f"S = {interleaved['seq']}, ZeRO-1, {interleaved['backend']}")
        head3 = f"{'layout':<10}{'step ms':>9}{'pred':>8}{'p/m':>6}  {'vs U4xR1 m/p':>13}  {'each round, ms':<30}"
        lines += [head3, "-" * len(head3)]
        b = interleaved["rows"][0]
        for r in interleaved["rows"]:
            layout = f"U{WORLD // r['ring']}xR{r['ring']}"
            each = " ".join(f"{t * 1e3:.0f}" for t in r["times"])
            lines.append(f"{layout:<10}{r['measured'] * 1e3:9.0f}{r['predicted'] * 1e3:8.0f}"
                         f"{r['predicted'] / r['measured']:6.2f}  "
                         f"{r['measured'] / b['measured']:6.2f}/{r['predicted'] / b['predicted']:<6.2f}  {each}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.ring_costs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per row (default 2)")
    parser.add_argument("--backend", default="aot_eager", choices=("aot_eager", "inductor"))
    parser.add_argument("--quick", action="store_true", help=f"only the rows at S <= {BASE_SEQ}")
    parser.add_argument("--repeats", type=int, default=3, help="attention-alone repetitions (default 3)")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved step-time rounds (default 6)")
    parser.add_argument("--only-interleaved", action="store_true",
                        help="measure only the interleaved step times; keep the rest of results/ring_costs.json")
    parser.add_argument("--repredict", action="store_true",
                        help="measure nothing: re-predict the rows of results/ring_costs.json with the current "
                             "cost model (the measurements do not depend on it)")
    args = parser.parse_args(argv)

    from studies.measure import RunConfig, measure_many
    from studies.measure.compare import RESULTS, calibrated_cpu, environment, write_json

    hw = calibrated_cpu(WORLD)
    started = time.time()
    measured_wall = None
    interleaved = None
    if args.repredict or args.only_interleaved:
        import json

        old = json.loads((RESULTS / "ring_costs.json").read_text())
        interleaved = old.get("interleaved")
        if args.only_interleaved:
            print("step times, layouts interleaved ...", file=sys.stderr, flush=True)
            interleaved = interleaved_part(LONG_SEQS[0], args.rounds, args.backend, hw)
        elif interleaved:
            from studies.measure.compare import predicted as predicted_base

            for r in interleaved["rows"]:
                cfg = RunConfig(model=MODEL, seq_len=interleaved["seq"], sp=WORLD, ring=r["ring"], zero_stage=1,
                                backend=interleaved["backend"])
                r["predicted"] = predicted_base(cfg, hw)["step"]
        pairs = [(r["group"], RunConfig.from_dict(r["config"])) for r in old["rows"]]
        raw = [r.get("raw") or r for r in old["rows"]]
        attention = old["attention"]
        measured_wall = old.get("wall_s")
        from autosp.cost_models import ring as ring_cost
        from autosp.cost_models.shapes import Shapes
        from autosp.contract.specs import Candidate, Workload

        for a in attention:
            sh = Shapes(MODEL, Workload(seq_len=a["seq"]), Candidate(sp=WORLD, ring=WORLD))
            a["block_efficiency"]["predicted_factor"] = ring_cost.compute_factor(sh)
    else:
        pairs = configs(args.steps, args.backend, args.quick)
        print(f"measuring {len(pairs)} rows on {WORLD} ranks ...", file=sys.stderr, flush=True)

        def progress(i, row):
            print(f"  [{i + 1}/{len(pairs)}] {row['label']}: {row['status']} "
                  f"({time.time() - started:.0f} s)", file=sys.stderr, flush=True)

        raw = measure_many([c for _, c in pairs], hardware=None, on_row=progress)
        print("ring attention alone ...", file=sys.stderr, flush=True)
        attention = attention_part((BASE_SEQ, LONG_SEQS[-1]) if not args.quick else (BASE_SEQ,), args.repeats)
        print("step times, layouts interleaved ...", file=sys.stderr, flush=True)
        interleaved = interleaved_part(LONG_SEQS[0] if not args.quick else BASE_SEQ, args.rounds, args.backend, hw)
    rows = []
    for (group, cfg), row in zip(pairs, raw):
        out = {"group": group, "label": cfg.label, "status": row["status"], "config": cfg.to_dict()}
        if row["status"] == "ok":
            out.update(measured=measured(row), predicted=predicted(cfg, hw), raw=row)
        else:
            out["error"] = row.get("error")
        rows.append(out)
    table = render(rows, attention, interleaved)
    ok = [r for r in rows if r["status"] == "ok"]
    contention = max(((r["measured"]["other_cpu"] or 0) for r in ok), default=0)
    text = (f"ring costs: {MODEL.name} ({MODEL.n_layers} layers, hidden {MODEL.hidden}, {MODEL.n_heads} heads, "
            f"{MODEL.n_kv_heads} KV heads, vocab {MODEL.vocab}) and {MODEL_2H.name} ({MODEL_2H.n_heads} heads, "
            f"{MODEL_2H.n_kv_heads} KV head); sp = {WORLD} = U x R on {WORLD} gloo ranks, fp32, "
            f"{pairs[0][1].backend}, {pairs[0][1].steps} timed steps; predictions with {hw.name}\n"
            f"saved = bytes saved for backward per rank (cost model: kept activations); work = working set at the "
            f"step's allocation peak: blocks alive then that are neither saved for backward, gradients nor ZeRO "
            f"buckets (cost model, at its predicted peak 'at': loss = the loss phase's transient tensors and "
            f"all-to-all staging, bwd = one layer's backward transient, ring buffers included, and the untiled "
            f"logits); peak = allocated peak per rank "
            f"(cost model: total minus reserve); p/m = predicted / measured; vs ring1 = this row over its group's "
            f"U x 1 row, measured/predicted\n"
            f"other processes used up to {100 * contention:.0f}% of the CPUs while timing\n\n{table}\n")
    print(text)
    write_json(RESULTS / "ring_costs.json", {"environment": environment(), "hardware": hw.name,
                                            "models": [asdict(MODEL), asdict(MODEL_2H)], "rows": rows,
                                            "attention": attention,
                                            "interleaved": interleaved, "wall_s": measured_wall or round(time.time() - started, 1)})
    (RESULTS / "ring_costs.txt").write_text(text, encoding="utf-8")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
