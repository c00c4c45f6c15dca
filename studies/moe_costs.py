"""The mixture-of-experts cost terms, measured on CPU next to the cost model's prediction (issue 22's evidence).

    python -m studies.moe_costs              # ~1 minute on 2 cores (4 gloo processes)

Rows per configuration, each "predicted / measured":

1. **saved for backward** (the router's tensors of cost_models/moe.py ``moe_layer_kept`` plus the analytic
   profile's MLP terms outside the routed experts): the bytes a Hugging Face ``Qwen3MoeSparseMoeBlock`` and
   ``MixtralSparseMoeBlock`` (tiny configs, fp32) save for their backward with their experts running the
   compiler's experts op (compiler/experts.py, what ``autosp.compile`` installs), counted with
   ``torch.autograd.graph.saved_tensors_hooks`` and de-duplicated by storage, leaving out parameters and the block
   input (the layer's kept set counts it already). The block's own eager experts are measured beside it: they
   keep their inner tensors, which the op rebuilds in its backward instead;
2. **backward peak** (``memory.mlp_phase_bytes`` under ``none``, with ``moe.transient_bytes_per_token`` and
   ``moe.expert_grad_bytes``): the most bytes the op-backed block's backward holds at once (allocation events),
   at a few tokens (the expert weight gradients dominate) and at many (the tokens do), for the tiny config and for
   one with wider experts (h 128, f_e 512), whose weights outweigh the block's small fixed tensors;
3. **dispatch all-to-all volume** (``moe.dispatch_bytes``): 4 gloo processes each route their own tokens with the
   block's real router (top-k of the softmax), sort the token copies by the rank owning their expert (ep = 2 and
   4, experts split evenly) and exchange them with ``all_to_all_single``; measured: the bytes each rank sends to
   other ranks (mean and busiest), predicted: s x k x h x e x (ep-1)/ep, and at the busiest rank the capacity
   factor margin;
4. **expert states** (``moe.expert_state_bytes``): each rank keeps the E/ep experts of its EP group and, for ZeRO
   stage 1 / 2 over the world/ep ranks holding the same experts, the AdamW states (and gradients) of its 1/(world/ep)
   partition of them; measured: the bytes of the tensors it really holds after one AdamW step.

Then, once: **the experts op's backward per token**, the op alone (weights negligible) over five shapes, its
allocated backward peak per token fitted by least squares to a x k x f_e + b x k x h + c x h elements, next to the
cost model's coefficients (the profile's live set and input gradient of the routed width, 3 + 1;
``moe.OP_PERMUTATION_COPIES``; the MLP phase's 2 h).

The dispatch of row 3 is plain torch.distributed, not the op's exchanges; the compiled EP step's all-to-all timing
needs a GPU. Writes studies/results/moe_costs.{txt,json}.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
WORLD = 4
TOKENS = 512          # tokens per rank
SEED = 0

TINY_QWEN3_MOE = dict(model_type="qwen3_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                      num_experts=8, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=97, norm_topk_prob=True)
TINY_MIXTRAL = dict(model_type="mixtral", hidden_size=64, intermediate_size=32, num_local_experts=8,
                    num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    vocab_size=97)


def _spec(config: dict):
    import tempfile

    from autosp.cost_models.catalog.models import model_from_hf_config

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        return model_from_hf_config(path)


def _block(config: dict, op: bool = False):
    """The tiny MoE block, its experts running the compiler's experts op when ``op``."""
    import torch
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(**config)
    torch.manual_seed(SEED)
    if config["model_type"] == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as Block
    else:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as Block
    block = Block(cfg).float()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.5)
    if op:
        from autosp.compiler.experts import prepare_experts

        prepare_experts(block, 1)
    return block


