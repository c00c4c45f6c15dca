"""Plans for the model families of issue 22 on one H100 node: two mixtures of experts, Gemma 3, a tied Qwen3.

    python -m studies.moe_plans                  # ~2-6 minutes on 2 shared cores (the default search)
    python -m studies.moe_plans --search fast    # seconds

For each of Qwen3-30B-A3B, Mixtral-8x7B, Gemma-3-12B and Qwen3-4B (presets: cost_models/catalog/models.toml
cites their configs) it runs ``autosp-plan --hw h100x8`` at 128k and 1M tokens (objective throughput) and with
``--objective max-ctx``, plus the tied-embedding case of issue 22 (Qwen3-0.6B at 1M with ``--fix zero_stage=3``),
Mixtral on 4 nodes, both MoE models pinned to ZeRO-2, and Qwen3-30B-A3B's best plan at each pinned ep,
and prints one row per plan: the knobs (ep among them), the predicted peak memory with the routed experts'
states apart, the expert all-to-all time, tokens/s and MFU. Writes studies/results/moe_plans.{txt,json}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
GIB = 2 ** 30

REQUESTS = [(model, ctx, objective, (), None) for model in ("qwen3-30b-a3b", "mixtral-8x7b", "gemma-3-12b", "qwen3-4b")
            for ctx, objective in (("128k", "throughput"), ("1M", "throughput"), ("128k", "max-ctx"))] + [
    ("qwen3-0.6b", "1M", "throughput", (("zero_stage", 3),), None),      # tied embeddings, loss tiled at ZeRO-3
    ("mixtral-8x7b", "32k", "throughput", (), 4),                        # 4 nodes: ZeRO-3 gathers cross the network
    ("qwen3-30b-a3b", "128k", "throughput", (("zero_stage", 2),), None),  # below ZeRO-3 experts must be sharded
    ("mixtral-8x7b", "128k", "throughput", (("zero_stage", 2),), None),
] + [("qwen3-30b-a3b", "128k", "throughput", (("ep", ep),), None) for ep in (1, 2, 4, 8)]  # what each ep costs


def run(search: str) -> list[dict]:
    from autosp.cost_models import moe
    from autosp.errors import AutospError
    from autosp.planner.api import plan_for
    from autosp.planner.request import PlanRequest

    rows = []
    for model, ctx, objective, fix, nodes in REQUESTS:
        start = time.time()
        try:
            plan = plan_for(PlanRequest(model=model, ctx=ctx, hw="h100x8", nodes=nodes, objective=objective,
                                        search=search, fix=fix))
        except AutospError as err:  # e.g. nothing fits: the row says why
            rows.append({"model": model, "ctx": ctx, "objective": objective, "fix": dict(fix), "nodes": nodes or 1,
                         "error": str(err)})
            continue
        e, m = plan.estimate, plan.model
        rows.append({
            "model": model, "ctx": ctx, "objective": objective, "fix": dict(fix), "nodes": nodes or 1,
            "seq_len": plan.workload.seq_len,
            "params_total": m.n_params(), "params_active": moe.active_params(m) if m.n_experts else m.n_params(),
            "plan": plan.candidate.short(), "ep": plan.candidate.ep,
            "memory_gib": e.memory.total / GIB, "expert_states_gib": e.memory.expert_states / GIB,
            "capacity_gib": e.capacity_bytes / GIB, "expert_comm_s": e.time.expert_comm, "step_s": e.time.step,
            "tokens_per_s": e.tokens_per_second, "mfu": e.mfu, "wall_s": time.time() - start})
        print(f"  {model} {ctx} {objective}: {plan.candidate.short()}", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict], search: str) -> str:
    lines = [f"autosp-plan --hw h100x8 (8 x H100 80GB per node), search {search}; predicted per GPU ('experts': the "
             "routed experts' weights, gradients and optimizer states; 'a2a s': their dispatch/combine all-to-alls "
             "per step)", "",
             f"{'model':<15}{'request':<30}{'params (active)':<18}{'plan':<82}{'mem GiB':>8}{'experts':>9}"
             f"{'a2a s':>8}{'step s':>9}{'tok/s':>9}{'MFU':>7}"]
    for r in rows:
        request = f"{r['ctx']} {r['objective']}" + (" " + " ".join(f"{k}={v}" for k, v in r["fix"].items())
                                                    if r["fix"] else "") + (f" x{r['nodes']} nodes"
                                                                            if r["nodes"] > 1 else "")
        if "error" in r:
            lines.append(f"{r['model']:<15}{request:<30}{r['error']}")
            continue
        if r["objective"] == "max-ctx":
            request = f"max-ctx: {r['seq_len']:,}"
        params = f"{r['params_total'] / 1e9:.2f}B ({r['params_active'] / 1e9:.2f}B)"
        lines.append(f"{r['model']:<15}{request:<30}{params:<18}{r['plan']:<82}{r['memory_gib']:>8.1f}"
                     f"{r['expert_states_gib']:>9.1f}{r['expert_comm_s']:>8.3f}{r['step_s']:>9.2f}"
                     f"{r['tokens_per_s']:>9,.0f}{100 * r['mfu']:>6.1f}%")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--search", default="optuna", choices=("optuna", "fast", "exhaustive"))
    parser.add_argument("--out", default=str(RESULTS / "moe_plans"))
    args = parser.parse_args(argv)
    rows = run(args.search)
    text = table(rows, args.search)
    print(text)
    from autosp.files import write_text

    write_text(f"{args.out}.txt", text)
    write_text(f"{args.out}.json", json.dumps({"search": args.search, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
