"""gpt-oss's experts in the cost model: the op's backward with the clamped SwiGLU, and the parameter counts.

    python -m studies.gpt_oss_experts          # ~1 minute on 2 cores; results/gpt_oss_experts.{txt,json}

1. **The experts op's backward per token** (compiler/experts.py, what ``autosp.compile`` runs for a MoE layer):
   its allocated backward peak per token, the expert weights' gradients left out, over the five shapes of
   ``studies.moe_costs.OP_FIT_SHAPES``, fitted to a x k x f_e + b x k x h + c x h elements, for Qwen3-MoE /
   Mixtral's experts (SiLU gate on [gate; up]) and for transformers' ``GptOssExperts`` (transposed weights,
   biases, gate/up interleaved, the clamped SwiGLU through the module's own ``_apply_gate``), side by side. The
   cost model prices the difference of the k x f_e coefficients as ``moe.CLAMPED_SWIGLU_EXTRA_PER_WIDTH``.
2. **Parameters** of the gpt-oss presets: ModelSpec's count, transformers 5.24's ``GptOssForCausalLM`` built on the
   meta device from the same widths, and the model card's (arXiv 2508.10925), total and active (the card's active
   count leaves the input embedding out).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studies.bootstrap import ensure_autosp

ensure_autosp()

RESULTS = Path(__file__).resolve().parent / "results"
PRESETS = (("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128))


def parameter_rows() -> list[dict]:
    import torch
    import transformers

    from autosp.cost_models.catalog.models import preset_info, resolve_model

    rows = []
    for name, layers, experts in PRESETS:
        spec, info = resolve_model(name), preset_info(name)
        with torch.device("meta"):
            model = transformers.GptOssForCausalLM(transformers.GptOssConfig(num_hidden_layers=layers,
                                                                             num_local_experts=experts))
        rows.append({"model": name, "spec": spec.n_params(), "transformers": sum(p.numel() for p in model.parameters()),
                     "published": info["published_params"],
                     "spec_active_less_embedding": spec.n_params(active=True) - spec.vocab * spec.hidden,
                     "published_active": info["published_active_params"]})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(RESULTS / "gpt_oss_experts"), help="OUT.json and OUT.txt")
    args = ap.parse_args(argv)
    from autosp.cost_models import moe
    from studies.moe_costs import op_backward_fit

    fits = {layout: op_backward_fit(layout) for layout in ("silu", "gpt_oss")}
    params = parameter_rows()
    silu, oss = fits["silu"]["fit"], fits["gpt_oss"]["fit"]
    lines = ["gpt-oss's experts: the experts op's backward peak per token (fp32 elements, weights' gradients left out),",
             "fitted to a x k f_e + b x k h + c x h over five shapes", "",
             f"{'experts':>24} {'k f_e':>7} {'k h':>7} {'h':>7}"]
    for layout, fit in (("Qwen3-MoE / Mixtral", silu), ("gpt-oss (clamped SwiGLU)", oss)):
        lines.append(f"{layout:>24} {fit['k_fe']:7.2f} {fit['k_h']:7.2f} {fit['h']:7.2f}")
    lines += [f"{'difference':>24} {oss['k_fe'] - silu['k_fe']:7.2f}   (priced: CLAMPED_SWIGLU_EXTRA_PER_WIDTH = "
              f"{moe.CLAMPED_SWIGLU_EXTRA_PER_WIDTH})", "",
              "parameters: ModelSpec / transformers (meta device) / model card; active: ModelSpec less the input "
              "embedding / model card", ""]
    for row in params:
        lines.append(f"{row['model']:>13}  {row['spec'] / 1e9:8.3f}B / {row['transformers'] / 1e9:8.3f}B / "
                     f"{row['published'] / 1e9:7.2f}B   (transformers - spec = {row['transformers'] - row['spec']:,}: "
                     f"the o_proj biases)   active {row['spec_active_less_embedding'] / 1e9:.3f}B / "
                     f"{row['published_active'] / 1e9:.2f}B")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    Path(f"{args.out}.txt").write_text(text)
    Path(f"{args.out}.json").write_text(json.dumps({"op_backward_fit": fits, "parameters": params}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
