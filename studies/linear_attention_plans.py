"""What the linear-attention layers of Qwen3-Next and Qwen3.5 buy in a plan: each preset planned as it is and as
the same model with softmax attention on every layer, on h100x8.

    python -m studies.linear_attention_plans      # ~1 minute (the planner only, no torch); results/linear_attention_plans.txt

Rows per model: the throughput plan at 128k and at 1M tokens (step time, tokens/s, SP degree, memory) and the
``--objective max-ctx`` plan (the longest trainable context). "all softmax" is the preset with its Gated DeltaNet
layers replaced by the model's own gated softmax attention (``linear_layers`` empty: the parameter count moves by the
difference of the two mixers' weights). The same comparison from the command line: a copy of the model's
config.json with ``"full_attention_interval": 1`` (every layer full attention) planned beside the original.

The softmax model may use a ring and sequence chunks, which the compiler refuses for the hybrid (its recurrent state
would have to cross them): the planner searches each model's own space.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from studies.bootstrap import ensure_autosp

ensure_autosp()

RESULTS = Path(__file__).resolve().parent / "results" / "linear_attention_plans.txt"
MODELS = ("qwen3-next-80b-a3b", "qwen3.5-35b-a3b")
HW = "h100x8"
GIB = 2 ** 30


def all_softmax(spec):
    """``spec`` with every layer softmax attention."""
    return replace(spec, name=f"{spec.name} (all softmax)", linear_layers=(), linear_num_key_heads=0,
                   linear_num_value_heads=0, linear_key_head_dim=0, linear_value_head_dim=0, linear_conv_kernel_dim=0)


def row(label: str, plan) -> str:
    c, est = plan.candidate, plan.estimate
    layout = f"sp {c.sp} ring {c.ring} chunks {c.sequence_chunks} {c.checkpointing}"
    return (f"  {label:<26}{plan.workload.seq_len:>12,}{est.time.step:>10.2f}{est.tokens_per_second:>11,.0f}"
            f"{est.memory.total / GIB:>9.1f}   {layout}")


def main() -> int:
    from autosp.cost_models.catalog.models import resolve_model
    from autosp.planner.api import plan_for
    from autosp.planner.request import PlanRequest

    lines = [f"Hybrid vs all-softmax plans on {HW} (python -m studies.linear_attention_plans)",
             f"  {'model / objective':<26}{'tokens':>12}{'step s':>10}{'tokens/s':>11}{'GiB/GPU':>9}   layout"]
    for name in MODELS:
        hybrid = resolve_model(name)
        for label, spec in (("hybrid", hybrid), ("all softmax", all_softmax(hybrid))):
            lines.append(f"{name} {label} ({spec.n_params() / 1e9:.2f}B parameters, "
                         f"{len(spec.linear_layers)} of {spec.n_layers} layers linear attention)")
            for ctx in ("128k", "1M"):
                lines.append(row(f"throughput at {ctx}", plan_for(PlanRequest(model=spec, ctx=ctx, hw=HW),
                                                                  cache=False)))
            lines.append(row("max-ctx", plan_for(PlanRequest(model=spec, hw=HW, objective="max-ctx"), cache=False)))
    text = "\n".join(lines)
    print(text)
    RESULTS.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
