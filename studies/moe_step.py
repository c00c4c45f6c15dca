"""A compiled mixture-of-experts training step, measured next to the cost model's prediction.

    python -m studies.moe_step                  # about 3 minutes on 2 cores
    python -m studies.moe_step --repredict      # the same measurements against the current cost model

One world-2 gloo job (SP=2, ZeRO-1, fp32) compiles and trains transformers' Mixtral (``impl="hf-moe"`` of the
measurement harness: 2 layers, hidden 128, 8 experts of width 256, top-2, vocab 512) under each checkpointing
policy and with the experts tiled in two token pieces: autosp's experts op runs the routed experts, as
``autosp.compile`` installs it for every Hugging Face MoE model. Per rank (the worse rank): the bytes the
compiled graph saves for backward, the allocated peak of a step and the step time, each next to the cost
model's prediction with this machine's calibrated CPU profile (results/calibrated-cpux2.json) and the ratio
predicted / measured. The table layout and its "vs none" columns are knob_costs.py's.

Writes studies/results/moe_step.{json,txt}.
"""

from __future__ import annotations

import argparse
import sys

from autosp.contract.specs import ModelSpec

MODEL = ModelSpec(name="study-mixtral-2l", n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, head_dim=32,
                  ffn_hidden=256, vocab=512, n_experts=8, experts_per_token=2, expert_ffn_hidden=256)
"""Expert width 256 and vocabulary 512 differ, so the harness's rule that a tensor whose last dimension is the
vocabulary belongs to the logits never takes an expert's tensor for one."""

SETTINGS = [  # (label, knob overrides)
    ("ckpt none", {}),
    ("ckpt selective", dict(checkpointing="selective")),
    ("ckpt sequence", dict(checkpointing="sequence")),
    ("ckpt full", dict(checkpointing="full")),
    ("selective + experts in 2 pieces", dict(checkpointing="selective", mlp_chunks=2)),
]


def configs(seq: int, steps: int):
    from studies.measure import RunConfig

    return [RunConfig(model=MODEL, seq_len=seq, sp=2, zero_stage=1, warmup=2, steps=steps, impl="hf-moe",
                      label=label, **knobs) for label, knobs in SETTINGS]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.moe_step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=2048, help="tokens per sequence (default 2048)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per setting (default 4)")
    parser.add_argument("--repredict", action="store_true",
                        help="measure nothing: re-predict the rows of results/moe_step.json with the current "
                             "cost model")
    args = parser.parse_args(argv)

    from studies.knob_costs import LEGEND, render
    from studies.measure.compare import calibrated_cpu, save_study, study_rows

    hw = calibrated_cpu(2)
    args.seq, cfgs, rows = study_rows("moe_step", lambda: configs(args.seq, args.steps), hw, args.repredict)
    text = (f"MoE step: {MODEL.name} (transformers Mixtral, {MODEL.n_layers} layers, hidden {MODEL.hidden}, "
            f"{MODEL.n_experts} experts of width {MODEL.expert_ffn_hidden}, top-{MODEL.experts_per_token}), "
            f"{args.seq} tokens, SP=2, ZeRO-1, fp32, {cfgs[0].backend}; predictions with {hw.name}\n{LEGEND}\n\n"
            f"{render(rows)}\n")
    return save_study("moe_step", text, hw, args.seq, MODEL, rows)


if __name__ == "__main__":
    sys.exit(main())
