"""``autosp-plan``: search the best sequence-parallel training plan and explain it.

Imports stay light at start-up (no torch, no deepspeed, no numpy/optuna until a search runs), so a
cold run takes about a second and a cached one a fraction of that.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from autosp.errors import EXIT_CODES, UsageError
from autosp.planner.cli.args import ArgParser, check_output_path, request_fields

DESCRIPTION = """\
Pick the best way to train a model at a context length on a cluster: sequence-parallel degree and its
Ulysses x ring split (SP groups may span nodes; the ring carries SP past the head count), ZeRO stage,
micro-batch and gradient accumulation, activation checkpointing, MLP and logits+loss
tiling, activation offload and all-to-all overlap. The choice comes from an analytic cost model
(per-GPU memory against capacity, step time) searched with Optuna (or exhaustively).
"""

EXAMPLES = """\
examples:
  autosp-plan --model llama --ctx 200k --hw h100x8
  autosp-plan --model llama-3.1-70b --ctx 1M --hw h100x8 --nodes 4
  autosp-plan --model llama-3.1-8b --objective max-ctx --hw h100x64        # Ulysses x ring past 32 heads
  autosp-plan --model llama-3.1-8b --objective max-ctx --hw h100x8
  autosp-plan --model path/to/config.json --ctx 128Ki --hw cluster.toml --global-batch 64 \\
              --plan-out plan.json --ds-config ds_config.json
  autosp-plan --model llama --ctx 200k --hw h100x8 --json > plan.json

context lengths (--ctx):
  an integer, optionally with _ separators, or a number with a suffix:
  k = 1,000 and m = 1,000,000 (decimal: 200k = 200,000; 1.5M = 1,500,000);
  Ki = 1,024 and Mi = 1,048,576 (binary: 128Ki = 131,072). Suffixes are case-insensitive.
  With --objective max-ctx, --ctx is optional: the planner finds the longest context that fits
  (in steps of 1,024 tokens); if --ctx is given, it is the least context you accept.

