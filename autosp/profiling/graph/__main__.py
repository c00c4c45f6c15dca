"""``python -m autosp.profiling.graph MODEL [--json]``: a model's graph profile and how it
compares with the analytic (Llama-block) formulas.

MODEL is a Hugging Face config.json (or its directory) or ``package.module:function`` returning an
``nn.Module``. The analytic side is the ModelSpec the planner reads from the same config.json
(cost_models.catalog.models.model_from_hf_config) when it understands it, else the widths the trace found.
"""

from __future__ import annotations

import argparse
import json
import sys

from autosp.profiling.graph import describe_model_arg, load_or_build
from autosp.profiling.graph.compare import comparison, format_table
from autosp.cost_models.profile import analytic_profile
from autosp.cost_models.specs import Candidate, Workload


def analytic_reference(model_arg: str, profile):
    """(ModelSpec, where it came from) for the analytic side of the comparison."""
    kind, target = describe_model_arg(model_arg)
    if kind == "config":
        try:
            from autosp.cost_models.catalog.models import model_from_hf_config

            return model_from_hf_config(target), "config.json read by the model catalog"
        except Exception as err:  # noqa: BLE001 - any reader failure falls back to the traced widths
            return profile.model_spec(), f"traced widths (the model catalog cannot read it: {err})"
    return profile.model_spec(), "traced widths"


def _reference_candidate(profile) -> Candidate:
    for sp in (8, 4, 2, 1):
        if profile.n_heads % sp == 0 and (sp <= 1 or profile.n_kv_heads % sp == 0 or sp % profile.n_kv_heads == 0):
            return Candidate(sp=sp, zero_stage=3)
    return Candidate(sp=1, zero_stage=3)


def end_to_end(profile, spec, seq_len: int = 32768) -> list[dict]:
    """estimate() with the graph profile and with the analytic one, on h100x8, for three policies."""
    from dataclasses import replace

    from autosp.cost_models import estimate
    from autosp.cost_models.catalog.hardware import resolve_hardware

    hw = resolve_hardware("h100x8")
    base = _reference_candidate(profile)
    work = Workload(seq_len=seq_len)
    out = []
    aprof = analytic_profile(spec)
    for policy in ("none", "selective", "full"):
        cand = replace(base, checkpointing=policy)
        g = estimate(spec, hw, work, cand, profile=profile)
        a = estimate(spec, hw, work, cand, profile=aprof)
        out.append({"candidate": cand.short(), "workload": f"{seq_len} tokens on h100x8",
                    "graph": {"activations": g.memory.activations, "logits_loss": g.memory.logits_loss,
                              "total": g.memory.total, "step_s": g.time.step},
                    "analytic": {"activations": a.memory.activations, "logits_loss": a.memory.logits_loss,
                                 "total": a.memory.total, "step_s": a.time.step}})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autosp.profiling.graph", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help="config.json (or its directory) or package.module:function")
    parser.add_argument("--preset", help="profile a planner preset (e.g. llama-3.1-8b) through a generated config.json")
    parser.add_argument("--json", action="store_true", help="print the profile and the comparison as JSON")
    parser.add_argument("--rebuild", action="store_true", help="trace again even if the profile is cached")
    parser.add_argument("--seq-lens", help="comma-separated sequence lengths to trace (default 333,667,1001)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    if (args.model is None) == (args.preset is None):
        parser.error("give a model (config.json or package.module:function) or --preset NAME")
    if args.preset:
        from autosp.profiling.graph import preset_config

        try:
            args.model = preset_config(args.preset)
        except Exception as err:  # noqa: BLE001 - UsageError / ValueError with a one-line message
            print(f"error: {err}", file=sys.stderr)
            return 2
    seq_lens = tuple(int(x) for x in args.seq_lens.split(",")) if args.seq_lens else None
    try:
        profile = load_or_build(args.model, rebuild=args.rebuild, seq_lens=seq_lens, quiet=args.quiet)
    except (ValueError, OSError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    spec, where = analytic_reference(args.model, profile)
    rows = comparison(profile, analytic_profile(spec))
    e2e = end_to_end(profile, spec)
    if args.json:
        print(json.dumps({"profile": profile.to_dict(), "analytic_from": where,
                          "comparison": [dict(field=r.field, unit=r.unit, graph=r.graph, analytic=r.analytic,
                                              rel=r.rel, why=r.why) for r in rows],
                          "end_to_end": e2e}, indent=1, default=str))
        return 0
    d = dict(profile.details)
    print(f"{profile.name}: graph profile {profile.fingerprint} "
          f"({', '.join(f'{k} {v}' for k, v in profile.versions)}; traced at {d.get('seq_lens')} tokens)")
    print(f"  {profile.n_layers} layers, hidden {profile.hidden}, {profile.n_heads} heads / {profile.n_kv_heads} KV "
          f"x {profile.head_dim}, vocab {profile.vocab}, {profile.n_params:,} parameters; MLP "
          f"{'gated' if d.get('gated_mlp') else 'plain'} {d.get('ffn_hidden')}, "
          f"{'qkv bias, ' if d.get('qkv_bias') else ''}{'tied' if d.get('tied_embeddings') else 'untied'} embeddings")
    print(f"  fit residual {profile.fit_residual:.1e}; attribution checks: "
          + ", ".join(f"{k[6:]} {'ok' if v[0] == v[1] else f'{v[0]:,} vs {v[1]:,}'}"
                      for k, v in d.items() if k.startswith("check_")))
    for note in profile.notes:
        print(f"  note: {note}")
    print()
    print(format_table(rows, f"per token and layer, bf16, sp <= n_kv; analytic side: {where}"))
    print()
    print("end to end (estimate(), graph profile vs analytic profile):")
    for r in e2e:
        g, a = r["graph"], r["analytic"]
        print(f"  {r['candidate']:28s} activations {g['activations'] / 2**30:8.2f} vs {a['activations'] / 2**30:8.2f} GiB"
              f"   total {g['total'] / 2**30:8.2f} vs {a['total'] / 2**30:8.2f} GiB"
              f"   step {g['step_s']:.3f} vs {a['step_s']:.3f} s")
    return 0


__all__ = ["analytic_reference", "end_to_end", "main"]


if __name__ == "__main__":
    sys.exit(main())
