"""Where one training step's time goes: autosp's memory-lean plan vs its default knobs vs ALST (CPU, gloo).

The setting of ``compare_sp_implementations.py`` (its tiny Llama, batch and ALST driver, imported from it): P
gloo processes, one thread each, fp32, ZeRO-1, SGD with lr 0. Unlike the study, the three implementations live
in one launch and take turns step by step, so the load of a shared machine falls on each alike:

- ``--steps`` rounds of one step each (after two warm-up steps each): per implementation the median and the
  fastest wall time, the median over rounds of its step time over ALST's in the same round (``x_alst``), and
  the median CPU time of rank 0's main thread (what the step computes there; the rest of the wall time is
  waiting: for the other rank, for gloo's transfers, for a core on a shared machine);
- two steps under ``torch.profiler`` with the forward, backward and optimizer step marked, whose op times are
  summed per phase into categories (rank 0, main thread, self time of each op):

  ==================  ===============================================================================
  attention           SDPA kernels (forward and backward)
  tiled MLP / loss    everything inside ``autosp_ops::tiled_mlp*`` / ``tiled_linear_cross_entropy*``
                      (their matmuls, the recompute of the chunk's forward in the backward)
  all-to-all          the Ulysses exchanges (op, copies, gloo call, waiting for the other rank)
  other collectives   the loss all-reduce, DeepSpeed's gradient all-reduce and parameter all-gather
  matmuls             mm/addmm/bmm outside the tiled ops (projections; with checkpointing, their recompute)
  compiled kernels    Inductor's fused elementwise kernels (norms, RoPE, residuals, SiLU): the graph's own time
  other ops           eager elementwise ops (ALST's norms, RoPE, ...), copies, optimizer arithmetic
  python              time in the phase not inside any op (framework and engine code)
  ==================  ===============================================================================

The **compute floor** of an implementation is the sum of its arithmetic categories (attention, tiled MLP and
loss, matmuls, compiled kernels: recompute included, framework, copies and waiting excluded), printed as a
fraction of ALST's whole profiled step: however its communication and framework work were scheduled, the step
cannot take less than that while its kernels run at the rates measured.

Run:  .venv/bin/python studies/profile_step.py [--sp 2] [--seq 4096] [--steps 12]
Writes studies/results/profile_step.json (the table per implementation and phase) and prints it.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import compare_sp_implementations as study  # noqa: E402  (the study's model, batch and baselines)

PHASES = ("forward", "backward", "optimizer")
CATEGORIES = ("attention", "tiled MLP", "tiled loss", "all-to-all", "other collectives", "matmuls",
              "compiled kernels", "other ops", "python")
COMPUTE = ("attention", "tiled MLP", "tiled loss", "matmuls", "compiled kernels")
"""The categories that are the step's arithmetic (kernels, recompute included), not framework, copies or waiting:
their sum is a floor under the step's time for as long as the kernels run at the rates this run measured."""


def category(name: str, ancestors: list) -> str:
    """The category of an op from its name and the names of the ops it ran inside (outermost first)."""
    names = ancestors + [name]
    if any("scaled_dot_product" in n or "ring_attention" in n for n in names):
        return "attention"
    if any("tiled_mlp" in n for n in names):
        return "tiled MLP"
    if any("tiled_linear_cross_entropy" in n for n in names):
        return "tiled loss"
    if any(w in n for n in names for w in ("all_to_all", "alltoall", "AlltoAll")):
        return "all-to-all"
    if any(w in n.lower() for n in names for w in ("all_reduce", "allreduce", "all_gather", "allgather",
                                                      "reduce_scatter", "broadcast", "barrier")):
        return "other collectives"
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"):
        return "matmuls"
    if name.startswith("## Call CompiledFxGraph"):
        return "compiled kernels"
    return "other ops"


def compute_floor_ms(table: dict) -> float:
    """ms per step in the :data:`COMPUTE` categories of one implementation's ``breakdown`` table."""
    return sum(table[p][c] for p in PHASES for c in COMPUTE)


def breakdown(events, steps: int) -> dict:
    """{phase: {category: ms per step}} from the profiler's events of rank 0's main thread."""
    marks = [e for e in events if e.name in PHASES]
    thread = marks[0].thread
    table = {p: dict.fromkeys(CATEGORIES, 0.0) for p in PHASES}
    for event in events:
        if event.thread != thread:
            continue
        ancestors, parent = [], event.cpu_parent
        while parent is not None:
            ancestors.insert(0, parent.name)
            parent = parent.cpu_parent
        self_ms = event.self_cpu_time_total / 1e3 / steps
        if event.name in PHASES and not ancestors:
            table[event.name]["python"] += self_ms
        elif ancestors and ancestors[0] in PHASES:
            table[ancestors[0]][category(event.name, ancestors[1:])] += self_ms
    return table


NAMES = ("autosp_lean", "autosp", "alst")


def build(name, model, ids, labels, args):
    """(engine, loss_fn) for one implementation, driven as in the study; loss_fn() returns the loss."""
    import autosp

    if name == "alst":
        engine, loss_fn, _ = study.alst_engine(model, ids, labels, args)
        return engine, lambda: loss_fn()[0]
    options = autosp.CompileOptions(optimizer=study.sgd0, backend=args.backend)
    if name == "autosp_lean":
        engine = autosp.compile(copy.deepcopy(model), study.lean_plan(args), options=options)
    else:
        engine = autosp.compile(copy.deepcopy(model), autosp.Candidate(sp=args.sp, zero_stage=1, micro_batch=1),
                                options=options)
    return engine, lambda: engine(input_ids=ids, labels=labels)