def saved_bytes_per_token(config: dict, op: bool = True) -> tuple[float, dict]:
    """Bytes per token the MoE block saves for backward (measured), and what they are."""
    import torch

    block = _block(config, op)
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    x = torch.randn(1, TOKENS, config["hidden_size"], requires_grad=True)
    seen, kinds = {}, {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr != x.untyped_storage().data_ptr() and ptr not in seen:
            seen[ptr] = t.untyped_storage().nbytes()
            key = f"{str(t.dtype).replace('torch.', '')}"
            kinds[key] = kinds.get(key, 0) + t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(x)
    out.sum().backward()
    return sum(seen.values()) / TOKENS, {k: v / TOKENS for k, v in kinds.items()}


def predicted_saved_bytes(spec) -> tuple[float, float]:
    """(analytic MLP kept set outside the routed experts, router) per token of one MoE layer, fp32, policy none."""
    from autosp.cost_models import moe
    from autosp.cost_models.profile import analytic_profile
    from autosp.contract.specs import Candidate

    prof = analytic_profile(spec)
    mlp = prof.kept_mlp[0].other * 4                      # 4 x the shared width (none here), fp32
    extra = moe.moe_layer_kept(moe.layout(spec, Candidate(sp=1)), 4, "none")
    return mlp, extra


def _wide(config: dict) -> dict:
    """``config`` with h = 128 and experts 512 wide: the expert weights outweigh the block's small fixed tensors."""
    key = "moe_intermediate_size" if config["model_type"] == "qwen3_moe" else "intermediate_size"
    return {**config, "hidden_size": 128, key: 512}


def backward_peak(config: dict, tokens: int) -> int:
    """The most bytes the op-backed block's backward holds at once over ``tokens`` tokens (fp32, CPU)."""
    import torch

    from studies.measure.memory import allocated_peak

    block = _block(config, op=True)
    x = torch.randn(1, tokens, config["hidden_size"], requires_grad=True)
    out = block(x)
    out = out[0] if isinstance(out, tuple) else out
    return allocated_peak(lambda: out.backward(torch.ones_like(out)))


def predicted_backward_peak(spec, tokens: int) -> float:
    """The cost model's MLP backward phase of one MoE layer over ``tokens`` tokens, fp32, policy none."""
    from autosp.cost_models import memory, moe
    from autosp.cost_models.shapes import Shapes
    from autosp.contract.specs import Candidate, Workload

    sh = Shapes(spec, Workload(tokens, dtype="fp32"), Candidate(sp=1, checkpointing="none"))
    return memory.mlp_phase_bytes(sh, "none", 1, moe.transient_bytes_per_token(sh.moe, sh.e, "none"))


OP_FIT_SHAPES = ((128, 512, 2), (128, 1024, 2), (256, 512, 2), (128, 512, 4), (64, 256, 1))  # (h, f_e, k), 4 experts
OP_FIT_TOKENS = 4096


def op_backward_fit(layout: str = "silu") -> dict:
    """The experts op's allocated backward peak per token (weights left out) over :data:`OP_FIT_SHAPES`, fitted to
    a x k x f_e + b x k x h + c x h elements. ``layout``: "silu" (Qwen3-MoE / Mixtral experts: [gate; up], no bias)
    or "gpt_oss" (transformers' GptOssExperts: transposed weights, biases, its own clamped-SwiGLU gate)."""
    import numpy as np
    import torch

    from autosp.compiler.experts import moe_experts
    from autosp.cost_models import moe
    from studies.measure.memory import allocated_peak

    gen = torch.Generator().manual_seed(SEED)
    rows, per_token = [], []
    for h, fe, k in OP_FIT_SHAPES:
        experts = 4
        hidden = torch.randn(OP_FIT_TOKENS, h, generator=gen, requires_grad=True)
        index = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(OP_FIT_TOKENS)])
        weights = torch.rand(OP_FIT_TOKENS, k, generator=gen, requires_grad=True)
        if layout == "gpt_oss":
            tensors, act, extra = _gpt_oss_experts(h, fe, experts, gen)
        else:
            tensors = [torch.randn(experts, 2 * fe, h, generator=gen, requires_grad=True),
                       torch.randn(experts, h, fe, generator=gen, requires_grad=True)]
            act, extra = "silu", {}
        out = moe_experts(hidden, index, weights, *tensors, "", act, 1, **extra)
        peak = allocated_peak(lambda: out.backward(torch.ones_like(out)))
        shape = moe.MoeShape(E=experts, k=k, h=h, fe=fe, m=3, moe_layers=1, L=1, ep=1, world=1,
                             expert_params=sum(t.numel() for t in (*tensors, *extra.values()) if torch.is_tensor(t)))
        weight_grads = moe.expert_grad_bytes(shape, 4, 1)[1]  # what the op holds at its end, priced apart
        rows.append((k * fe, k * h, h))
        per_token.append((peak - weight_grads) / OP_FIT_TOKENS / 4)
    coef = np.linalg.lstsq(np.array(rows, float), np.array(per_token), rcond=None)[0]
    return {"shapes": [dict(h=h, f_e=fe, k=k, elements_per_token=round(p, 1))
                       for (h, fe, k), p in zip(OP_FIT_SHAPES, per_token)],
            "fit": {"k_fe": float(coef[0]), "k_h": float(coef[1]), "h": float(coef[2])}}


