"""ZeRO-3 and the tiled loss: keep the LM head gathered so it is traced inline with the loss.

Under ZeRO-3 DeepSpeed gathers a module's parameters in hooks around its call; autosp keeps those hooks
eager (compiler/api.py), so every module with parameters is a graph of its own. For the LM head that
is fatal to loss tiling: its graph would return the full s x vocab logits before the loss graph could
tile them. With ``loss_chunks > 1`` the engine therefore makes the LM head's weight (and bias) a
*persistent* ZeRO-3 parameter -- gathered on every rank for the whole run, as DeepSpeed does by itself
for parameters under ``stage3_param_persistence_threshold`` -- and removes DeepSpeed's hooks from the
LM head module, so Dynamo traces ``F.linear(hidden, W)`` inline in the graph that computes the loss
and the tiling pass fuses them.

Why this stays exact and consistent with DeepSpeed:

- a persistent parameter is never released by the coordinator (it skips ``ds_persist`` parameters);
  DeepSpeed re-gathers every persistent parameter after each optimizer step (``_post_step``), so the
  inline weight is always the updated one;
- gradients still flow through the parameter's own gradient hook (ZeRO-3 registers one per parameter,
  not per module): the full gradient is reduce-scattered into this rank's partition as for any other
  parameter;
- tied embeddings: the input embedding shares the head's weight, and DeepSpeed would release it after
  the embedding's forward (measured: the inline LM head then saw an empty partition), so the embedding
  is unhooked too and reads the same resident weight; autograd adds the embedding's and the tiled loss's
  gradients before the parameter's hook reduces their sum. A module that shares the weight and holds
  other parameters is refused (its hooks must stay);
- a head DeepSpeed already made persistent (under ``stage3_param_persistence_threshold``, as a tiny
  model's is) is unhooked and gathered: DeepSpeed would gather it at its module's first forward only.

Cost: the LM head's weight is resident on every rank (vocab x hidden x dtype bytes, 1 GiB for
Llama-3.1-8B in bf16) instead of being gathered only around its use; with tied embeddings it is the one
copy of the shared matrix (the embedding gathers nothing more). The cost model charges it
(cost_models/memory.py ``zero3_gathered_params``).
"""

from __future__ import annotations

import torch


def lm_head_module(model: torch.nn.Module) -> torch.nn.Module | None:
    """The output projection: Hugging Face's ``get_output_embeddings()``, else a child named ``lm_head``."""
    getter = getattr(model, "get_output_embeddings", None)
    if callable(getter):
        try:
            head = getter()
        except (NotImplementedError, AttributeError):
            head = None
        if isinstance(head, torch.nn.Module):
            return head
    head = getattr(model, "lm_head", None)
    return head if isinstance(head, torch.nn.Module) else None


def persist_lm_head(ds_engine) -> int:
    """Make the LM head's parameters persistent and unhook it (see the module doc); returns the number of
    the head's parameter elements now resident, those DeepSpeed kept resident already included (0 when
    the model has no recognisable LM head)."""
    module = ds_engine.module
    head = lm_head_module(module)
    if head is None:
        return 0
    head_params = {id(p) for p in head.parameters()}
    # Tied embeddings: the input embedding shares the head's weight, and DeepSpeed releases a module's
    # parameters after its forward (on the first step without looking at ds_persist), so the embedding's
    # hooks would free the weight the inline head reads. The embedding is unhooked too: the weight is
    # persistent, nothing needs to fetch it.
    tied = [m for m in module.modules() if m is not head and any(id(p) in head_params for p in m.parameters(recurse=False))]
    for owner in (head, *tied):
        if any(id(p) not in head_params for p in owner.parameters(recurse=False)):
            from autosp.errors import UsageError

            raise UsageError(f"loss_chunks > 1 under ZeRO-3: {type(owner).__name__} shares the LM head's weight and "
                             f"holds other parameters; re-plan with loss_chunks=1 or zero_stage<=2")
        for hooks in (owner._forward_pre_hooks, owner._forward_hooks):
            for key, hook in list(hooks.items()):
                if getattr(hook, "__module__", "").startswith("deepspeed."):
                    del hooks[key]
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    persistent = ds_engine.optimizer.persistent_parameters  # the list _post_step re-gathers
    for p in head.parameters(recurse=True):
        if not getattr(p, "ds_persist", False):
            p.ds_persist = True
            persistent.append(p)
    # gathered now: a parameter DeepSpeed made persistent itself waits for its module's first fetch, which the
    # unhooked head (and tied embedding) no longer makes
    absent = [p for p in head.parameters(recurse=True) if p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
    if absent:
        absent[0].all_gather(absent)
    return sum(p.ds_numel for p in head.parameters(recurse=True))


def _first_input_requires_grad(module, args):
    """Forward pre-hook of a ZeRO-3 leaf module (see :func:`set_leaf_modules`): when it has trainable
    parameters but none of its positional tensor inputs requires grad, its first floating-point input is
    replaced by a detached copy that does (the values are the same; only the autograd graph changes)."""
    if not torch.is_grad_enabled() or any(torch.is_tensor(a) and a.requires_grad for a in args):
        return None
    if not any(p.requires_grad for p in module.parameters()):
        return None
    for i, a in enumerate(args):
        if torch.is_tensor(a) and a.is_floating_point():
            return (*args[:i], a.detach().requires_grad_(), *args[i + 1:])
    return None


def set_leaf_modules(model: torch.nn.Module, names: list[str]) -> None:
    """Make the named modules (the decoder layers) ZeRO-3 leaf modules: DeepSpeed gathers each one's
    parameters as one unit, and autosp traces it as one graph.

    DeepSpeed reduces a leaf module's gradients in a *full backward hook* on the module. PyTorch fires such a
    hook once the gradients of the module's inputs are computed, or, when no input requires grad, as soon as
    the gradients of its *outputs* are -- before the module's own backward ran. That is the first decoder
    layer of a PEFT (LoRA) model: its input comes from frozen embeddings. DeepSpeed then reduces the adapters'
    gradients before they exist (it fills them with zeros, partitions them and empties ``param.grad``), and
    the layer's backward afterwards fails adding the real gradient to the emptied one ("The size of tensor
    a (0) must match ..."). A pre-hook, ahead of DeepSpeed's, makes such a layer's input require grad, so
    the reduction waits for the layer's backward as in every other layer. Cost: the first layer's backward
    also computes the gradient of its input (discarded)."""
    from deepspeed.utils import set_z3_leaf_modules_by_name

    if not names:
        return
    set_z3_leaf_modules_by_name(model, names)
    hook = torch._dynamo.disable(_first_input_requires_grad, recursive=True)  # eager, as DeepSpeed's hooks
    for name in names:
        module = model.get_submodule(name)
        if not getattr(module, "_autosp_input_grad_hook", False):
            module.register_forward_pre_hook(hook, prepend=True)
            module._autosp_input_grad_hook = True


__all__ = ["lm_head_module", "persist_lm_head", "set_leaf_modules"]
