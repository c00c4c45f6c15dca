"""The router's auxiliary load-balancing loss of Hugging Face MoE models, over the whole batch.

With ``output_router_logits`` a Qwen3-MoE / Mixtral / OLMoE forward adds ``coef * load_balancing_loss_func(
router_logits, E, k, attention_mask)`` to its loss: E * sum_e f_e * P_e, where f_e is the fraction of (token,
choice) assignments going to expert e and P_e the mean router probability of e, both over every token of the
batch and every layer. A product of two means is not a sum over tokens: each rank's own value on its shard is
not one process's, nor is their average. While an autosp engine runs, the model module's
``load_balancing_loss_func`` is therefore replaced by :func:`global_load_balancing_loss`, which sums the three
statistics (assignments per expert, probability per expert, token count) on each rank over its real tokens
only, adds them over every rank (:func:`all_reduce_stats`) and forms the loss from the totals: the value one
process gets on the full batch. A token is real unless the runtime appended it (S padded to a multiple of the
SP degree) or the batch's ``attention_mask`` is 0 there (a right-padded batch: Hugging Face's function leaves
those tokens out of all three statistics when given the mask, as the models pass it): :func:`real_tokens`, from
the mask the runtime publishes per call. Outside an engine's call the model's own function runs (a reference
model in the same process).

Gradient: every rank adds the same ``coef * aux`` to its loss and DeepSpeed averages the W ranks' gradients.
The sum's backward is the sum of the W ranks' (identical) output gradients, so rank r's router gradient is W x
d aux / d (its statistics) x d (its statistics) / d theta, and the average over W is the full gradient.
"""

from __future__ import annotations

import functools
import sys

import torch
import torch.distributed as dist

from autosp.compiler.ops import _group, _needs_fp32_transport
from autosp.errors import AutospError

_ACTIVE: list = []       # the SPContext of the engine call in progress (at most one)
_REAL: dict = {}         # engine key -> this call's real-token mask over the rank's tokens, row by row
_PATCHED: dict = {}      # module name -> the model's own load_balancing_loss_func


def publish_real_tokens(key: str, real: torch.Tensor) -> None:
    """This call's real tokens (:attr:`autosp.compiler.inputs.LocalBatch.real`: [rows, local positions], 1.0 where
    real), flattened in the order of the router's rows."""
    _REAL[key] = real.reshape(-1).float()


@torch.library.custom_op("autosp_ops::real_tokens", mutates_args=())
def real_tokens(like: torch.Tensor, key: str) -> torch.Tensor:
    """1.0 for each row of ``like`` ([rows, ...], rows = micro-batch x local positions) that is a real token."""
    mask = _REAL[key]
    if mask.numel() != like.shape[0]:
        raise AutospError(f"the router's logits have {like.shape[0]} rows but this rank holds {mask.numel()} tokens "
                          f"(a bug: please report it)")
    return mask.to(like.device)


@real_tokens.register_fake
def _real_tokens_fake(like, key):
    return like.new_empty((like.shape[0],), dtype=torch.float32)


@torch.library.custom_op("autosp_ops::all_reduce_stats", mutates_args=())
def all_reduce_stats(x: torch.Tensor, group: str) -> torch.Tensor:
    """A differentiable sum over ``group`` (its gradient is the sum of the output gradients)."""
    out = x.float().clone() if _needs_fp32_transport(x) else x.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=_group(group))
    return out.to(x.dtype)


@all_reduce_stats.register_fake
def _all_reduce_stats_fake(x, group):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.group = inputs[1]


def _backward(ctx, grad):
    return all_reduce_stats(grad.contiguous(), ctx.group), None


all_reduce_stats.register_autograd(_backward, setup_context=_setup)


def global_load_balancing_loss(sp_ctx, gate_logits, num_experts=None, top_k=2, attention_mask=None):
    """Hugging Face's ``load_balancing_loss_func`` over every rank's real tokens (see the module doc)."""
    if gate_logits is None or not isinstance(gate_logits, tuple):
        return 0
    device = gate_logits[0].device
    counts = torch.zeros(num_experts, dtype=torch.float32, device=device)
    probs = torch.zeros(num_experts, dtype=torch.float32, device=device)
    rows = torch.zeros(1, dtype=torch.float32, device=device)
    for layer_gate in gate_logits:
        weights = torch.nn.functional.softmax(layer_gate.to(device), dim=-1)
        _, selected = torch.topk(weights, top_k, dim=-1)
        real = real_tokens(weights.detach(), sp_ctx.router_key)
        counts = counts + torch.zeros_like(counts).scatter_add(0, selected.reshape(-1), real.repeat_interleave(top_k))
        probs = probs + (weights.float() * real.unsqueeze(-1)).sum(dim=0)
        rows = rows + real.sum()
    total = all_reduce_stats(torch.cat([counts, probs, rows]), sp_ctx.world_group)
    tokens_per_expert = total[:num_experts] / total[-1]
    prob_per_expert = total[num_experts:2 * num_experts] / total[-1]
    return torch.sum(tokens_per_expert * prob_per_expert.unsqueeze(0)) * num_experts


def patch_router_loss(model: torch.nn.Module) -> bool:
    """Make the model module's ``load_balancing_loss_func`` the global one during engine calls."""
    module = sys.modules.get(type(model).__module__)
    original = getattr(module, "load_balancing_loss_func", None)
    if original is None:
        return False
    if module.__name__ not in _PATCHED:
        _PATCHED[module.__name__] = original

        @functools.wraps(original)
        def load_balancing_loss_func(*args, **kwargs):
            if _ACTIVE:
                return global_load_balancing_loss(_ACTIVE[0], *args, **kwargs)
            return original(*args, **kwargs)

        module.load_balancing_loss_func = load_balancing_loss_func
    return True


__all__ = ["all_reduce_stats", "global_load_balancing_loss", "patch_router_loss", "publish_real_tokens",
           "real_tokens"]