def _gpt_oss_experts(h: int, fe: int, experts: int, gen):
    """(gate_up, down), the op's gate key and its keywords for a transformers GptOssExperts of this shape (small
    random weights: the clamp is reached by some rows, as in a trained model)."""
    import torch
    import transformers
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    from autosp.compiler.experts import gate_key

    module = GptOssExperts(transformers.GptOssConfig(hidden_size=h, intermediate_size=fe, num_local_experts=experts))
    for p in module.parameters():
        p.data = torch.randn(p.shape, generator=gen) * 0.05
    extra = {"gate_up_bias": module.gate_up_proj_bias, "down_bias": module.down_proj_bias, "transposed": True}
    return [module.gate_up_proj, module.down_proj], gate_key(module), extra


# --- the gloo part --------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, config: dict, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    block = _block(config)                               # the same router and experts on every rank (same seed)
    torch.manual_seed(SEED + 1 + rank)                   # each rank its own tokens
    x = torch.randn(TOKENS, config["hidden_size"])
    h, E = config["hidden_size"], block.experts.num_experts if hasattr(block.experts, "num_experts") else \
        config["num_local_experts"]
    k = config["num_experts_per_tok"]
    with torch.no_grad():
        logits = torch.nn.functional.linear(x, block.gate.weight)
        _, experts = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float), k, dim=-1)
    rows = {"a2a": [], "states": []}
    for ep in (2, 4):
        owner = (experts // (E // ep)).flatten()         # EP rank (inside this rank's EP group) of each token copy
        group_base = rank // ep * ep
        copies = x.repeat_interleave(k, dim=0)
        order = torch.argsort(owner, stable=True)
        send_counts = torch.bincount(owner, minlength=ep)
        splits = [0] * WORLD
        for j in range(ep):
            splits[group_base + j] = int(send_counts[j])
        recv = torch.zeros(WORLD, dtype=torch.long)
        dist.all_to_all_single(recv, torch.tensor(splits, dtype=torch.long), [1] * WORLD, [1] * WORLD)
        received = torch.empty(int(recv.sum()), h)
        dist.all_to_all_single(received, copies[order].contiguous(), recv.tolist(), splits)
        sent_off = sum(splits[j] for j in range(WORLD) if j != rank) * h * 4
        got_off = (int(recv.sum()) - int(recv[rank])) * h * 4
        rows["a2a"].append({"ep": ep, "rank": rank, "sent_bytes": sent_off, "received_bytes": got_off,
                            "received_copies": int(recv.sum())})
    # expert states: this rank's E/ep experts (of the 2 MoE layers), ZeRO over the world/ep ranks holding them
    experts_params = [p for n, p in block.named_parameters() if "experts" in n]
    per_layer = sum(p.numel() for p in experts_params)
    layers = config["num_hidden_layers"]
    for ep in (1, 2, 4):
        nd = WORLD // ep
        local = per_layer * layers // ep                 # the rank's experts, all MoE layers
        shard = local // nd                              # its ZeRO partition of them
        for stage in (1, 2, 3):
            weights = torch.zeros(shard if stage == 3 else local)
            partition = torch.zeros(shard, requires_grad=True)
            partition.grad = torch.zeros(shard)
            grads = torch.zeros(shard if stage >= 2 else local)   # stage 1 reduces full gradients
            optim = torch.optim.AdamW([partition], lr=1e-3)
            optim.step()
            state = sum(t.numel() * t.element_size() for s in optim.state.values() for t in s.values()
                        if torch.is_tensor(t) and t.dim() > 0)
            # fp32 training: weights are the master copy (Adam m and v are the optimizer states)
            rows["states"].append({"ep": ep, "stage": stage, "rank": rank,
                                   "weights": weights.numel() * 4, "grads": grads.numel() * 4, "optim": state,
                                   "expert_params": per_layer * layers})
    with open(f"{out}.{rank}.json", "w") as f:
        json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


def distributed(config: dict, tmp: str) -> dict:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(_free_port(), config, tmp), nprocs=WORLD, join=True)
    rows = {"a2a": [], "states": []}
    for rank in range(WORLD):
        with open(f"{tmp}.{rank}.json") as f:
            data = json.load(f)
        for key in rows:
            rows[key] += data[key]
    return rows