packed documents (--doc-lens / --mean-doc-len):
  attention is priced as the sum over documents of causal attention instead of one ctx x ctx triangle
  (sliding-window layers, e.g. Mistral-7B-v0.1's, by their window); the plan table says what share of the
  triangle remains. Memory does not change: activations are per token. docs/cost_model.md has the model.
  autosp-plan --model llama-3.1-8b --ctx 1M --hw h100x8 --mean-doc-len 16k
  autosp-plan --model llama-3.1-8b --ctx 1M --hw h100x8 --doc-lens lengths.txt

plan cache:
  identical requests are answered from $AUTOSP_CACHE, else $XDG_CACHE_HOME/autosp/plans.sqlite,
  else ~/.cache/autosp/plans.sqlite (--cache PATH to choose, --no-cache to skip it). --cache and
  $AUTOSP_CACHE also take a database URL shared by a team and its CI, e.g.
  postgresql+psycopg://user@host/db (the [db] extra: pip install -e '.[db]'); see docs/shared-planning.md.

distributed search (several workers, one Optuna study):
  autosp-plan ... --storage postgresql+psycopg://user@host/db --trials 30     # on each machine
  autosp-plan ... --storage postgresql+psycopg://user@host/db --trials 0      # the plan of the whole study
  (sqlite:///path.db for workers on one machine; same request on every worker)

measured trials (run the best candidates for a few steps with autosp-train, choose by measurement):
  autosp-plan --model cfg.json --ctx 2k --hw cpu2.toml --dtype fp32 --measure 3 --measure-backend aot_eager

pinned knobs (--fix KNOB=VALUE, repeatable):
  KNOB is a field of the plan's "candidate" (sp, dp, ring, zero_stage, micro_batch, grad_accum, checkpointing,
  mlp_chunks, loss_chunks, offload_activations, overlap, offload_optimizer, ...); VALUE is written as in a
  plan file: 8, true/false, full. The search explores only plans that keep every pin; pins that cannot hold
  on the model and cluster are one line, exit 2.
  autosp-plan --model llama-3.1-8b --ctx 1M --hw h100x8 --fix zero_stage=3 --fix checkpointing=full
  autosp-plan --model llama-3.1-8b --objective max-ctx --hw h100x8 --fix sp=8 --fix offload_optimizer=false

subcommands (autosp-plan SUBCOMMAND --help):
  check PLAN_OR_DS_CONFIG   is a committed plan still valid, feasible and near the best? (CI; exit 0/3/4)
  select --candidates F...  pick the best still-feasible plan among files (CI)
  sweep                     many requests in one table and plot (lists of models, clusters, contexts)
                            autosp-plan sweep --model llama-3.1-8b,llama-3.1-70b --hw h100x8,h100x32 --ctx 128k,1M
                            autosp-plan sweep --model llama-3.1-8b --hw h100x{1,8,64} --objective max-ctx --plot m.png
  explain                   price ONE configuration (knobs from --fix, or a plan / DeepSpeed config file): the
                            plan table, its memory and step time, and why it fits or does not (exit 0 / 3)
                            autosp-plan explain --model llama-3.1-8b --ctx 1M --hw h100x8 --fix sp=8 --fix zero_stage=3
                            autosp-plan explain plan.json --ctx 2M

multi-node jobs (--emit KIND FILE; the plan goes to --plan-out, else beside FILE as FILE's stem + .plan.json):
  autosp-plan --model llama-3.1-8b --ctx 4M --hw h100x32 --emit slurm job.sbatch     # then: sbatch job.sbatch --steps 1000
  autosp-plan --model llama-3.1-8b --ctx 4M --hw h100x32 --emit hostfile hosts       # its comments: the deepspeed command
  by hand, on each of K nodes: autosp-train --nnodes K --node-rank R --master-addr NODE0 --nproc-per-node G --plan plan.json

batch sizes:
  without --global-batch each data-parallel replica trains micro-batch sequences per step
  (grad accum 1). The DeepSpeed config (--ds-config) counts train_batch_size over all dp*sp ranks
  (sp shards per sequence); its "autosp" section states the sequences and tokens per step.
"""


class _Parser(ArgParser):
    """The command's parser: its help also shows the hardware grammar and the exit codes."""

    def format_help(self):
        text = super().format_help()
        try:
            from autosp.cost_models.catalog.hardware import describe_grammar

            grammar = describe_grammar().rstrip()
        except Exception as err:  # noqa: BLE001 - help must always print
            grammar = f"(hardware catalog unavailable: {err})"
        codes = "\n".join(f"  {code}  {meaning}" for code, meaning in sorted(EXIT_CODES.items()))
        indented = "\n".join(textwrap.fill(line, width=98, initial_indent="  ", subsequent_indent="  ")
                             for line in grammar.splitlines())
        return f"{text}\nhardware (--hw):\n{indented}\n\nexit codes:\n{codes}\n"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="autosp-plan", description=DESCRIPTION, epilog=EXAMPLES,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_argument_group("what to train, where")
    what.add_argument("--model", metavar="M", help="preset name (see --list-models; 'llama' = Llama-3.1-8B), "
                                                   "a Hugging Face config.json on disk or a package.module:function "
                                                   "model factory (both priced by their graph profile, traced once "
                                                   "and cached)")
    what.add_argument("--ctx", metavar="C", help="tokens per sequence, e.g. 200k, 1.5M, 128Ki (see below)")
    what.add_argument("--hw", metavar="H", help="cluster: catalog name such as h100x8 (see --list-hardware "
                                                "and the grammar below) or a cluster .toml file")
    what.add_argument("--nodes", metavar="K", help="number of nodes (overrides the --hw node count)")
    what.add_argument("--global-batch", metavar="N",
                      help="sequences per optimizer step (default: one micro-batch per data-parallel replica)")
    what.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="training precision (default bf16)")
    what.add_argument("--attention-kernel", choices=("flash2", "flash3", "cudnn", "flex"),
                      help="the attention kernel to price (default: the one the compiler runs on the accelerator: "
                           "cudnn on Hopper and Blackwell, flash2 elsewhere)")
    what.add_argument("--compile-backend", default="inductor", choices=("inductor", "aot_eager", "eager"),
                      help="how autosp-train will compile the step (its --backend; default inductor): only an "
                           "untiled loss costs differently, Inductor fusing it (eager: not compiled at all)")
    docs = what.add_mutually_exclusive_group()
    docs.add_argument("--doc-lens", metavar="FILE",
                      help="packed documents: their lengths in tokens, as a text file with one length per line, "
                           "a JSON list of lengths, or a JSON object {length: count} (e.g. "
                           "json.dump(collections.Counter(lengths), f)); documents are laid end to end, cut into "
                           "sequences of --ctx tokens, and attend only within themselves (see below)")
    docs.add_argument("--mean-doc-len", metavar="N",
                      help="packed documents, all N tokens long (16k, 4Ki): the cheapest attention a mean of N "
                           "allows; give --doc-lens for a spread of lengths")

    how = p.add_argument_group("search")
    how.add_argument("--objective", default="throughput", choices=("throughput", "max-ctx"),
                     help="throughput: most tokens/s at --ctx (default); max-ctx: the longest context that fits")
    how.add_argument("--search", default="optuna", choices=("optuna", "exhaustive", "fast"),
                     help="optuna (default): TPE with memory as a constraint; exhaustive: score every candidate; "
                          "fast: no sampler, branch and bound over the structure families (what sweep uses)")
    how.add_argument("--fix", action="append", metavar="KNOB=VALUE",
                     help="pin a plan knob (repeatable): the search keeps it (see 'pinned knobs' below)")
    how.add_argument("--trials", metavar="N", help="Optuna trials (default 60; at most 10,000)")
    how.add_argument("--time-budget", metavar="S", help="stop the Optuna trials after S seconds (30, 90s, 2m, 1h); "
                                                        "without --trials the budget alone decides how many run")
    how.add_argument("--seed", metavar="S", type=int, default=0, help="Optuna seed (default 0)")
    cross = how.add_mutually_exclusive_group()
    cross.add_argument("--no-cross-node-sp", dest="allow_cross_node_sp", action="store_false", default=True,
                       help="keep every SP group inside one node (by default groups spanning nodes are searched "
                            "and priced: their all-to-alls or ring steps then use the inter-node links)")
    cross.add_argument("--allow-cross-node-sp", dest="allow_cross_node_sp", action="store_true", default=True,
                       help="accepted for old scripts; no longer needed (spanning nodes is the default)")
    cache = how.add_mutually_exclusive_group()
    cache.add_argument("--cache", metavar="PATH|URL", help="plan cache file or database URL (default: see "
                                                           "'plan cache' below)")
    cache.add_argument("--no-cache", action="store_true", help="neither read nor write the plan cache")

    dist = p.add_argument_group("distributed search (a shared Optuna study; bypasses the plan cache)")
    dist.add_argument("--storage", metavar="URL", help="Optuna storage shared by the workers: sqlite:///study.db or "
                                                       "postgresql+psycopg://user@host/db; --trials N is this "
                                                       "worker's share, --trials 0 only reads the study")
    dist.add_argument("--study-name", metavar="NAME", help="study in the storage (default: derived from the request, "
                                                           "so identical commands join the same study)")
    dist.add_argument("--worker-id", metavar="ID", help="this worker's name on its trials (default host:pid)")

    meas = p.add_argument_group("measured trials (bypass the plan cache)")
    meas.add_argument("--measure", metavar="K", nargs="?", const=3, type=int,
                      help="run the cost model's K best candidates (default 3) for a few steps on this "
                           "machine and choose the plan by measured tokens/s")
    meas.add_argument("--measure-steps", metavar="N", type=int, default=3, help="measured steps per candidate (default 3)")
    meas.add_argument("--measure-warmup", metavar="N", type=int, default=1,
                      help="steps dropped first (compilation; default 1)")
    meas.add_argument("--measure-backend", choices=("inductor", "aot_eager"), default="inductor",
                      help="autosp-train --backend (default inductor; aot_eager compiles faster on CPU)")
    meas.add_argument("--measure-launcher", metavar="TEMPLATE",
                      help="command that starts autosp-train on {world} processes; the train arguments are "
                           "appended. Default: '{python} -m torch.distributed.run --standalone --nproc-per-node "
                           "{world} -m autosp.compiler.train_cli'. Placeholders: {python} {world} {nodes} {per_node}")
    meas.add_argument("--measure-timeout", metavar="S", type=float, default=900.0,
                      help="seconds one measured run may take (default 900)")
    meas.add_argument("--measure-dir", metavar="DIR", help="keep the measured plans and step logs in DIR")

    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the plan JSON (docs/plan-schema.md) and nothing else")
    out.add_argument("--plan-out", metavar="PATH", help="write the plan JSON to PATH (autosp.compile reads it)")
    out.add_argument("--ds-config", metavar="PATH", help="write the DeepSpeed config JSON to PATH")
    out.add_argument("--emit", nargs=2, action="append", metavar=("KIND", "FILE"),
                     help="write the job that runs the plan: 'slurm FILE' an sbatch script (srun + autosp-train "
                          "--nnodes, SIGTERM before the time limit), 'hostfile FILE' the deepspeed launcher's "
                          "hostfile; with the plan at --plan-out, else beside FILE (repeatable; see below)")
    alst = p.add_argument_group("ALST (DeepSpeed Ulysses inside Hugging Face Accelerate; planner/alst.py)")
    alst.add_argument("--backend", choices=("autosp", "alst"), default="autosp",
                      help="alst: the best plan ALST can run (Ulysses only, SP dividing the heads, no autosp-only "
                           "knobs), and what autosp's own plan gains over it")
    alst.add_argument("--accelerate-config", metavar="PATH", help="with --backend alst: write the Accelerate "
                                                                   "config (and PATH's .deepspeed.json) to PATH")
    alst.add_argument("--sft-args", metavar="PATH", nargs="?", const="-",
                      help="with --backend alst: the matching TRL SFTConfig arguments, printed or written to PATH")
    out.add_argument("--list-models", action="store_true", help="list the model presets and exit")
    out.add_argument("--list-hardware", action="store_true", help="list the hardware catalog and exit")
    return p


def _model_rows(models) -> list[str]:
    rows = [f"{'name':<18}{'params':>8}  {'layers':>6} {'hidden':>7} {'heads/kv':>9} {'ffn':>7} {'vocab':>7}  source"]
    for m in models:
        rows.append(f"{m.name:<18}{m.n_params() / 1e9:>7.2f}B  {m.n_layers:>6} {m.hidden:>7} "
                    f"{f'{m.n_heads}/{m.n_kv_heads}':>9} {m.ffn_hidden:>7} {m.vocab:>7}  {m.source}")
    rows.append("'llama' is Llama-3.1-8B; --model also takes a Hugging Face config.json path.")
    return rows


def _hardware_rows(specs) -> list[str]:
    rows = [f"{'name':<12}{'accelerator':<14}{'per node':>9} {'memory':>9} {'bf16 TFLOP/s':>13} "
            f"{'intra GB/s':>11} {'inter GB/s':>11}"]
    for h in specs:
        a = h.accelerator
        rows.append(f"{h.name:<12}{a.name:<14}{h.devices_per_node:>9} {a.memory_bytes / 2**30:>6.0f} GiB "
                    f"{a.peak_flops / 1e12:>13,.0f} {h.intra_node_bandwidth / 1e9:>11,.0f} "
                    f"{h.inter_node_bandwidth / 1e9:>11,.0f}")
    rows.append("Bandwidths are per GPU, one direction. NAMExN = N devices (h100x8 = one node of 8, h100x32 = 4 "
                "nodes); see --help for the grammar.")
    return rows


SUBCOMMANDS = ("check", "select", "sweep", "explain")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        if argv[0] == "sweep":
            from autosp.planner.cli import sweep as sweep_cli

            return sweep_cli.main(argv[1:])
        if argv[0] == "explain":
            from autosp.planner.cli import price as price_cli

            return price_cli.main(argv[1:])
        from autosp.planner.cli import check as check_cli

        return check_cli.main(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    if args.list_models or args.list_hardware:
        if args.list_models:
            from autosp.cost_models.catalog.models import list_models

            print("\n".join(_model_rows(list_models())))
        if args.list_hardware:
            from autosp.cost_models.catalog.hardware import list_hardware

            print("\n".join(_hardware_rows(list_hardware())))
        return 0
    missing = [flag for flag, value in (("--model", args.model), ("--hw", args.hw)) if not value]
    if args.ctx is None and args.objective != "max-ctx":
        missing.insert(1, "--ctx")
    if missing:
        raise UsageError(f"missing {', '.join(missing)} (try: autosp-plan --model llama --ctx 200k --hw h100x8)")
    for path, flag in ((args.plan_out, "--plan-out"), (args.ds_config, "--ds-config")):
        if path is not None:  # "" too: a path was asked for
            check_output_path(path, flag)
    from autosp.planner.cli import emit

    emits = emit.check_emits(args.emit, args.plan_out, args.ds_config)  # before any search, like the paths above

    from autosp.planner.api import RunOptions, plan_for
    from autosp.planner.request import PlanRequest

    measure = None
    if args.measure is not None:
        from autosp.planner.measure import MeasureOptions

        measure = MeasureOptions(k=args.measure, steps=args.measure_steps, warmup=args.measure_warmup,
                                 backend=args.measure_backend, launcher=args.measure_launcher,
                                 timeout_s=args.measure_timeout, keep_dir=args.measure_dir)
    request = PlanRequest(**request_fields(args))
    options = RunOptions(cache=None if args.no_cache else (args.cache or True), storage=args.storage,
                         study_name=args.study_name, worker=args.worker_id, measure=measure)
    if args.backend == "alst" or args.accelerate_config is not None or args.sft_args is not None:
        if emits:
            raise UsageError("--emit writes the job of autosp's own plan; drop it with --backend alst (its "
                             "Accelerate config runs under accelerate launch)")
        from autosp.planner.alst import main_alst

        return main_alst(args, request, plan_for, options)
    plan = plan_for(request, options)

    from autosp.planner.ds_config import write_outputs

    plan_out = emit.plan_path_for(emits, args.plan_out) if emits else args.plan_out
    written = write_outputs(plan, plan_out, args.ds_config)
    written += emit.write_emits(emits, plan, plan_out) if emits else []
    if args.json:
        sys.stdout.write(plan.to_json())
    else:
        from autosp.planner.cli.report import render

        sys.stdout.write(render(plan, tuple(written), getattr(sys.stdout, "encoding", None)))
    return 0


__all__ = ["SUBCOMMANDS", "build_parser", "main"]


if __name__ == "__main__":
    from autosp.cli import plan_main

    sys.exit(plan_main(sys.argv[1:]))