def worker(rank, world, args):
    import torch._dynamo
    from torch.profiler import ProfilerActivity, profile, record_function
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    torch._dynamo.config.recompile_limit = 64
    model = study.tiny_llama(args)
    ids, labels = study.make_batch(args)
    # All three live in one process and take turns, so a shared machine's load falls on each alike. ALST
    # registers its attention in transformers' process-global table: it is switched in for ALST's steps only
    # (autosp's compiled graphs were traced with the original entry, which their guards check).
    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    runs, attention = {}, {}
    for name in NAMES:  # ALST last: autosp compiles before its registration
        runs[name] = build(name, model, ids, labels, args)
        attention[name] = ALL_ATTENTION_FUNCTIONS["sdpa"]
        ALL_ATTENTION_FUNCTIONS["sdpa"] = original

    def step(name):
        engine, loss_fn = runs[name]
        ALL_ATTENTION_FUNCTIONS["sdpa"] = attention[name]
        try:
            loss = loss_fn()
            engine.backward(loss)
            engine.step()
        finally:
            ALL_ATTENTION_FUNCTIONS["sdpa"] = original
        return loss.item()

    for name in NAMES:
        for _ in range(2):  # compile, warm up
            step(name)
    wall, cpu = {n: [] for n in NAMES}, {n: [] for n in NAMES}
    for i in range(args.steps):  # rounds, each implementation once, the order rotating
        for name in NAMES[i % 3:] + NAMES[:i % 3]:
            dist.barrier()
            start, start_cpu = time.perf_counter(), time.thread_time()
            step(name)
            cpu[name].append(time.thread_time() - start_cpu)
            dist.barrier()
            wall[name].append(time.perf_counter() - start)
    results = {}
    for name in NAMES:
        engine, loss_fn = runs[name]
        ALL_ATTENTION_FUNCTIONS["sdpa"] = attention[name]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(2):
                with record_function("forward"):
                    loss = loss_fn()
                with record_function("backward"):
                    engine.backward(loss)
                with record_function("optimizer"):
                    engine.step()
        ALL_ATTENTION_FUNCTIONS["sdpa"] = original
        ratios = [w / a for w, a in zip(wall[name], wall["alst"])]
        results[name] = {"step_s": statistics.median(wall[name]), "fastest_step_s": min(wall[name]),
                         "x_alst": statistics.median(ratios), "main_thread_cpu_s": statistics.median(cpu[name]),
                         "ms_per_step": breakdown(prof.events(), 2) if rank == 0 else None}
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sp", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=12,
                        help="timed rounds, one step of each implementation per round (default 12)")
    parser.add_argument("--lean-tiles", type=int, default=4)
    parser.add_argument("--lean-overlap", default="none", choices=("none", "kv_async"))
    parser.add_argument("--backend", default="inductor", choices=("inductor", "aot_eager"))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "profile_step.json"))
    args = parser.parse_args()
    # the study's model and batch (its defaults)
    args.layers, args.hidden, args.heads, args.kv_heads, args.vocab, args.prompt_frac = 2, 128, 4, 2, 512, 0.2

    from autosp.compiler import testing
    from autosp.files import write_text

    load = os.getloadavg()[0]  # the machine's 1-minute load before the run: a shared machine's timings vary with it
    results = testing.spawn(worker, args.sp, args)
    alst_total = sum(sum(results["alst"]["ms_per_step"][p].values()) for p in PHASES)
    for name in NAMES:
        results[name]["compute_floor_ms"] = compute_floor_ms(results[name]["ms_per_step"])
        results[name]["compute_floor_x_alst"] = results[name]["compute_floor_ms"] / alst_total
    results["setup"] = {k: v for k, v in vars(args).items() if k != "out"} | {"torch": torch.__version__,
                                                                              "load_average_before": load}
    write_text(args.out, json.dumps(results, indent=2) + "\n")
    names = [n for n in results if n != "setup"]
    print(f"{'ms per step':<18}" + "".join(f"{n:>14}" for n in names) + "   (forward / backward / optimizer of each)")
    for cat in CATEGORIES:
        cells = [results[n]["ms_per_step"] for n in names]
        print(f"{cat:<18}" + "".join(f"{sum(c[p][cat] for p in PHASES):>14.1f}" for c in cells) + "   "
              + " | ".join("/".join(f"{c[p][cat]:.1f}" for p in PHASES) for c in cells))
    print(f"{'total profiled':<18}" + "".join(
        f"{sum(sum(results[n]['ms_per_step'][p].values()) for p in PHASES):>14.1f}" for n in names))
    for n in names:
        r = results[n]
        print(f"{n}: step {r['step_s']:.3f} s (median of {args.steps} rounds; fastest {r['fastest_step_s']:.3f} s), "
              f"{r['x_alst']:.3f} x ALST's step of the same round (median), rank 0 main-thread CPU "
              f"{r['main_thread_cpu_s']:.3f} s")
    for n in names:
        print(f"{n}: compute floor ({', '.join(COMPUTE)}) {results[n]['compute_floor_ms']:.1f} ms = "
              f"{results[n]['compute_floor_x_alst']:.3f} x ALST's profiled step: no schedule of this plan's kernels, "
              f"at these rates, is faster")
    print(f"load average before the run: {load:.2f}; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
