"""Autocast rules for autosp's custom ops, so that each computes in the dtype its replaced ops would.

``torch.library.custom_op`` ops have no autocast rule of their own: under ``torch.autocast`` they receive their
inputs as they are, and in a compiled graph (whose runtime turns autocast off inside, having applied it while
tracing) their bodies then run in fp32. What that breaks, per op:

- the attention ops the passes put in SDPA's place: SDPA is on the lower-precision list of CPU and CUDA autocast,
  so it runs in the autocast dtype whatever mix its inputs have (Hugging Face's rotary embeddings leave q and k
  in fp32 and v in bf16); without a rule the ops receive that mix and fail ("expected scalar type Float but
  found BFloat16");
- the tiled MLP and the tiled logits + loss: the linear layers they hold are on the lower-precision list too.
  Without a rule a compiled graph computes them in fp32 (4 bytes an element where the plan priced 2 for the
  intermediates) and the MLP returns fp32 where the untiled graph returns bf16. Cross-entropy is on the fp32
  list, so the tiled loss must also upcast its logits, as autocast does for the untiled loss;
- the mixture-of-experts op: its expert linears likewise, while transformers' experts loop keeps the weighted sum
  of the experts' outputs in the hidden states' dtype, so only the expert weights are cast (the op casts its rows
  to them).

:func:`cast_under_autocast` gives an op that rule: its floating tensor arguments (or the ones named) cast to the
dtype of the active autocast region (read at call time, unlike ``torch.library.register_autocast``, which fixes
one dtype), the casts recorded by autograd, so gradients flow back in the inputs' own dtypes.
"""

from __future__ import annotations

import torch

_LIB = torch.library.Library("autosp_ops", "FRAGMENT")
DEVICE_TYPES = ("cpu", "cuda")


def _cast(value, device_type: str, dtype: torch.dtype):
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.device.type == device_type:
        return value.to(dtype)
    return value


def cast_under_autocast(op: torch._ops.OpOverload, replaced: dict[int, object] | None = None,
                        cast: tuple[int, ...] | None = None) -> None:
    """Register, on CPU and CUDA, the autocast rule of the lower-precision ops (SDPA, linear) for ``op`` (an
    ``autosp_ops`` overload): its floating tensor arguments cast to the autocast dtype; ``cast``: only the
    positional arguments at these indices (None: all). ``replaced``: positional arguments set under autocast (the
    tiled loss's ``upcast``: cross-entropy runs in fp32 there)."""
    name = op._schema.name.split("::", 1)[1]
    replaced = dict(replaced or {})
    for device_type in DEVICE_TYPES:
        key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
        excluded = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))

        def kernel(_keys, *args, _device_type=device_type, _excluded=excluded):
            dtype = torch.get_autocast_dtype(_device_type)
            args = list(args)
            for i, value in enumerate(args):
                if i in replaced:
                    args[i] = replaced[i]
                elif cast is None or i in cast:
                    args[i] = _cast(value, _device_type, dtype)
            with torch._C._ExcludeDispatchKeyGuard(_excluded):
                return op(*args)

        _LIB.impl(name, kernel, key, with_keyset=True)


__all__ = ["cast_under_autocast"]