def main() -> int:
    import tempfile

    from autosp.cost_models import moe
    from autosp.contract.specs import Candidate

    report, lines = {}, ["MoE cost terms: predicted by the cost model vs measured on CPU (fp32, transformers "
                         "blocks with autosp's experts op, gloo world 4); ratio = predicted / measured", ""]
    for name, config in (("qwen3_moe", TINY_QWEN3_MOE), ("mixtral", TINY_MIXTRAL)):
        spec = _spec(config)
        measured, kinds = saved_bytes_per_token(config)
        eager, _ = saved_bytes_per_token(config, op=False)
        mlp, extra = predicted_saved_bytes(spec)
        lines.append(f"{name}: h={spec.hidden} E={spec.n_experts} k={spec.experts_per_token} "
                     f"f_e={spec.expert_ffn_hidden}, {TOKENS} tokens per rank")
        lines.append(f"  saved for backward per token (MoE block, experts op)  predicted {mlp + extra:6.0f} B "
                     f"(shared MLP {mlp:.0f} + router {extra:.0f})  measured {measured:6.0f} B  "
                     f"ratio {(mlp + extra) / measured:.3f}   by dtype "
                     f"{', '.join(f'{k} {v:.0f}' for k, v in kinds.items())};"
                     f"  the block's eager experts keep {eager:.0f} B")
        peaks = []
        for label, variant in (("", config), (" (h 128, f_e 512)", _wide(config))):
            variant_spec = _spec(variant)
            for tokens in (64, TOKENS * 8):
                peak, pred = backward_peak(variant, tokens), predicted_backward_peak(variant_spec, tokens)
                lines.append(f"  backward peak{label:17s}, {tokens:5d} tokens: predicted {pred:10.0f} B  measured "
                             f"{peak:10.0f} B  ratio {pred / peak:.3f}")
                peaks.append({"config": label.strip() or "tiny", "tokens": tokens, "predicted": pred, "measured": peak})
        with tempfile.TemporaryDirectory() as tmp:
            rows = distributed(config, os.path.join(tmp, "rank"))
        entry = {"saved_per_token": {"predicted": mlp + extra, "measured": measured, "by_dtype": kinds,
                                     "eager_experts_measured": eager},
                 "backward_peak": peaks, "a2a": [], "states": []}
        for ep in (2, 4):
            mine = [r for r in rows["a2a"] if r["ep"] == ep]
            ms = moe.layout(spec, Candidate(sp=WORLD, ep=ep))
            mean_pred = moe.dispatch_bytes(ms, TOKENS, 4) / ms.cf
            busiest_pred = moe.dispatch_bytes(ms, TOKENS, 4)
            mean = sum(r["sent_bytes"] for r in mine) / len(mine)
            busiest = max(r["received_bytes"] for r in mine)
            lines.append(f"  dispatch all-to-all, ep={ep}: bytes sent off-rank per rank  predicted mean "
                         f"{mean_pred:9.0f}  measured mean {mean:9.0f}  ratio {mean_pred / mean:.3f};  busiest rank "
                         f"receives {busiest:9.0f} (predicted with CF {moe.CAPACITY_FACTOR}: {busiest_pred:9.0f}, "
                         f"ratio {busiest_pred / busiest:.3f})")
            entry["a2a"].append({"ep": ep, "predicted_mean": mean_pred, "measured_mean": mean,
                                 "predicted_busiest": busiest_pred, "measured_busiest": busiest})
        for ep in (1, 2, 4):
            for stage in (1, 2, 3):
                mine = [r for r in rows["states"] if r["ep"] == ep and r["stage"] == stage]
                measured_total = max(r["weights"] + r["grads"] + r["optim"] for r in mine)
                ms = moe.layout(spec, Candidate(sp=WORLD, ep=ep))
                pred = sum(moe.expert_state_bytes(ms, stage, "fp32", False, False))
                lines.append(f"  expert states ep={ep} ZeRO-{stage}: predicted {pred:9.0f} B  measured {measured_total:9.0f} B"
                             f"  ratio {pred / measured_total:.3f}")
                entry["states"].append({"ep": ep, "stage": stage, "predicted": pred, "measured": measured_total})
        report[name] = entry
        lines.append("")
    fit = op_backward_fit()
    report["op_backward_fit"] = fit
    c = fit["fit"]
    lines.append(f"experts op backward, {OP_FIT_TOKENS} tokens, {len(OP_FIT_SHAPES)} shapes: elements per token "
                 f"= {c['k_fe']:.2f} k f_e + {c['k_h']:.2f} k h + {c['h']:.2f} h (least squares); "
                 f"the cost model prices "
                 f"{moe.EXPERT_LIVE_PER_WIDTH} + 1 k f_e + {moe.OP_PERMUTATION_COPIES} k h + 2 h")
    text = "\n".join(lines)
    print(text)
    from autosp.files import write_text

    RESULTS.mkdir(exist_ok=True)
    write_text(RESULTS / "moe_costs.txt", text + "\n")
    write_text(RESULTS / "moe_costs.json", json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
